//! Listening to the server's lost-hold signal: one pub/sub connection per client.
//!
//! When a hold ends by anything but its owner's own `LOCK.RELEASE`, the module publishes a
//! message on `<prefix>:{KEY}` (`<prefix>:KEY` when KEY contains `{`, Redisson's channel naming):
//! `PUBLISH` standalone, `SPUBLISH` in a cluster; a flush is one message on `<prefix>:flush`
//! (classic `PUBLISH`, in a cluster too). The forms are in [`LostSignal`]. The listener keeps one
//! pub/sub connection (standalone) or one RESP3 cluster connection (which sends each `SSUBSCRIBE`
//! to the channel's node), subscribes to the channel of each key a [`Subscriber`] watches while
//! it watches it, parses each message once and hands it to the subscribers of its channel (a
//! flush: to every subscriber). It knows nothing of holds: a subscriber decides whether a
//! message is about it (keys `a` and `{a}`, and one key name in two databases, share a channel).
//!
//! Pub/sub is at-most-once: a message published while the connection is down is gone. The
//! watchdog stays the backstop; the signal only makes the common case fast.
//!
//! A subscription the ACL refuses (`NOPERM`: the user lacks the channel's `&` rule, the flush
//! channel's or a key's) is returned at once as [`LockError::NoPermission`] naming the channel,
//! and the refused channel is forgotten, so that the next acquire asks again (the ACL may have
//! changed meanwhile).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo, ProtocolVersion, PushKind, Value};
use tokio::sync::mpsc;

use crate::basics::relock;
use crate::channel::{flush_channel, lost_signal_channel_with_prefix};
use crate::error::LockError;
use crate::master::Master;
use crate::message::LostSignal;
use crate::naming::setname;

/// Something that listens to the lost-hold messages of some keys.
pub(crate) trait Subscriber: Send + Sync + 'static {
    /// A message on the channel of one of its keys, or on the flush channel (called on the
    /// listener's task: it must not block).
    fn hear(self: Arc<Self>, signal: &LostSignal);
}

/// The channels subscribed to, each with its subscribers.
type Watched = HashMap<Vec<u8>, Channel>;

/// One channel the connection is subscribed to (or a task is subscribing to).
#[derive(Default)]
struct Channel {
    subscribers: Vec<Weak<dyn Subscriber>>,
    /// Since when nobody watches it: it stays subscribed for [`LINGER`], so that a key taken
    /// again soon (the common loop of acquire and release) costs no `SUBSCRIBE` and
    /// `UNSUBSCRIBE` each time.
    idle_since: Option<Instant>,
}

/// How long a channel nobody watches stays subscribed.
const LINGER: Duration = Duration::from_secs(1);

/// The client's one pub/sub connection and its subscribers, by channel.
pub(crate) struct SignalHub {
    servers: HubServers,
    /// The server's `lock.lost-channel-prefix`, and the flush channel it makes.
    prefix: Vec<u8>,
    flush_channel: Vec<u8>,
    /// `CLIENT SETNAME` of the standalone connection.
    name: String,
    watched: Mutex<Watched>,
    /// Serializes (re)connecting, subscribing and unsubscribing.
    conn: tokio::sync::Mutex<Option<PubSub>>,
    /// Whether a task is on its way to unsubscribe from idle channels.
    sweeping: AtomicBool,
    /// Whether a task is connecting again and subscribing to every watched channel.
    resubscribing: AtomicBool,
}

/// Clears a flag of the hub when its task ends, however it ends (its runtime may shut down).
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

enum HubServers {
    /// The one server (a fixed address, or the master the Sentinels name): its RESP3 client
    /// (pushes arrive on the connection that subscribed).
    Single(Arc<Master>),
    Cluster(Vec<ConnectionInfo>),
}

