//! The project's one test kit (`lock-testkit`): real servers with the module loaded, on free
//! loopback ports ($LOCK_SERVER, $LOCK_MODULE as for every other test of the project), and the
//! few helpers every test file of this crate needs.

// Each test binary uses part of this module.
#![allow(dead_code)]

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::LockClient;

#[allow(unused_imports)]
pub use lock_testkit::{server_info, server_name, Server, ServerKind};

/// Whether the server reports every key removal to modules (the key server event: Redis >= 7.2
/// and Valkey): only there does the module see DEL, SET over a key, RENAME and eviction.
pub fn reports_key_events() -> bool {
    let info = server_info();
    info.kind == ServerKind::Valkey || info.version >= (7, 2, 0)
}

/// A plain connection to `server`, for looking at what the library did.
pub async fn raw(server: &Server) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// A server, a library client of it with the default settings (the lost-hold signal on), and
/// a plain connection.
pub async fn setup() -> (Server, LockClient, MultiplexedConnection) {
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.expect("client");
    let raw = raw(&server).await;
    (server, client, raw)
}

/// A server, a library client of it that does not listen to the lost-hold signal (for what
/// the watchdog or the server's replies alone must notice), and a plain connection.
pub async fn setup_without_signal() -> (Server, LockClient, MultiplexedConnection) {
    let server = Server::start();
    let client = LockClient::builder(redis::Client::open(server.url()).expect("url"))
        .without_lost_signal()
        .build()
        .await
        .expect("client");
    let raw = raw(&server).await;
    (server, client, raw)
}

/// `INFO commandstats` calls of one command (0 when it never ran).
pub async fn calls(raw: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .expect("INFO");
    calls_in(&info, command)
}

/// The calls of `command` in an `INFO commandstats` reply.
pub fn calls_in(commandstats: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    commandstats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().expect("calls"))
        .unwrap_or(0)
}

