//! The lost-hold signal: a holder whose hold ends by anything but its own `LOCK.RELEASE` is
//! told on `lock.lost:{<key>}`, with `<reason> <db> <token> <keylen> <key> <owner>` (one message
//! `<reason> <db> * <keylen> <key>` for a key with several holds removed from outside). What the module
//! does itself (a force release, a lease it sees end, a closed EPHEMERAL connection) it reports
//! on every server; what other commands do to the key (DEL, UNLINK, RENAME, SET over it,
//! eviction, a whole key's expiry) it learns from the key server event of Redis >= 7.2 and
//! Valkey, and Redis 7.0 has none: there the test checks that nothing false is said.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);

/// A connection subscribed to one channel; its messages arrive on the receiver.
fn listen(server: &Server, channel: &str) -> mpsc::Receiver<String> {
    let mut con = server.connect();
    let (messages, received) = mpsc::channel();
    let (ready, subscribed) = mpsc::channel();
    let channel = channel.to_string();
    thread::spawn(move || {
        let mut pubsub = con.as_pubsub();
        pubsub.subscribe(&channel).expect("SUBSCRIBE");
        let _ = ready.send(());
        // Ends when the server goes (the test's end) or the receiver is dropped.
        while let Ok(message) = pubsub.get_message() {
            let payload: String = message.get_payload().unwrap_or_default();
            if messages.send(payload).is_err() {
                break;
            }
        }
    });
    subscribed.recv_timeout(SOON).expect("subscribed");
    received
}

/// The message about one hold of `key` in database 0.
fn told(reason: &str, token: i64, key: &str, owner: &str) -> String {
    format!("{reason} 0 {token} {} {key} {owner}", key.len())
}

fn channel_of(key: &str) -> String {
    format!("lock.lost:{{{key}}}")
}

/// The next message, or a panic naming what was awaited.
fn next(received: &mpsc::Receiver<String>, what: &str) -> String {
    received
        .recv_timeout(SOON)
        .unwrap_or_else(|_| panic!("no lost-hold message for {what}"))
}

/// Proves that nothing was published on the channel before now: a marker published now is
/// the next message.
fn nothing_before_marker(con: &mut Connection, received: &mpsc::Receiver<String>, key: &str) {
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel_of(key))
        .arg("marker")
        .query(con)
        .unwrap();
    assert_eq!(next(received, "the marker"), "marker");
}

fn reports_key_events() -> bool {
    let info = server_info();
    info.kind == ServerKind::Valkey || info.version >= (7, 2, 0)
}

