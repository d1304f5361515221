//! Consuming the server's lost-hold signal.
//!
//! When a hold ends by anything but its owner's own `LOCK.RELEASE`, the module publishes
//! `<reason> <token> <owner>` on `lock.lost:{KEY}` (`lock.lost:KEY` when KEY contains `{`,
//! Redisson's channel naming): `PUBLISH` standalone, `SPUBLISH` in a cluster. The client keeps
//! one pub/sub connection (standalone) or one RESP3 cluster connection (which sends each
//! `SSUBSCRIBE` to the channel's node and subscribes again after a reconnect or a slot move), and
//! subscribes to the channel of each key it holds while it holds it; a message marks a hold lost
//! only if its owner and token are this hold's.
//!
//! A flush names no keys: the module sends one `flushed <db>` (or `flushed all`) on
//! `lock.lost:flush` (classic `PUBLISH`, in a cluster too), and the client checks each of its
//! holds in that database with `LOCK.INFO`, a read that changes nothing.
//!
//! Pub/sub is at-most-once: a message published while the connection is down is gone. The
//! watchdog stays the backstop; the signal only makes the common case fast.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo, ProtocolVersion, PushKind, Value};
use tokio::sync::mpsc;

use crate::hold::HoldCore;
use crate::lost::LostReason;

/// The server's default `lock.lost-channel-prefix`. A server configured with another prefix is
/// listened to with [`LockClientBuilder::lost_signal_prefix`](crate::LockClientBuilder::lost_signal_prefix).
pub const DEFAULT_LOST_SIGNAL_PREFIX: &str = "lock.lost";

/// The channel the server publishes a key's lost-hold messages on with the default prefix:
/// `lock.lost:{KEY}`, or `lock.lost:KEY` when KEY already contains `{` (so the channel hashes to
/// the key's slot).
pub fn lost_signal_channel(key: &[u8]) -> Vec<u8> {
    lost_signal_channel_with_prefix(DEFAULT_LOST_SIGNAL_PREFIX.as_bytes(), key)
}

/// [`lost_signal_channel`] for a server whose `lock.lost-channel-prefix` is `prefix`:
/// `<prefix>:{KEY}`, or `<prefix>:KEY` when KEY contains `{`.
pub fn lost_signal_channel_with_prefix(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut channel = Vec::with_capacity(prefix.len() + key.len() + 3);
    channel.extend_from_slice(prefix);
    if key.contains(&b'{') {
        channel.push(b':');
        channel.extend_from_slice(key);
    } else {
        channel.extend_from_slice(b":{");
        channel.extend_from_slice(key);
        channel.push(b'}');
    }
    channel
}

/// The channel of the flush message: `<prefix>:flush` (no `{`, so no key's channel is this one).
fn flush_channel(prefix: &[u8]) -> Vec<u8> {
    [prefix, b":flush"].concat()
}

/// One lost-hold message: `<reason> <token> <owner>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostSignal {
    /// Why the hold ended.
    pub reason: LostReason,
    /// The hold's fencing token (0 when the hold had none).
    pub token: u64,
    /// The owner, binary-safe; the rest of the message, spaces included.
    pub owner: Vec<u8>,
}

impl LostSignal {
    /// Parses a message payload; `None` for anything not in the form above (an unknown reason
    /// word included, so that a newer server's reasons are ignored rather than misread).
    pub fn parse(payload: &[u8]) -> Option<LostSignal> {
        let mut parts = payload.splitn(3, |b| *b == b' ');
        let reason = std::str::from_utf8(parts.next()?).ok()?;
        let reason = LostReason::from_signal_word(reason)?;
        let token = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let owner = parts.next()?.to_vec();
        if owner.is_empty() {
            return None;
        }
        Some(LostSignal {
            reason,
            token,
            owner,
        })
    }
}

/// The client's one pub/sub connection and the holds it watches, by channel.
pub(crate) struct SignalHub {
    servers: HubServers,
    /// The server's `lock.lost-channel-prefix`, and the flush channel it makes.
    prefix: Vec<u8>,
    flush_channel: Vec<u8>,
    /// The database this client's holds live in (0 in a cluster): a flush of another is not ours.
    db: i64,
    state: Mutex<HubState>,
    /// Serializes (re)connecting, subscribing and unsubscribing.
    conn: tokio::sync::Mutex<Option<PubSub>>,
}

enum HubServers {
    /// `client` speaks RESP3 (pushes arrive on the connection that subscribed).
    Single(redis::Client),
    Cluster(Vec<ConnectionInfo>),
}

