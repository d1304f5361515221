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
    assert_eq!(
        stored_lock(&mut con, "k").fields,
        [
            (b"mode".to_vec(), format!("exclusive:{token}").into_bytes()),
            (b"uuid-1:7".to_vec(), b"2".to_vec()),
        ],
        "the token goes into mode"
    );
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

// ---------------------------------------------------------------------------------------------
// Redisson's RReadWriteLock (issue #20). These scripts are our implementation of the algorithm
// Redisson publishes for RedissonReadLock/RedissonWriteLock `tryLockInnerAsync` and
// RedissonReadLock `unlockInnerAsync`, not Redisson's code: they make the same Redis calls on the
// same keys and fields (the `mode` field, the holder's field `<uuid>:<threadId>`, the read holds'
// timeout keys), which is what decides whether the two can share a key.

/// Read lock: KEYS[1] the lock, KEYS[2] the read hold's timeout prefix; ARGV[1] the lease,
/// ARGV[2] the holder, ARGV[3] the holder's write-lock name. Nil when taken, else the pttl.
const RW_READ_LOCK: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); \
if (mode == false) then \
  redis.call('hset', KEYS[1], 'mode', 'read'); redis.call('hset', KEYS[1], ARGV[2], 1); \
  redis.call('set', KEYS[2] .. ':1', 1); redis.call('pexpire', KEYS[2] .. ':1', ARGV[1]); \
  redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then \
  local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1); local key = KEYS[2] .. ':' .. ind; \
  redis.call('set', key, 1); redis.call('pexpire', key, ARGV[1]); \
  local remainTime = redis.call('pttl', KEYS[1]); \
  redis.call('pexpire', KEYS[1], math.max(remainTime, ARGV[1])); return nil; end; \
return redis.call('pttl', KEYS[1]);";

/// Write lock: KEYS[1] the lock; ARGV[1] the lease, ARGV[2] the holder's write-lock name.
const RW_WRITE_LOCK: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); \
if (mode == false) then \
  redis.call('hset', KEYS[1], 'mode', 'write'); redis.call('hset', KEYS[1], ARGV[2], 1); \
  redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
if (mode == 'write') then \
  if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then \
    redis.call('hincrby', KEYS[1], ARGV[2], 1); local currentExpire = redis.call('pttl', KEYS[1]); \
    redis.call('pexpire', KEYS[1], currentExpire + ARGV[1]); return nil; end; end; \
return redis.call('pttl', KEYS[1]);";

/// Read unlock: KEYS[1] the lock, KEYS[2] its channel, KEYS[3] the holder's timeout prefix,
/// KEYS[4] the lock's timeout prefix; ARGV[1] the unlock message, ARGV[2] the holder. 1 when the
/// lock went (or was free), 0 when it stays, nil when the caller holds nothing.
const RW_READ_UNLOCK: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); \
if (mode == false) then redis.call('publish', KEYS[2], ARGV[1]); return 1; end; \
local lockExists = redis.call('hexists', KEYS[1], ARGV[2]); \
if (lockExists == 0) then return nil; end; \
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1); \
if (counter == 0) then redis.call('hdel', KEYS[1], ARGV[2]); end; \
redis.call('del', KEYS[3] .. ':' .. (counter+1)); \
if (redis.call('hlen', KEYS[1]) > 1) then \
  local maxRemainTime = -3; local keys = redis.call('hkeys', KEYS[1]); \
  for n, key in ipairs(keys) do \
    counter = tonumber(redis.call('hget', KEYS[1], key)); \
    if type(counter) == 'number' then \
      for i=counter, 1, -1 do \
        local remainTime = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i); \
        maxRemainTime = math.max(remainTime, maxRemainTime); end; end; end; \
  if maxRemainTime > 0 then redis.call('pexpire', KEYS[1], maxRemainTime); return 0; end; \
  if mode == 'write' then return 0; end; end; \
redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1;";

fn rw_read_lock(con: &mut Connection, key: &str, holder: &str, lease: u64) -> Option<i64> {
    redis::Script::new(RW_READ_LOCK)
        .key(key)
        .key(format!("{{{key}}}:{holder}:rwlock_timeout"))
        .arg(lease)
        .arg(holder)
        .arg(format!("{holder}:write"))
        .invoke(con)
        .unwrap()
}

fn rw_write_lock(con: &mut Connection, key: &str, holder: &str, lease: u64) -> Option<i64> {
    redis::Script::new(RW_WRITE_LOCK)
        .key(key)
        .arg(lease)
        .arg(format!("{holder}:write"))
        .invoke(con)
        .unwrap()
}

fn rw_read_unlock(con: &mut Connection, key: &str, holder: &str) -> Option<i64> {
    redis::Script::new(RW_READ_UNLOCK)
        .key(key)
        .key(format!("redisson_rwlock:{{{key}}}"))
        .key(format!("{{{key}}}:{holder}:rwlock_timeout"))
        .key(format!("{{{key}}}"))
        .arg(0)
        .arg(holder)
        .invoke(con)
        .unwrap()
}