#[test]
fn a_forced_release_tells_every_holder_with_its_token() {
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    let a = acquire_with(&mut con, "k", "reader a", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    let b = acquire_with(&mut con, "k", "reader-b", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    force_release(&mut con, "k");
    let mut heard = vec![next(&received, "a"), next(&received, "b")];
    heard.sort();
    // The owner is the rest of the message, spaces and all.
    assert_eq!(
        heard,
        [
            told("forcereleased", a, "k", "reader a"),
            told("forcereleased", b, "k", "reader-b")
        ]
    );
    // An exclusive key: one holder, one message.
    let t = acquire(&mut con, "k", "writer", 60_000).unwrap();
    force_release(&mut con, "k");
    assert_eq!(
        next(&received, "writer"),
        told("forcereleased", t, "k", "writer")
    );
}

#[test]
fn an_owners_own_release_renew_and_reentry_tell_nobody() {
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    acquire(&mut con, "k", "me", 60_000).unwrap();
    acquire(&mut con, "k", "me", 60_000).unwrap();
    let renewed: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("me")
        .arg(30_000)
        .query(&mut con)
        .unwrap();
    assert_eq!(renewed, 1);
    assert_eq!(release(&mut con, "k", "me"), Some(1));
    assert_eq!(release(&mut con, "k", "me"), Some(0));
    nothing_before_marker(&mut con, &received, "k");
}

#[test]
fn a_closed_ephemeral_connection_tells_its_holder() {
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    let mut holder = server.connect();
    let token = acquire_with(&mut holder, "k", "worker-1", 60_000, &["EPHEMERAL"])
        .unwrap()
        .unwrap();
    drop(holder);
    assert_eq!(
        next(&received, "the closed connection"),
        told("disconnected", token, "k", "worker-1")
    );
    assert_eq!(lock_info(&mut con, "k"), None);
}

#[test]
fn a_lease_that_ends_while_others_hold_the_key_tells_its_holder() {
    // One shared hold of two runs out while a writer waits: the module sees it end (on every
    // server: the key itself does not expire) and tells its holder.
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    let short = acquire_with(&mut con, "k", "short", 300, &["SHARED"])
        .unwrap()
        .unwrap();
    acquire_with(&mut con, "k", "long", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    let writer = Waiter::start(&server, "k", "writer", 60_000, 1_000);
    assert_eq!(
        next(&received, "the short lease"),
        told("expired", short, "k", "short")
    );
    // The long hold is still there: the writer times out, nobody else is told anything.
    assert_eq!(writer.token(SOON), None);
    nothing_before_marker(&mut con, &received, "k");
}

#[test]
fn keys_removed_or_replaced_from_outside_tell_their_holders_where_the_server_reports_it() {
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    let cases: [(&[&str], &str); 4] = [
        (&["DEL", "k"], "deleted"),
        (&["UNLINK", "k"], "deleted"),
        (&["RENAME", "k", "elsewhere"], "deleted"),
        (&["SET", "k", "v"], "overwritten"),
    ];
    for (command, reason) in cases {
        let token = acquire(&mut con, "k", "holder", 60_000).unwrap();
        let mut cmd = redis::cmd(command[0]);
        for arg in &command[1..] {
            cmd.arg(*arg);
        }
        let _: Value = cmd.query(&mut con).unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg("k")
            .arg("elsewhere")
            .query(&mut con)
            .unwrap();
        if reports_key_events() {
            assert_eq!(
                next(&received, command[0]),
                told(reason, token, "k", "holder"),
                "{command:?}"
            );
        }
        // Nothing else, and on Redis 7.0 nothing at all: the key is gone before the module hears.
        nothing_before_marker(&mut con, &received, "k");
    }
    // A whole key's lease end (the key expires).
    let token = acquire(&mut con, "k", "holder", 100).unwrap();
    assert!(eventually(SOON, || {
        let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
        exists == 0
    }));
    if reports_key_events() {
        assert_eq!(
            next(&received, "the expiry"),
            told("expired", token, "k", "holder")
        );
    }
    nothing_before_marker(&mut con, &received, "k");
}

/// A key with several holds removed or replaced from outside: one message for the key, not one
/// per hold (the key event runs inside the removing command, which must stay O(keys)); the
/// holders check theirs with a read.
#[test]
fn a_key_with_several_holds_removed_from_outside_is_one_message_for_the_key() {
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    let share = |con: &mut Connection| {
        for owner in ["r1", "r2", "r 3"] {
            acquire_with(con, "k", owner, 60_000, &["SHARED"])
                .unwrap()
                .unwrap();
        }
    };
    for (command, reason) in [("DEL", "deleted"), ("SET", "overwritten")] {
        share(&mut con);
        let mut cmd = redis::cmd(command);
        cmd.arg("k");
        if command == "SET" {
            cmd.arg("v");
        }
        let _: Value = cmd.query(&mut con).unwrap();
        let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
        if reports_key_events() {
            assert_eq!(next(&received, command), format!("{reason} 0 * 1 k"));
        }
        nothing_before_marker(&mut con, &received, "k");
    }
    // The whole key's expiry: every hold's lease ends at once.
    for owner in ["r1", "r2"] {
        acquire_with(&mut con, "k", owner, 100, &["SHARED"])
            .unwrap()
            .unwrap();
    }
    assert!(eventually(SOON, || {
        let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
        exists == 0
    }));
    if reports_key_events() {
        let heard = next(&received, "the expiry");
        // The server's expiry, or the module's own look at the key (a hold at a time) if a
        // command read it first: either names the key and its database.
        assert!(
            heard == "expired 0 * 1 k"
                || heard.starts_with("expired 0 ") && heard.contains(" 1 k r"),
            "{heard}"
        );
    }
}

/// A copy of a lock (`COPY k k DB 1`, a backup; `COPY k {k}`, which shares `k`'s channel) keeps
/// the owner and the token: deleting the copy says so about the copy, naming its database and
/// key, never in words the original's holder would take for its own loss.
#[test]
fn deleting_a_copy_names_the_copy_not_the_original() {
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    let token = acquire(&mut con, "k", "holder", 60_000).unwrap();
    let select = |con: &mut Connection, db: i64| {
        let _: () = redis::cmd("SELECT").arg(db).query(con).unwrap();
    };
    let _: i64 = redis::cmd("COPY")
        .arg("k")
        .arg("k")
        .arg("DB")
        .arg(1)
        .query(&mut con)
        .unwrap();
    // (Valkey 8.1.8 leaves the connection on db 1 after COPY ... DB with a module loaded.)
    select(&mut con, 0);
    let mut in_db1 = server.connect();
    select(&mut in_db1, 1);
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut in_db1).unwrap();
    let _: i64 = redis::cmd("COPY")
        .arg("k")
        .arg("{k}")
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("DEL").arg("{k}").query(&mut con).unwrap();
    if reports_key_events() {
        assert_eq!(
            next(&received, "the copy in db 1"),
            format!("deleted 1 {token} 1 k holder")
        );
        assert_eq!(
            next(&received, "the copy {k}"),
            format!("deleted 0 {token} 3 {{k}} holder")
        );
    }
    nothing_before_marker(&mut con, &received, "k");
    // The original is untouched and still renews.
    let renewed: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("holder")
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    assert_eq!(renewed, 1);
}

#[test]
fn an_evicted_lock_tells_its_holder_where_the_server_reports_it() {
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    let token = acquire(&mut con, "k", "holder", 60_000).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-random")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut con)
        .unwrap();
    // The next write makes the server evict every key it can; the write itself is refused.
    let _ = redis::cmd("SET")
        .arg("other")
        .arg("v")
        .query::<Value>(&mut con);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut con)
        .unwrap();
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut con).unwrap();
    assert_eq!(exists, 0, "the lock was evicted");
    if reports_key_events() {
        assert_eq!(
            next(&received, "the eviction"),
            told("evicted", token, "k", "holder")
        );
    }
    nothing_before_marker(&mut con, &received, "k");
}

