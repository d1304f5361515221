//! Interop with Redisson's own RLock scripts (from ../shared/seeds/001_9c83fae6cf63878e.txt; the
//! lock script is `lock_testkit::redisson_lock`, shared with the cluster test): a LOCK.* client and a
//! Redisson client share one lock.

use lock_testkit::*;

const UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; \
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); \
if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; \
else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end; return nil;";

fn redisson_unlock(con: &mut Connection, key: &str, owner: &str) -> Option<i64> {
    redis::Script::new(UNLOCK)
        .key(key)
        .key(format!("redisson_lock__channel:{{{key}}}"))
        .arg("0")
        .arg(30_000)
        .arg(owner)
        .invoke(con)
        .unwrap()
}

#[test]
fn a_lock_taken_by_redisson_excludes_lock_acquire_and_vice_versa() {
    let server = Server::start();
    let mut con = server.connect();
    assert_eq!(redisson_lock(&mut con, "k", "uuid-1:7", 30_000), None);
    assert_eq!(acquire(&mut con, "k", "svc-b", 5_000), None);
    assert_eq!(redisson_unlock(&mut con, "k", "uuid-1:7"), Some(1));

    acquire(&mut con, "k", "svc-b", 5_000).unwrap();
    let pttl = redisson_lock(&mut con, "k", "uuid-1:7", 30_000);
    assert!(
        matches!(pttl, Some(ms) if ms > 0 && ms <= 5_000),
        "Redisson sees it held: {pttl:?}"
    );
}

#[test]
fn redissons_unlock_releases_a_lock_that_lock_acquire_reentered() {
    let server = Server::start();
    let mut con = server.connect();
    acquire(&mut con, "k", "uuid-1:7", 5_000).unwrap();
    acquire(&mut con, "k", "uuid-1:7", 5_000).unwrap();
    assert_eq!(
        redisson_lock(&mut con, "k", "uuid-1:7", 30_000),
        None,
        "Redisson re-enters too"
    );
    assert_eq!(redisson_unlock(&mut con, "k", "uuid-1:7"), Some(0));
    assert_eq!(redisson_unlock(&mut con, "k", "uuid-1:7"), Some(0));
    assert_eq!(redisson_unlock(&mut con, "k", "uuid-1:7"), Some(1));
    let exists: bool = con.exists("k").unwrap();
    assert!(!exists, "the fence field goes with the key");
}

#[test]
fn lock_release_releases_a_lock_taken_by_redissons_script() {
    let server = Server::start();
    let mut con = server.connect();
    redisson_lock(&mut con, "k", "uuid-1:7", 30_000);
    redisson_lock(&mut con, "k", "uuid-1:7", 30_000);
    let info = lock_info(&mut con, "k").unwrap();
    assert_eq!(
        info["token"],
        Value::Nil,
        "taken outside the module: no token yet"
    );
    assert_eq!(info_int(&info, "count"), 2);
    assert_eq!(release(&mut con, "k", "uuid-1:7"), Some(1));
    assert_eq!(release(&mut con, "k", "uuid-1:7"), Some(0));
    assert!(lock_info(&mut con, "k").is_none());
}

#[test]
fn a_reentry_into_a_redisson_hold_assigns_it_a_token() {
    let server = Server::start();
    let mut con = server.connect();
    let earlier = acquire(&mut con, "k", "x", 1_000).unwrap();
    release(&mut con, "k", "x").unwrap();
    redisson_lock(&mut con, "k", "uuid-1:7", 30_000);
    let token = acquire(&mut con, "k", "uuid-1:7", 30_000).unwrap();
    assert!(token > earlier);
    assert_eq!(acquire(&mut con, "k", "uuid-1:7", 30_000), Some(token));
}

#[test]
fn redisson_subscribers_are_woken_by_a_lock_release() {
    let server = Server::start();
    let mut sub = server.connect();
    let mut con = server.connect();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_lock__channel:{k}").unwrap();
    pubsub
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    acquire(&mut con, "k", "svc", 5_000).unwrap();
    release(&mut con, "k", "svc").unwrap();
    let payload: String = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(payload, "0");
    // Now the Redisson client retries its script and wins.
    assert_eq!(redisson_lock(&mut con, "k", "uuid-1:7", 30_000), None);
}

/// Review finding (F1): taking SHARED on one's own exclusive hold that Redisson's script took
/// (no fencing token) or that was PERSISTed (no lease) wrote an exclusive hold with token or
/// lease `0` into the multi-hold layout, which nothing could read back: every LOCK.* then
/// answered "not a lock" and only DEL cleared the key. Now the downgrade is refused, the key is
/// left as it was, and a re-entry (which gives the hold a token and a lease) makes it possible.
#[test]
fn a_downgrade_of_a_hold_without_token_or_lease_is_refused_and_leaves_the_lock_usable() {
    let server = Server::start();
    let mut con = server.connect();
    const REFUSED: &str = "ERR the owner's exclusive hold has no fencing token or no lease (taken outside the module); re-enter it with LOCK.ACQUIRE before taking it SHARED";
    // Redisson's script took it: no token.
    assert_eq!(redisson_lock(&mut con, "m", "uuid:3", 30_000), None);
    let before: Vec<String> = redis::cmd("HGETALL").arg("m").query(&mut con).unwrap();
    assert_eq!(
        error_of(
            &mut con,
            &[b"LOCK.ACQUIRE", b"m", b"uuid:3", b"5000", b"SHARED"]
        ),
        REFUSED
    );
    let after: Vec<String> = redis::cmd("HGETALL").arg("m").query(&mut con).unwrap();
    assert_eq!(after, before, "the key is unchanged");
    assert!(lock_info(&mut con, "m").is_some());
    // Re-entered through the module it has a token and a lease: now the downgrade works.
    acquire(&mut con, "m", "uuid:3", 30_000).unwrap();
    acquire_with(&mut con, "m", "uuid:3", 5_000, &["SHARED"])
        .unwrap()
        .unwrap();
    assert!(lock_info(&mut con, "m").is_some());
    assert_eq!(release(&mut con, "m", "uuid:3"), Some(2));

    // A module hold PERSISTed: no lease.
    acquire(&mut con, "p", "o", 30_000).unwrap();
    let _: i64 = redis::cmd("PERSIST").arg("p").query(&mut con).unwrap();
    assert_eq!(
        error_of(&mut con, &[b"LOCK.ACQUIRE", b"p", b"o", b"5000", b"SHARED"]),
        REFUSED
    );
    assert_eq!(release(&mut con, "p", "o"), Some(0));
    let exists: i64 = redis::cmd("EXISTS").arg("p").query(&mut con).unwrap();
    assert_eq!(exists, 0);
}