/// A connection that receives pushes.
enum PubSub {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl PubSub {
    /// Subscribes to `channels`; a refusal of the ACL names the channel refused (one at a time
    /// when several were asked at once: the server's line names none on Redis 7.0, and it
    /// refuses the whole command).
    async fn subscribe_keys(&mut self, channels: &[Vec<u8>]) -> Result<(), LockError> {
        let command = match self {
            PubSub::Single(_) => "SUBSCRIBE",
            PubSub::Cluster(_) => "SSUBSCRIBE",
        };
        match self.subscribe_key(channels).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("NOPERM") => {
                if let [channel] = channels {
                    return Err(refusal(e, command, channel));
                }
                for channel in channels {
                    if let Err(e) = self.subscribe_key(std::slice::from_ref(channel)).await {
                        return Err(match e.code() {
                            Some("NOPERM") => refusal(e, command, channel),
                            _ => LockError::from(e),
                        });
                    }
                }
                Ok(())
            }
            Err(e) => Err(LockError::from(e)),
        }
    }

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

/// The refusal of `command` `channel` by the ACL (`NOPERM`), naming the channel.
fn refusal(e: redis::RedisError, command: &str, channel: &[u8]) -> LockError {
    match LockError::from(e) {
        LockError::NoPermission { message, .. } => LockError::NoPermission {
            command: command.to_string(),
            message,
            channel: Some(String::from_utf8_lossy(channel).into_owned()),
        },
        other => other,
    }
}

fn same(a: &Weak<dyn Subscriber>, b: &Weak<dyn Subscriber>) -> bool {
    std::ptr::addr_eq(a.as_ptr(), b.as_ptr())
}

impl SignalHub {
    /// Listens on the one server (its RESP3 client: pushes arrive on the connection that
    /// subscribed); through Sentinel, on the master the Sentinels name after each reconnect.
    pub(crate) fn single(master: Arc<Master>, prefix: &[u8], name: String) -> Arc<SignalHub> {
        SignalHub::new(HubServers::Single(master), prefix, name)
    }

    pub(crate) fn cluster(
        seeds: Vec<ConnectionInfo>,
        prefix: &[u8],
        name: String,
    ) -> Arc<SignalHub> {
        SignalHub::new(HubServers::Cluster(seeds), prefix, name)
    }

    fn new(servers: HubServers, prefix: &[u8], name: String) -> Arc<SignalHub> {
        Arc::new(SignalHub {
            servers,
            prefix: prefix.to_vec(),
            flush_channel: flush_channel(prefix),
            name,
            watched: Mutex::new(HashMap::new()),
            conn: tokio::sync::Mutex::new(None),
            sweeping: AtomicBool::new(false),
            resubscribing: AtomicBool::new(false),
        })
    }

    fn channel(&self, key: &[u8]) -> Vec<u8> {
        lost_signal_channel_with_prefix(&self.prefix, key)
    }

    /// Starts handing `subscriber` the messages of `keys`' channels (and of the flush channel).
    /// Returns the channels not subscribed to yet: [`SignalHub::subscribe`] them (a message
    /// published before the server confirms is missed; the watchdog still covers the hold).
    /// With no connection (it dropped, and is made again after pauses growing to 2 s while the
    /// server is down, as in a failover) that is every channel of `keys`, watched already or
    /// not: the subscription connects at once, and a second reader or permit of a key is not
    /// handed out on the confirmation a closed connection got.
    pub(crate) fn watch(
        &self,
        subscriber: &Weak<dyn Subscriber>,
        keys: &[Arc<[u8]>],
    ) -> Vec<Vec<u8>> {
        // Locked: a connection being made or used; subscribing again there costs nothing.
        let connected = matches!(self.conn.try_lock(), Ok(conn) if conn.is_some());
        let mut new = Vec::new();
        let mut watched = relock(&self.watched);
        for key in keys {
            let channel = self.channel(key);
            let entry = match watched.get_mut(&channel) {
                Some(entry) => {
                    if !connected {
                        new.push(channel.clone());
                    }
                    entry
                }
                None => {
                    new.push(channel.clone());
                    watched.entry(channel).or_default()
                }
            };
            entry.subscribers.retain(|w| w.strong_count() > 0);
            if !entry.subscribers.iter().any(|w| same(w, subscriber)) {
                entry.subscribers.push(subscriber.clone());
            }
            entry.idle_since = None;
        }
        new
    }

    /// Subscribes to `channels` (those [`SignalHub::watch`] returned); returns once the server
    /// confirmed. A refusal of the ACL ([`LockError::NoPermission`] naming the channel, the
    /// flush channel's on a new connection) is returned at once, and the refused channel
    /// forgotten: the next [`SignalHub::watch`] of it asks again.
    pub(crate) async fn subscribe(self: &Arc<Self>, channels: &[Vec<u8>]) -> Result<(), LockError> {
        let mut guard = self.conn.lock().await;
        let subscribed = match self.connection(&mut guard).await {
            Ok(conn) => conn.subscribe_keys(channels).await,
            Err(e) => Err(e),
        };
        if let Err(LockError::NoPermission {
            channel: Some(refused),
            ..
        }) = &subscribed
        {
            relock(&self.watched).remove(refused.as_bytes());
        }
        subscribed
    }