#[test]
fn an_empty_prefix_turns_the_signal_off() {
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    set_lost_prefix(&mut con, "");
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    force_release(&mut con, "k");
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    nothing_before_marker(&mut con, &received, "k");
    // Another prefix names another channel, with the key's hash tag kept.
    set_lost_prefix(&mut con, "app.lost");
    let tagged = listen(&server, "app.lost:{user}:lock");
    let t = acquire(&mut con, "{user}:lock", "holder", 60_000).unwrap();
    force_release(&mut con, "{user}:lock");
    assert_eq!(
        next(&tagged, "the tagged key"),
        told("forcereleased", t, "{user}:lock", "holder")
    );
}

#[test]
fn a_replica_tells_nobody() {
    // The master tells the holders; its replica applies the same effects (a DEL, an expiry)
    // and must not tell them again, or wrongly (an owner's own release is a DEL there).
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let mut con = master.connect();
    let mut on_replica = replica.connect();
    let received = listen(&replica, &channel_of("k"));
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    assert_eq!(release(&mut con, "k", "holder"), Some(0));
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    force_release(&mut con, "k");
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    assert_eq!(wait_replicas(&mut con, 1, 5_000), 1);
    nothing_before_marker(&mut on_replica, &received, "k");
}

#[test]
fn reloading_the_data_tells_nobody() {
    // DEBUG RELOAD replays what happened before: nobody lost anything now.
    let server = Server::start_with(&["--appendonly", "yes", "--enable-debug-command", "yes"]);
    let mut con = server.connect();
    let received = listen(&server, &channel_of("k"));
    for _ in 0..3 {
        acquire(&mut con, "k", "holder", 60_000).unwrap();
        let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    }
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    // What the DELs sent (on servers with the key event), before the reload.
    if reports_key_events() {
        for _ in 0..3 {
            assert!(next(&received, "a DEL").starts_with("deleted "));
        }
    }
    let _: () = redis::cmd("DEBUG").arg("LOADAOF").query(&mut con).unwrap();
    nothing_before_marker(&mut con, &received, "k");
    assert!(
        lock_info(&mut con, "k").is_some(),
        "the hold survived the reload"
    );
}