/// Everything a script could have changed: the lock's fields, its expiry, the key count.
fn snapshot(con: &mut Connection, key: &str) -> (StoredLock, i64) {
    let keys: i64 = redis::cmd("DBSIZE").query(con).unwrap();
    (stored_lock(con, key), keys)
}

#[test]
fn redissons_read_write_lock_sees_every_module_key_busy_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.connect();
    let exclusive = acquire(&mut con, "x", "svc", 30_000).unwrap();
    let shared = acquire_with(&mut con, "s", "svc", 30_000, &["SHARED"])
        .unwrap()
        .unwrap();
    let permit = acquire_with(&mut con, "p", "svc", 30_000, &["LIMIT", "2"])
        .unwrap()
        .unwrap();
    let cases: [(&str, i64, &[&str]); 3] = [
        ("x", exclusive, &[]),
        ("s", shared, &["SHARED"]),
        ("p", permit, &["LIMIT", "2"]),
    ];
    for (key, token, options) in cases {
        let before = snapshot(&mut con, key);
        let pttl = rw_read_lock(&mut con, key, "uuid-9:1", 60_000);
        assert!(
            matches!(pttl, Some(ms) if ms > 0 && ms <= 30_000),
            "{key}: Redisson's read lock sees it busy: {pttl:?}"
        );
        let pttl = rw_write_lock(&mut con, key, "uuid-9:1", 60_000);
        assert!(
            matches!(pttl, Some(ms) if ms > 0 && ms <= 30_000),
            "{key}: Redisson's write lock sees it busy: {pttl:?}"
        );
        assert_eq!(
            rw_read_unlock(&mut con, key, "uuid-9:1"),
            None,
            "{key}: a read unlock by a non-holder does nothing"
        );
        assert_eq!(snapshot(&mut con, key), before, "{key}: nothing changed");
        // The module still reads its lock and carries on: a re-entry keeps the token.
        assert!(lock_info(&mut con, key).is_some(), "{key}: still a lock");
        assert_eq!(
            acquire_with(&mut con, key, "svc", 30_000, options).unwrap(),
            Some(token),
            "{key}"
        );
        assert_eq!(release(&mut con, key, "svc"), Some(1), "{key}");
        assert_eq!(release(&mut con, key, "svc"), Some(0), "{key}");
        assert!(lock_info(&mut con, key).is_none(), "{key}");
        // Free, it is Redisson's to take as usual.
        assert_eq!(rw_write_lock(&mut con, key, "uuid-9:1", 60_000), None);
    }
}

/// Keys written before the token moved into `mode` (`{owner, __fence__}`, and `__mode__` on a
/// multi-hold key) are read as before and converted by their next write.
#[test]
fn a_key_in_the_old_layout_is_read_and_converted_by_its_next_write() {
    let server = Server::start();
    let mut con = server.connect();
    let now: Vec<i64> = redis::cmd("TIME").query(&mut con).unwrap();
    let end = now[0] * 1000 + now[1] / 1000 + 60_000;

    let _: () = redis::cmd("HSET")
        .arg("x")
        .arg("svc")
        .arg(1)
        .arg("__fence__")
        .arg(1_732_370_000_123_004i64)
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg("x")
        .arg(end)
        .query(&mut con)
        .unwrap();
    let info = lock_info(&mut con, "x").expect("the old layout is a lock");
    assert_eq!(info_int(&info, "token"), 1_732_370_000_123_004);
    assert_eq!(
        acquire(&mut con, "x", "svc", 30_000),
        Some(1_732_370_000_123_004),
        "re-entered with its token"
    );
    let stored = stored_lock(&mut con, "x");
    assert_eq!(
        stored.fields,
        [
            (b"mode".to_vec(), b"exclusive:1732370000123004".to_vec()),
            (b"svc".to_vec(), b"2".to_vec()),
        ],
        "mode carries the token, the fence field is gone"
    );
    assert_eq!(release(&mut con, "x", "svc"), Some(1));
    assert_eq!(release(&mut con, "x", "svc"), Some(0));

    let _: () = redis::cmd("HSET")
        .arg("s")
        .arg("__mode__")
        .arg("rw")
        .arg("s:a")
        .arg(format!("1:{end}:77"))
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg("s")
        .arg(end)
        .query(&mut con)
        .unwrap();
    let info = lock_info(&mut con, "s").expect("the old mode field is a lock");
    let mode: String = redis::from_redis_value(&info["mode"]).unwrap();
    assert_eq!(mode, "shared");
    let token = acquire_with(&mut con, "s", "b", 30_000, &["SHARED"])
        .unwrap()
        .unwrap();
    let stored = stored_lock(&mut con, "s");
    let names: Vec<&[u8]> = stored.fields.iter().map(|(f, _)| f.as_slice()).collect();
    assert_eq!(names, [&b"mode"[..], b"s:a", b"s:b"], "mode renamed");
    assert_eq!(stored.fields[0].1, b"rw");
    assert_eq!(stored.fields[1].1, format!("1:{end}:77").into_bytes());
    assert!(stored.fields[2].1.ends_with(format!(":{token}").as_bytes()));
    assert_eq!(release(&mut con, "s", "a"), Some(0));
    assert_eq!(release(&mut con, "s", "b"), Some(0));
    assert!(lock_info(&mut con, "s").is_none());
}