/// A connection that receives pushes.
enum PubSub {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl PubSub {
    async fn subscribe_key(&mut self, channels: &[Vec<u8>]) -> redis::RedisResult<()> {
        match self {
            PubSub::Single(c) => c.subscribe(channels).await,
            PubSub::Cluster(c) => {
                // One SSUBSCRIBE per channel: the channels of a cluster's keys are in many slots.
                for channel in channels {
                    c.ssubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    async fn unsubscribe_key(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        match self {
            PubSub::Single(c) => c.unsubscribe(channel).await,
            PubSub::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }

    async fn subscribe_flush(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        match self {
            PubSub::Single(c) => c.subscribe(channel).await,
            PubSub::Cluster(c) => c.subscribe(channel).await,
        }
    }
}

#[derive(Default)]
struct HubState {
    watched: HashMap<Vec<u8>, Vec<Watched>>,
}

/// A hold watched on one key's channel, with its token on that key.
struct Watched {
    hold: Weak<HoldCore>,
    token: u64,
}

impl SignalHub {
    /// `client` must speak RESP3 (pushes arrive on the connection that subscribed).
    pub(crate) fn single(client: redis::Client, db: i64, prefix: &[u8]) -> Arc<SignalHub> {
        SignalHub::new(HubServers::Single(client), db, prefix)
    }

    pub(crate) fn cluster(seeds: Vec<ConnectionInfo>, prefix: &[u8]) -> Arc<SignalHub> {
        SignalHub::new(HubServers::Cluster(seeds), 0, prefix)
    }

    fn new(servers: HubServers, db: i64, prefix: &[u8]) -> Arc<SignalHub> {
        Arc::new(SignalHub {
            servers,
            prefix: prefix.to_vec(),
            flush_channel: flush_channel(prefix),
            db,
            state: Mutex::new(HubState::default()),
            conn: tokio::sync::Mutex::new(None),
        })
    }

    /// Starts watching `hold`'s channel; returns once the server confirmed the subscription.
    /// A message published before that is missed (the watchdog still covers the hold).
    /// Every key of a multi-key hold is watched, each with its own token.
    pub(crate) async fn watch(self: &Arc<Self>, hold: &Arc<HoldCore>) -> redis::RedisResult<()> {
        let mut new = Vec::new();
        {
            let mut state = lock_state(&self.state);
            for (key, token) in hold.keys.iter().zip(hold.tokens.iter()) {
                let channel = lost_signal_channel_with_prefix(&self.prefix, key);
                let entry = state.watched.entry(channel.clone()).or_default();
                entry.retain(|w| w.hold.strong_count() > 0);
                entry.push(Watched {
                    hold: Arc::downgrade(hold),
                    token: *token,
                });
                if entry.len() == 1 {
                    new.push(channel);
                }
            }
        }
        if !new.is_empty() {
            let mut guard = self.conn.lock().await;
            let conn = self.connection(&mut guard).await?;
            conn.subscribe_key(&new).await?;
        }
        Ok(())
    }

    /// Stops watching `hold`; unsubscribes when no other hold of the client uses the channel.
    pub(crate) async fn unwatch(self: &Arc<Self>, hold: &HoldCore) {
        let mut last = Vec::new();
        {
            let mut state = lock_state(&self.state);
            for key in hold.keys.iter() {
                let channel = lost_signal_channel_with_prefix(&self.prefix, key);
                let Some(entry) = state.watched.get_mut(&channel) else {
                    continue;
                };
                entry.retain(|w| w.hold.strong_count() > 0 && !std::ptr::eq(w.hold.as_ptr(), hold));
                if entry.is_empty() {
                    state.watched.remove(&channel);
                    last.push(channel);
                }
            }
        }
        if !last.is_empty() {
            let mut guard = self.conn.lock().await;
            if let Some(conn) = guard.as_mut() {
                for channel in &last {
                    // A failure leaves a subscription nobody reads: harmless, and a reconnect
                    // drops it.
                    let _ = conn.unsubscribe_key(channel).await;
                }
            }
        }
    }

    /// The pub/sub connection, connecting (subscribed to the flush channel, its reader started)
    /// if there is none.
    async fn connection<'a>(
        self: &Arc<Self>,
        slot: &'a mut Option<PubSub>,
    ) -> redis::RedisResult<&'a mut PubSub> {
        if slot.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            let mut conn = match &self.servers {
                HubServers::Single(client) => {
                    let config = AsyncConnectionConfig::new().set_push_sender(tx);
                    PubSub::Single(
                        client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await?,
                    )
                }
                HubServers::Cluster(seeds) => PubSub::Cluster(
                    ClusterClientBuilder::new(seeds.clone())
                        .use_protocol(ProtocolVersion::RESP3)
                        .push_sender(tx)
                        .build()?
                        .get_async_connection()
                        .await?,
                ),
            };
            conn.subscribe_flush(&self.flush_channel).await?;
            self.start_reader(rx);
            *slot = Some(conn);
        }
        slot.as_mut()
            .ok_or_else(|| redis::RedisError::from((redis::ErrorKind::Client, "no connection")))
    }

    /// Reads the connection's pushes on a task of its own (a plain function, so that the reader
    /// and the reconnect it may start are not one recursive future type).
    fn start_reader(self: &Arc<Self>, rx: mpsc::UnboundedReceiver<redis::PushInfo>) {
        tokio::spawn(read_pushes(Arc::downgrade(self), rx));
    }

    /// The holds watched on `channel` with their token on its key (every watched hold, once
    /// per key, with `None`).
    fn watched_holds(&self, channel: Option<&[u8]>) -> Vec<(Arc<HoldCore>, u64)> {
        let state = lock_state(&self.state);
        let live = |w: &Watched| w.hold.upgrade().map(|h| (h, w.token));
        match channel {
            Some(channel) => state
                .watched
                .get(channel)
                .map(|entry| entry.iter().filter_map(live).collect())
                .unwrap_or_default(),
            None => {
                let mut holds: Vec<(Arc<HoldCore>, u64)> =
                    state.watched.values().flatten().filter_map(live).collect();
                holds.sort_by_key(|(h, _)| Arc::as_ptr(h));
                holds.dedup_by(|a, b| Arc::ptr_eq(&a.0, &b.0));
                holds
            }
        }
    }

    fn dispatch(&self, channel: &[u8], payload: &[u8]) {
        if channel == self.flush_channel.as_slice() {
            if flushed_db(payload).is_some_and(|db| db.covers(self.db)) {
                for (hold, _) in self.watched_holds(None) {
                    tokio::spawn(check_after_flush(hold));
                }
            }
            return;
        }
        let Some(signal) = LostSignal::parse(payload) else {
            return;
        };
        for (hold, token) in self.watched_holds(Some(channel)) {
            if hold.owner.as_bytes() == signal.owner.as_slice() && token == signal.token {
                hold.lose(signal.reason);
            }
        }
    }

    fn start_resubscribe(self: &Arc<Self>) {
        let hub = self.clone();
        tokio::spawn(async move { hub.resubscribe().await });
    }

    /// After the connection dropped: connect again and subscribe to every watched channel.
    /// Messages published in between are lost (at-most-once); the watchdogs cover them.
    async fn resubscribe(self: &Arc<Self>) {
        let mut delay = Duration::from_millis(50);
        loop {
            {
                let mut guard = self.conn.lock().await;
                *guard = None;
                let channels: Vec<Vec<u8>> =
                    lock_state(&self.state).watched.keys().cloned().collect();
                if channels.is_empty() {
                    return;
                }
                if let Ok(conn) = self.connection(&mut guard).await {
                    if conn.subscribe_key(&channels).await.is_ok() {
                        return;
                    }
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self.servers, HubServers::Cluster(_))
    }
}

/// The database a flush message names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlushedDb {
    All,
    One(i64),
}

impl FlushedDb {
    fn covers(self, db: i64) -> bool {
        match self {
            FlushedDb::All => true,
            FlushedDb::One(n) => n == db,
        }
    }
}

/// `flushed <db>` or `flushed all`.
fn flushed_db(payload: &[u8]) -> Option<FlushedDb> {
    let rest = payload.strip_prefix(b"flushed ")?;
    if rest == b"all" {
        return Some(FlushedDb::All);
    }
    std::str::from_utf8(rest)
        .ok()?
        .parse()
        .ok()
        .map(FlushedDb::One)
}

/// After a flush of its database: one `LOCK.INFO` tells whether the hold is still there. A
/// failed check says nothing (the watchdog's next renewal will).
async fn check_after_flush(hold: Arc<HoldCore>) {
    if !hold.status.is_active() {
        return;
    }
    for (key, token) in hold.keys.iter().zip(hold.tokens.iter()) {
        let mut cmd = redis::cmd("LOCK.INFO");
        cmd.arg(&**key);
        if let Ok(reply) = hold.conn.query(&cmd, key).await {
            if !info_has_hold(&reply, hold.owner.as_bytes(), *token) {
                // One key gone is the whole hold gone.
                hold.lose(LostReason::Flushed);
                return;
            }
        }
    }
}

/// Whether a `LOCK.INFO` reply (nil, or name/value pairs as a RESP2 flat array or a RESP3 map)
/// lists a hold of `owner` with `token` among its `holders`.
fn info_has_hold(reply: &Value, owner: &[u8], token: u64) -> bool {
    let Some(holders) = field(reply, b"holders") else {
        return false;
    };
    let Value::Array(holders) = holders else {
        return false;
    };
    holders.iter().any(|h| {
        matches!(field(h, b"owner"), Some(Value::BulkString(o)) if o.as_slice() == owner)
            && matches!(field(h, b"token"), Some(Value::Int(t)) if u64::try_from(*t).ok() == Some(token))
    })
}

fn field<'a>(value: &'a Value, name: &[u8]) -> Option<&'a Value> {
    let is_name = |v: &Value| match v {
        Value::BulkString(b) => b.as_slice() == name,
        Value::SimpleString(s) => s.as_bytes() == name,
        _ => false,
    };
    match value {
        Value::Map(pairs) => pairs.iter().find(|(k, _)| is_name(k)).map(|(_, v)| v),
        Value::Array(items) => items.chunks(2).find_map(|pair| match pair {
            [k, v] if is_name(k) => Some(v),
            _ => None,
        }),
        _ => None,
    }
}

fn lock_state(state: &Mutex<HubState>) -> std::sync::MutexGuard<'_, HubState> {
    // The state is a map of weak references: a panic elsewhere cannot leave it half-written in
    // a way that matters, so a poisoned lock is used as it is.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

async fn read_pushes(hub: Weak<SignalHub>, mut rx: mpsc::UnboundedReceiver<redis::PushInfo>) {
    while let Some(push) = rx.recv().await {
        let Some(hub) = hub.upgrade() else { return };
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let [redis::Value::BulkString(channel), redis::Value::BulkString(payload), ..] =
                    push.data.as_slice()
                {
                    hub.dispatch(channel, payload);
                }
            }
            // The cluster connection reconnects and subscribes again by itself.
            PushKind::Disconnection if !hub.is_cluster() => {
                hub.start_resubscribe();
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_follow_redisson() {
        assert_eq!(lost_signal_channel(b"orders:42"), b"lock.lost:{orders:42}");
        assert_eq!(
            lost_signal_channel(b"{tenant}:orders"),
            b"lock.lost:{tenant}:orders"
        );
        // Another prefix, as the server names it (core/src/channel.rs).
        assert_eq!(
            lost_signal_channel_with_prefix(b"app.lost", b"orders:42"),
            b"app.lost:{orders:42}"
        );
        assert_eq!(
            lost_signal_channel_with_prefix(b"app.lost", b"{tenant}:orders"),
            b"app.lost:{tenant}:orders"
        );
        assert_eq!(flush_channel(b"app.lost"), b"app.lost:flush");
    }

    #[test]
    fn flush_messages_name_a_database() {
        let cases: [(&[u8], Option<FlushedDb>); 5] = [
            (b"flushed all", Some(FlushedDb::All)),
            (b"flushed 0", Some(FlushedDb::One(0))),
            (b"flushed 15", Some(FlushedDb::One(15))),
            (b"flushed", None),
            (b"deleted 1 w", None),
        ];
        for (payload, want) in cases {
            assert_eq!(flushed_db(payload), want);
        }
        assert!(FlushedDb::All.covers(3));
        assert!(!FlushedDb::One(0).covers(3));
    }

    #[test]
    fn info_is_read_in_both_protocols() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("mode"),
            bulk("exclusive"),
            bulk("holders"),
            Value::Array(vec![Value::Array(vec![
                bulk("owner"),
                bulk("me"),
                bulk("token"),
                Value::Int(7),
            ])]),
        ]);
        let resp3 = Value::Map(vec![(
            bulk("holders"),
            Value::Array(vec![Value::Map(vec![
                (bulk("owner"), bulk("me")),
                (bulk("token"), Value::Int(7)),
            ])]),
        )]);
        for reply in [&resp2, &resp3] {
            assert!(info_has_hold(reply, b"me", 7));
            assert!(
                !info_has_hold(reply, b"me", 8),
                "a later hold of the same owner"
            );
            assert!(!info_has_hold(reply, b"you", 7));
        }
        assert!(!info_has_hold(&Value::Nil, b"me", 7));
    }

    #[test]
    fn messages_parse_with_owners_that_contain_spaces() {
        let cases: [(&[u8], Option<LostSignal>); 6] = [
            (
                b"forcereleased 17 worker 1",
                Some(LostSignal {
                    reason: LostReason::ForceReleased,
                    token: 17,
                    owner: b"worker 1".to_vec(),
                }),
            ),
            (
                b"expired 0 w",
                Some(LostSignal {
                    reason: LostReason::Expired,
                    token: 0,
                    owner: b"w".to_vec(),
                }),
            ),
            (b"released 1 w", None),
            (b"deleted x w", None),
            (b"deleted 1", None),
            (b"deleted 1 ", None),
        ];
        for (payload, want) in cases {
            assert_eq!(
                LostSignal::parse(payload),
                want,
                "{}",
                String::from_utf8_lossy(payload)
            );
        }
    }
}