/// `CONFIG SET lock.lost-channel-prefix <prefix>` (empty: the signal off).
fn set_lost_prefix(con: &mut Connection, prefix: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.lost-channel-prefix")
        .arg(prefix)
        .query(con)
        .unwrap();
}

/// A marker published on the flush channel now is its next message: nothing came before it.
fn nothing_on_flush_channel_before_marker(con: &mut Connection, received: &mpsc::Receiver<String>) {
    let _: i64 = redis::cmd("PUBLISH")
        .arg("lock.lost:flush")
        .arg("marker")
        .query(con)
        .unwrap();
    assert_eq!(next(received, "the marker"), "marker");
}

#[test]
fn a_flush_tells_every_holder_once_on_the_flush_channel() {
    // A flush names no keys: one message per flush, `flushed <db>` or `flushed all`, on
    // `<prefix>:flush`, on every server (the flush event is older than Redis 7.0).
    let server = Server::start();
    let mut con = server.connect();
    let received = listen(&server, "lock.lost:flush");
    let on_key = listen(&server, &channel_of("k"));
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    acquire(&mut con, "other", "holder", 60_000).unwrap();
    let _: () = redis::cmd("FLUSHDB").query(&mut con).unwrap();
    assert_eq!(next(&received, "FLUSHDB"), "flushed 0");
    assert_eq!(lock_info(&mut con, "k"), None);
    let _: () = redis::cmd("SELECT").arg(3).query(&mut con).unwrap();
    let _: () = redis::cmd("FLUSHDB").arg("ASYNC").query(&mut con).unwrap();
    assert_eq!(next(&received, "FLUSHDB ASYNC in db 3"), "flushed 3");
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    assert_eq!(next(&received, "FLUSHALL"), "flushed all");
    let _: () = redis::cmd("FLUSHALL").arg("ASYNC").query(&mut con).unwrap();
    assert_eq!(next(&received, "FLUSHALL ASYNC"), "flushed all");
    nothing_on_flush_channel_before_marker(&mut con, &received);
    // Nothing per key: the flush channel is the only one told.
    nothing_before_marker(&mut con, &on_key, "k");

    // Another prefix names another flush channel; an empty one sends nothing.
    set_lost_prefix(&mut con, "app.lost");
    let app = listen(&server, "app.lost:flush");
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    assert_eq!(next(&app, "FLUSHALL under app.lost"), "flushed all");
    set_lost_prefix(&mut con, "");
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    nothing_on_flush_channel_before_marker(&mut con, &received);
    let _: i64 = redis::cmd("PUBLISH")
        .arg("app.lost:flush")
        .arg("marker")
        .query(&mut con)
        .unwrap();
    assert_eq!(next(&app, "the marker"), "marker");
}

#[test]
fn a_replica_does_not_repeat_its_masters_flush_message() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let mut con = master.connect();
    let mut on_replica = replica.connect();
    let received = listen(&replica, "lock.lost:flush");
    let from_master = listen(&master, "lock.lost:flush");
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    assert_eq!(next(&from_master, "the master's FLUSHALL"), "flushed all");
    assert_eq!(wait_replicas(&mut con, 1, 5_000), 1);
    nothing_on_flush_channel_before_marker(&mut on_replica, &received);
}

#[test]
fn debug_reload_sends_the_flush_message_and_keeps_the_holds() {
    // Redis's DEBUG RELOAD empties the data (the flush event) before loading it back: the
    // message goes out, and a library's check (LOCK.INFO, answered after the reload) finds its
    // holds. Redis and Valkey 8 fire the flush event there; Valkey 9 does not: nothing is sent.
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut con = server.connect();
    let received = listen(&server, "lock.lost:flush");
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    let info = server_info();
    if info.kind == ServerKind::Redis || info.version.0 < 9 {
        assert_eq!(next(&received, "DEBUG RELOAD"), "flushed all");
    }
    nothing_on_flush_channel_before_marker(&mut con, &received);
    assert!(lock_info(&mut con, "k").is_some(), "the hold survived");
}
