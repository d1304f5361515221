//! Commands and reads the tests share: LOCK.* calls, LOCK.INFO and INFO fields, the stored state
//! of a lock, replication checks, keyspace subscriptions.

use std::collections::{BTreeMap, HashMap};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Commands, Connection, Value};

/// The reply to any LOCK.* call on a hash that is not laid out as a lock.
pub const NOT_A_LOCK: &str = "ERR the hash at this key is not a lock; LOCK.* commands leave it as it is (DEL removes a damaged lock)";

/// Runs a command and returns the raw reply (errors become `Err` with Redis's text).
pub fn raw(con: &mut Connection, args: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con)
}

/// Redisson's RLock `tryLockInnerAsync` script (from ../shared/seeds/001_9c83fae6cf63878e.txt):
/// nil when acquired (or re-entered), else the lock's remaining pttl.
pub const REDISSON_LOCK: &str = "if (redis.call('exists', KEYS[1]) == 0) then \
redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then \
redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
return redis.call('pttl', KEYS[1]);";

/// Redisson's tryLock: nil when acquired, else the remaining pttl.
pub fn redisson_lock(con: &mut Connection, key: &str, owner: &str, lease: u64) -> Option<i64> {
    redis::Script::new(REDISSON_LOCK)
        .key(key)
        .arg(lease)
        .arg(owner)
        .invoke(con)
        .unwrap()
}

/// `LOCK.FORCERELEASE key` → 1 when a lock was removed, 0 when there was none.
pub fn force_release(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("LOCK.FORCERELEASE")
        .arg(key)
        .query(con)
        .expect("LOCK.FORCERELEASE")
}

/// `LOCK.ACQUIRE key owner lease` → Some(token) or None.
pub fn acquire(con: &mut Connection, key: &str, owner: &str, lease_ms: u64) -> Option<i64> {
    acquire_with(con, key, owner, lease_ms, &[]).expect("LOCK.ACQUIRE")
}

/// `LOCK.ACQUIRE key owner lease [options...]`, reply or error.
pub fn acquire_with(
    con: &mut Connection,
    key: &str,
    owner: &str,
    lease_ms: u64,
    options: &[&str],
) -> redis::RedisResult<Option<i64>> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(lease_ms)
        .arg(options)
        .query(con)
}

pub fn acquire_wait(
    con: &mut Connection,
    key: &str,
    owner: &str,
    lease_ms: u64,
    wait_ms: u64,
) -> Option<i64> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(lease_ms)
        .arg("WAIT")
        .arg(wait_ms)
        .query(con)
        .expect("LOCK.ACQUIRE WAIT")
}

pub fn release(con: &mut Connection, key: &str, owner: &str) -> Option<i64> {
    redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg(owner)
        .query(con)
        .expect("LOCK.RELEASE")
}

/// The error text of a command that must fail.
pub fn error_of(con: &mut Connection, args: &[&[u8]]) -> String {
    match raw(con, args) {
        Err(e) => {
            let code = e.code().unwrap_or("").to_string();
            let detail = e.detail().unwrap_or("").to_string();
            if code.is_empty() {
                e.to_string()
            } else {
                format!("{code} {detail}").trim_end().to_string()
            }
        }
        Ok(v) => panic!(
            "expected an error from {:?}, got {v:?}",
            String::from_utf8_lossy(args[0])
        ),
    }
}

/// LOCK.INFO as (name, value) pairs; None when free.
pub fn lock_info(con: &mut Connection, key: &str) -> Option<HashMap<String, Value>> {
    let v: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(con)
        .expect("LOCK.INFO");
    match v {
        Value::Nil => None,
        Value::Bulk(items) => {
            let mut map = HashMap::new();
            for pair in items.chunks(2) {
                let name: String = redis::from_redis_value(&pair[0]).unwrap();
                map.insert(name, pair[1].clone());
            }
            Some(map)
        }
        other => panic!("unexpected LOCK.INFO reply {other:?}"),
    }
}

pub fn info_int(info: &HashMap<String, Value>, field: &str) -> i64 {
    redis::from_redis_value(info.get(field).unwrap_or(&Value::Nil)).unwrap_or(-999)
}

/// `CLIENT ID` of a connection.
pub fn client_id(con: &mut Connection) -> i64 {
    redis::cmd("CLIENT")
        .arg("ID")
        .query(con)
        .expect("CLIENT ID")
}

/// LOCK.INFO's top-level `ephemeral` (the bound client id of the exclusive hold), None if nil.
/// Panics when the key is free.
pub fn bound_to(con: &mut Connection, key: &str) -> Option<i64> {
    let info = lock_info(con, key).unwrap_or_else(|| panic!("{key} is free"));
    redis::from_redis_value(info.get("ephemeral").expect("an ephemeral field")).unwrap()
}

/// An INFO field of the lock section (`lock_<name>`), or commandstats etc.
pub fn info_field(con: &mut Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(con).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

/// A counter or gauge of `INFO lock` (`lock_<name>`).
pub fn lock_stat(con: &mut Connection, name: &str) -> i64 {
    info_field(con, "lock", &format!("lock_{name}"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO lock has no lock_{name}"))
}

pub fn used_memory(con: &mut Connection) -> i64 {
    info_field(con, "memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory")
}

/// `CONFIG SET notify-keyspace-events <classes>`.
pub fn notify_keyspace_events(con: &mut Connection, classes: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg(classes)
        .query(con)
        .expect("CONFIG SET notify-keyspace-events");
}

/// `sub` subscribed to `key`'s keyspace channel in db 0; a read gives up after `timeout`, so a
/// test can drain what was published.
pub fn keyspace_subscriber<'a>(
    sub: &'a mut Connection,
    key: &str,
    timeout: Duration,
) -> redis::PubSub<'a> {
    let mut pubsub = sub.as_pubsub();
    pubsub
        .subscribe(format!("__keyspace@0__:{key}"))
        .expect("SUBSCRIBE");
    pubsub
        .set_read_timeout(Some(timeout))
        .expect("read timeout");
    pubsub
}

/// Waits until `f` is true or the timeout passes; returns whether it became true.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// The blocked clients' ids, in the order `CLIENT LIST` shows them.
pub fn blocked_client_ids(con: &mut Connection) -> Vec<i64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    lock_waiters_in(&list)
}