/// The cluster slot of a key: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384.
pub fn key_slot(key: &str) -> u16 {
    let key = key.as_bytes();
    let hashed = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for byte in hashed {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

fn node_connection(host: &str, port: u16) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(format!("redis://{host}:{port}/"))?
        .get_connection_with_timeout(std::time::Duration::from_secs(5))
}

/// The port of `slot`'s master in the `CLUSTER SLOTS` of the node at `port`.
fn master_port(host: &str, port: u16, slot: u16) -> Option<u16> {
    let Ok(redis::Value::Array(ranges)) = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<redis::Value>(&mut node_connection(host, port).ok()?)
    else {
        return None;
    };
    ranges.iter().find_map(|range| match range {
        redis::Value::Array(f) => match f.as_slice() {
            [redis::Value::Int(lo), redis::Value::Int(hi), redis::Value::Array(master), ..]
                if (*lo..=*hi).contains(&i64::from(slot)) =>
            {
                match master.get(1) {
                    Some(redis::Value::Int(port)) => u16::try_from(*port).ok(),
                    _ => None,
                }
            }
            _ => None,
        },
        _ => None,
    })
}

/// Moves `slot` from its master to another of `nodes` (`nodes[pick]`, or the next one if that
/// is its master), as `redis-cli --cluster reshard` does: IMPORTING, MIGRATING, `MIGRATE` of
/// the slot's keys until the source has none left, then `SETSLOT NODE` everywhere; waits
/// (bounded) until every node agrees. Returns the ports of the master it left and of the one it
/// moved to (`Moved`), None if it could not start.
///
/// No `REPLACE`, as a reshard: a key the target already has in the slot (one it made while
/// importing) fails the `MIGRATE` with BUSYKEY. That is `Moved::error`, naming the key and
/// what it is on both nodes; the slot is still handed to the target (the run goes on), with
/// the busy keys left on the source.
pub fn move_slot_to(nodes: &[(String, u16)], slot: u16, pick: usize) -> Option<Moved> {
    let (host, first) = nodes.first().cloned()?;
    let from = master_port(&host, first, slot)?;
    let mut to = nodes[pick % nodes.len()].1;
    if to == from {
        to = nodes[(pick + 1) % nodes.len()].1;
    }
    let id = |port: u16| -> Option<String> {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut node_connection(&host, port).ok()?)
            .ok()
    };
    let (from_id, to_id) = (id(from)?, id(to)?);
    let setslot = |port: u16, args: &[&str]| -> bool {
        node_connection(&host, port)
            .and_then(|mut c| {
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(args)
                    .query::<()>(&mut c)
            })
            .is_ok()
    };
    if !setslot(to, &["IMPORTING", &from_id]) || !setslot(from, &["MIGRATING", &to_id]) {
        return None;
    }
    let mut failed = None;
    match node_connection(&host, from) {
        Ok(mut source) => {
            for _ in 0..20 {
                let keys: Vec<String> = redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(1_000)
                    .query(&mut source)
                    .unwrap_or_default();
                if keys.is_empty() {
                    break;
                }
                let migrated: redis::RedisResult<redis::Value> = redis::cmd("MIGRATE")
                    .arg(&host)
                    .arg(to)
                    .arg("")
                    .arg(0)
                    .arg(5_000)
                    .arg("KEYS")
                    .arg(&keys)
                    .query(&mut source);
                if let Err(e) = migrated {
                    let busy = if e.to_string().contains("BUSYKEY") {
                        busy_keys(&host, from, to, slot, &keys)
                    } else {
                        String::new()
                    };
                    failed = Some(format!(
                        "MIGRATE of slot {slot} {from}->{to}: {e}{busy} (keys {keys:?})"
                    ));
                    break;
                }
            }
        }
        Err(e) => failed = Some(format!("no connection to the source {from}: {e}")),
    }
    setslot(to, &["NODE", &to_id]);
    setslot(from, &["NODE", &to_id]);
    for (_, port) in nodes {
        if *port != to && *port != from {
            setslot(*port, &["NODE", &to_id]);
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while nodes
        .iter()
        .any(|(h, p)| master_port(h, *p, slot) != Some(to))
    {
        if std::time::Instant::now() >= deadline {
            failed
                .get_or_insert_with(|| format!("slot {slot} {from}->{to}: the nodes never agreed"));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Some(Moved {
        from,
        to,
        error: failed,
    })
}

/// A slot move (`move_slot_to`): the ports of the master it left and of the one it went to,
/// and what went wrong on the way, if anything (a BUSYKEY, the nodes never agreeing).
#[derive(Debug)]
pub struct Moved {
    pub from: u16,
    pub to: u16,
    pub error: Option<String>,
}

/// The keys of `keys` the node at `to` already has in `slot` (the cause of a BUSYKEY), each with
/// its type, TTL and value (a lock's `LOCK.INFO`) on the source and on the target.
fn busy_keys(host: &str, from: u16, to: u16, slot: u16, keys: &[String]) -> String {
    let (Ok(mut source), Ok(mut target)) = (node_connection(host, from), node_connection(host, to))
    else {
        return ": (no connection to look at the keys)".to_string();
    };
    let there: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1_000)
        .query(&mut target)
        .unwrap_or_default();
    let busy: Vec<&String> = keys.iter().filter(|k| there.contains(k)).collect();
    if busy.is_empty() {
        return format!(": no key found on the target, which has {there:?}");
    }
    let show = |conn: &mut redis::Connection, key: &str, asking: bool| -> String {
        let mut one = |cmd: &mut redis::Cmd| -> String {
            let mut pipe = redis::pipe();
            if asking {
                pipe.cmd("ASKING").ignore();
            }
            pipe.add_command(cmd.clone());
            match pipe.query::<Vec<redis::Value>>(conn) {
                Ok(mut v) => v.pop().map_or("-".into(), |v| format!("{v:?}")),
                Err(e) => format!("({e})"),
            }
        };
        let kind = one(redis::cmd("TYPE").arg(key));
        let pttl = one(redis::cmd("PTTL").arg(key));
        let read = if kind.contains("string") {
            Some(redis::cmd("GET").arg(key).clone())
        } else if kind.contains("hash") {
            Some(redis::cmd("HGETALL").arg(key).clone())
        } else if kind.contains("list") {
            Some(redis::cmd("LRANGE").arg(key).arg(0).arg(9).clone())
        } else if kind.contains("none") {
            None
        } else {
            Some(redis::cmd("LOCK.INFO").arg(key).clone())
        };
        let value = read.map_or("-".into(), |mut c| one(&mut c));
        format!("type {kind}, pttl {pttl}, value {value}")
    };
    let mut out = String::from(": busy on the target:");
    for key in busy {
        let on_source = show(&mut source, key, false);
        let on_target = show(&mut target, key, true);
        out.push_str(&format!(" {key}: source {on_source}, target {on_target};"));
    }
    out
}

/// The id of the connection an `EPHEMERAL` hold on `key` is bound to (`LOCK.INFO`'s `ephemeral`).
pub async fn ephemeral_connection(raw: &mut MultiplexedConnection, key: &str) -> i64 {
    bound_to(raw, key)
        .await
        .expect("held, and bound to a connection")
}

/// The id of the connection `key`'s `EPHEMERAL` hold is bound to (`LOCK.INFO`); None when the
/// key is not held or its hold is bound to none.
pub async fn bound_to(raw: &mut MultiplexedConnection, key: &str) -> Option<i64> {
    let info: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap();
    let Value::Array(fields) = info else {
        return None;
    };
    fields.chunks(2).find_map(|p| match p {
        [Value::BulkString(n), Value::Int(id)] if n == b"ephemeral" => Some(*id),
        _ => None,
    })
}

pub async fn kill(raw: &mut MultiplexedConnection, id: i64) {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(raw)
        .await
        .unwrap();
    assert_eq!(killed, 1);
}

/// How many subscribers `channel` has now (`PUBSUB NUMSUB`).
pub async fn subscribers(raw: &mut MultiplexedConnection, channel: &str) -> i64 {
    let reply: Vec<Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(raw)
        .await
        .unwrap();
    match reply.get(1) {
        Some(Value::Int(n)) => *n,
        other => panic!("PUBSUB NUMSUB {channel}: {other:?}"),
    }
}

/// Waits (bounded) until `channel` has `n` subscribers.
pub async fn wait_subscribers(raw: &mut MultiplexedConnection, channel: &str, n: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while subscribers(raw, channel).await != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{channel}: never {n} subscribers"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