    /// Stops handing `subscriber` the messages of `keys`. A channel nobody else watches stays
    /// subscribed for a moment ([`LINGER`]), then a sweep unsubscribes from it.
    pub(crate) fn unwatch(self: &Arc<Self>, subscriber: &Weak<dyn Subscriber>, keys: &[Arc<[u8]>]) {
        let mut idle = false;
        {
            let mut watched = relock(&self.watched);
            for key in keys {
                let Some(entry) = watched.get_mut(&self.channel(key)) else {
                    continue;
                };
                entry
                    .subscribers
                    .retain(|w| w.strong_count() > 0 && !same(w, subscriber));
                if entry.subscribers.is_empty() && entry.idle_since.is_none() {
                    entry.idle_since = Some(Instant::now());
                    idle = true;
                }
            }
        }
        if idle && !self.sweeping.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(sweep(Arc::downgrade(self)));
                }
                Err(_) => self.sweeping.store(false, Ordering::Release),
            }
        }
    }

    /// Unsubscribes from the channels idle for [`LINGER`]; returns whether others are still
    /// idle (the sweep goes on).
    async fn sweep_once(&self) -> bool {
        let now = Instant::now();
        let mut done = Vec::new();
        let mut waiting = false;
        {
            let mut watched = relock(&self.watched);
            watched.retain(|channel, entry| {
                entry.subscribers.retain(|w| w.strong_count() > 0);
                if entry.subscribers.is_empty() && entry.idle_since.is_none() {
                    // Its subscribers went away without a word (dropped): idle from now.
                    entry.idle_since = Some(now);
                }
                match entry.idle_since {
                    Some(since) if now.duration_since(since) >= LINGER => {
                        done.push(channel.clone());
                        false
                    }
                    Some(_) => {
                        waiting = true;
                        true
                    }
                    None => true,
                }
            });
        }
        if !done.is_empty() {
            let mut guard = self.conn.lock().await;
            if let Some(conn) = guard.as_mut() {
                for channel in &done {
                    // A failure leaves a subscription nobody reads: harmless, and a reconnect
                    // drops it.
                    let _ = conn.unsubscribe_key(channel).await;
                }
            }
        }
        waiting
    }

    /// Subscribes to `key`'s channel again: its slot moved to another node, where the server
    /// now publishes it (in a cluster, the `SSUBSCRIBE` goes to the slot's new master; one sent
    /// while the slot was still migrating lands on the old node, which drops it with a
    /// `sunsubscribe` once the slot is gone, and that is answered with a new `SSUBSCRIBE`).
    pub(crate) async fn resubscribe(self: &Arc<Self>, key: &[u8]) -> Result<(), LockError> {
        self.resubscribe_channel(self.channel(key)).await
    }

    async fn resubscribe_channel(self: &Arc<Self>, channel: Vec<u8>) -> Result<(), LockError> {
        if !self.is_watched(&channel) {
            return Ok(());
        }
        let mut guard = self.conn.lock().await;
        let conn = self.connection(&mut guard).await?;
        conn.subscribe_keys(&[channel]).await
    }

    /// Whether someone watches `channel` (not merely lingering).
    fn is_watched(&self, channel: &[u8]) -> bool {
        relock(&self.watched)
            .get(channel)
            .is_some_and(|entry| entry.idle_since.is_none())
    }

    /// The pub/sub connection, connecting (subscribed to the flush channel, its reader started)
    /// if there is none. The flush channel refused is [`LockError::NoPermission`] naming it.
    async fn connection<'a>(
        self: &Arc<Self>,
        slot: &'a mut Option<PubSub>,
    ) -> Result<&'a mut PubSub, LockError> {
        if slot.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            let mut conn = match &self.servers {
                HubServers::Single(master) => {
                    let config = AsyncConnectionConfig::new().set_push_sender(tx);
                    let node = master.node().await?;
                    let mut conn = match node
                        .resp3
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                    {
                        Ok(conn) => conn,
                        Err(e) => {
                            master.forget(&node);
                            return Err(LockError::from(e));
                        }
                    };
                    if let Some(changes) = master.changes() {
                        // A failover: listen on the new master (the old one, paused and back,
                        // would keep this connection open until the Sentinels demote it).
                        let hub = Arc::downgrade(self);
                        tokio::spawn(async move {
                            crate::master::changed(Some(changes)).await;
                            if let Some(hub) = hub.upgrade() {
                                hub.start_resubscribe();
                            }
                        });
                    }
                    // Refused (an ACL without CLIENT): the connection works unnamed.
                    let _ = setname(&self.name).query_async::<Value>(&mut conn).await;
                    PubSub::Single(conn)
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
            conn.subscribe_flush(&self.flush_channel)
                .await
                .map_err(|e| match e.code() {
                    Some("NOPERM") => refusal(e, "SUBSCRIBE", &self.flush_channel),
                    _ => LockError::from(e),
                })?;
            tokio::spawn(read_pushes(Arc::downgrade(self), rx));
            *slot = Some(conn);
        }
        slot.as_mut().ok_or_else(|| {
            LockError::Connection(redis::RedisError::from((
                redis::ErrorKind::Client,
                "no connection",
            )))
        })
    }

    /// The live subscribers of `channel` (of every channel, each once, for the flush channel).
    fn subscribers(&self, channel: &[u8]) -> Vec<Arc<dyn Subscriber>> {
        let watched = relock(&self.watched);
        if channel == self.flush_channel.as_slice() {
            let mut all: Vec<Arc<dyn Subscriber>> = Vec::new();
            for w in watched.values().flat_map(|entry| &entry.subscribers) {
                if let Some(s) = w.upgrade() {
                    if !all
                        .iter()
                        .any(|a| std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(&s)))
                    {
                        all.push(s);
                    }
                }
            }
            return all;
        }
        watched
            .get(channel)
            .map(|entry| entry.subscribers.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default()
    }

    fn dispatch(&self, channel: &[u8], payload: &[u8]) {
        let Some(signal) = LostSignal::parse(payload) else {
            return;
        };
        let flush = matches!(signal, LostSignal::Flushed { .. });
        if flush != (channel == self.flush_channel.as_slice()) {
            // A flush message on a key's channel, or a key's message on the flush channel.
            return;
        }
        for subscriber in self.subscribers(channel) {
            subscriber.hear(&signal);
        }
    }

    /// [`SignalHub::resubscribe_channel`] on a task of its own (a plain function, so that the
    /// reader that calls it and the connection it may make are not one recursive future type).
    fn start_resubscribe_channel(self: &Arc<Self>, channel: Vec<u8>) {
        let hub = self.clone();
        tokio::spawn(async move {
            // A failure leaves the watchdog alone to notice a loss.
            let _ = hub.resubscribe_channel(channel).await;
        });
    }

    fn start_resubscribe(self: &Arc<Self>) {
        if self.resubscribing.swap(true, Ordering::AcqRel) {
            return;
        }
        let hub = self.clone();
        tokio::spawn(async move {
            let _running = Running(&hub.resubscribing);
            hub.resubscribe_all().await
        });
    }

    /// After the connection dropped: connect again and subscribe to every watched channel.
    /// Messages published in between are lost (at-most-once); the watchdogs cover them.
    async fn resubscribe_all(self: &Arc<Self>) {
        let mut delay = Duration::from_millis(50);
        loop {
            {
                let mut guard = self.conn.lock().await;
                *guard = None;
                let channels: Vec<Vec<u8>> = relock(&self.watched).keys().cloned().collect();
                if channels.is_empty() {
                    return;
                }
                let subscribed = match self.connection(&mut guard).await {
                    Ok(conn) => conn.subscribe_keys(&channels).await,
                    Err(e) => Err(e),
                };
                match subscribed {
                    Ok(()) => return,
                    // The ACL changed under the holds (nobody waits for this to tell them): the
                    // watchdog covers them, and the next acquire meets the refusal itself.
                    Err(LockError::NoPermission { .. }) => return,
                    Err(_) => {}
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

/// Unsubscribes from idle channels once they have lingered, until none is idle.
async fn sweep(hub: Weak<SignalHub>) {
    // Cleared however the task ends (its runtime may shut down while it sleeps).
    let _running = Sweeping(hub.clone());
    loop {
        tokio::time::sleep(LINGER).await;
        let Some(hub) = hub.upgrade() else { return };
        if !hub.sweep_once().await {
            return;
        }
    }
}

/// Clears the hub's `sweeping` flag when the sweep ends, then starts another if a channel went
/// idle in between (its `unwatch` found the flag set and started none).
struct Sweeping(Weak<SignalHub>);

impl Drop for Sweeping {
    fn drop(&mut self) {
        let Some(hub) = self.0.upgrade() else { return };
        hub.sweeping.store(false, Ordering::Release);
        let idle = relock(&hub.watched)
            .values()
            .any(|e| e.idle_since.is_some());
        if idle && !hub.sweeping.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(sweep(self.0.clone()));
                }
                Err(_) => hub.sweeping.store(false, Ordering::Release),
            }
        }
    }
}

async fn read_pushes(hub: Weak<SignalHub>, mut rx: mpsc::UnboundedReceiver<redis::PushInfo>) {
    while let Some(push) = rx.recv().await {
        let Some(hub) = hub.upgrade() else { return };
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let [Value::BulkString(channel), Value::BulkString(payload), ..] =
                    push.data.as_slice()
                {
                    hub.dispatch(channel, payload);
                }
            }
            // A node dropped a shard channel (its slot left the node): subscribe again where the
            // slot is now, if it is still watched. (The library's own SUNSUBSCRIBEs are of
            // channels it no longer watches.)
            PushKind::SUnsubscribe => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    if hub.is_watched(channel) {
                        hub.start_resubscribe_channel(channel.clone());
                    }
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