/// The ids of the clients blocked in LOCK.ACQUIRE in a `CLIENT LIST` text.
pub fn lock_waiters_in(list: &str) -> Vec<i64> {
    list.lines()
        .filter(|l| l.contains("cmd=lock.acquire") && l.contains("flags=b"))
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

pub fn waiters(con: &mut Connection) -> i64 {
    info_field(con, "lock", "lock_waiters")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// `WAIT numreplicas timeout` on the master: how many replicas acknowledged every write so far.
pub fn wait_replicas(con: &mut Connection, replicas: i64, timeout_ms: u64) -> i64 {
    redis::cmd("WAIT")
        .arg(replicas)
        .arg(timeout_ms)
        .query(con)
        .expect("WAIT")
}

/// Everything that makes up a lock's stored state: its hash (sorted), its absolute lease end
/// (`PEXPIRETIME`), and every token counter of the server with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLock {
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    pub expires_at: i64,
    pub counters: Vec<(String, String)>,
}

/// Waits until the replica acknowledged everything, then checks that `key` is stored on the
/// replica exactly as on the master (hash, absolute lease end, token counters).
pub fn assert_replica_matches(master: &mut Connection, replica: &mut Connection, key: &str) {
    assert_eq!(
        wait_replicas(master, 1, 5_000),
        1,
        "the replica did not ack"
    );
    let on_master = stored_lock(master, key);
    let mut on_replica = stored_lock(replica, key);
    // The ack covers what the replica received; give it a moment to have applied it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while on_replica != on_master && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
        on_replica = stored_lock(replica, key);
    }
    assert_eq!(
        on_replica, on_master,
        "replica differs from master for {key}"
    );
}

pub fn stored_lock(con: &mut Connection, key: &str) -> StoredLock {
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = con.hgetall(key).expect("HGETALL");
    fields.sort();
    let expires_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(con)
        .expect("PEXPIRETIME");
    let mut counters: Vec<(String, String)> = counter_names(con)
        .into_iter()
        .map(|name| {
            let value: String = con.get(&name).expect("GET counter");
            (name, value)
        })
        .collect();
    counters.sort();
    StoredLock {
        fields,
        expires_at,
        counters,
    }
}

pub fn counter_names(con: &mut Connection) -> Vec<String> {
    con.keys("__lock_fence__*").expect("KEYS")
}

/// LOCK.INFO's `waiters` of `key` (0 when the key is free).
pub fn key_waiters(con: &mut Connection, key: &str) -> i64 {
    lock_info(con, key)
        .map(|i| info_int(&i, "waiters"))
        .unwrap_or(0)
}

/// A key as `dataset` reads it: its type, its value, its absolute expiry (-1: none).
pub type Stored = (String, Vec<Vec<u8>>, i64);

/// Every key of the selected database with its type, its value read back in a canonical form
/// (not DUMP: a replica or a replay may encode the same value differently) and its absolute
/// expiry: what a refused command must leave exactly as it was.
pub fn dataset(con: &mut Connection) -> BTreeMap<Vec<u8>, Stored> {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(con).expect("KEYS");
    keys.into_iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(&key).query(con).expect("TYPE");
            let mut read =
                |cmd: &mut redis::Cmd| -> Vec<Vec<u8>> { flat(cmd.query(con).expect("read")) };
            let mut value = match kind.as_str() {
                "string" => read(redis::cmd("GET").arg(&key)),
                "hash" => read(redis::cmd("HGETALL").arg(&key)),
                "list" => read(redis::cmd("LRANGE").arg(&key).arg(0).arg(-1)),
                "set" => read(redis::cmd("SMEMBERS").arg(&key)),
                "zset" => read(
                    redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES"),
                ),
                "stream" => read(redis::cmd("XRANGE").arg(&key).arg("-").arg("+")),
                other => panic!("no canonical read for a {other}"),
            };
            if kind == "set" {
                value.sort();
            }
            if kind == "hash" {
                let mut pairs: Vec<Vec<Vec<u8>>> = value.chunks(2).map(<[_]>::to_vec).collect();
                pairs.sort();
                value = pairs.concat();
            }
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query(con)
                .expect("PEXPIRETIME");
            (key, (kind, value, at))
        })
        .collect()
}

/// A reply's strings and integers, depth first.
pub fn flat(value: Value) -> Vec<Vec<u8>> {
    match value {
        Value::Data(bytes) => vec![bytes],
        Value::Int(n) => vec![n.to_string().into_bytes()],
        Value::Bulk(items) => items.into_iter().flat_map(flat).collect(),
        Value::Nil => vec![],
        other => vec![format!("{other:?}").into_bytes()],
    }
}

/// How many times the server ran `command` (its `INFO commandstats` calls; 0 if never).
pub fn command_calls(con: &mut Connection, command: &str) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    let prefix = format!("cmdstat_{}:calls=", command.to_ascii_lowercase());
    stats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
