//! Leader election on a lock key: `LOCK.CAMPAIGN`, `LOCK.PROCLAIM`, `LOCK.LEADER`, and the
//! key's leader channel.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::{AsyncConnectionConfig, ProtocolVersion, PushKind, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::ClientInner;
use crate::error::LockError;
use crate::guard::{LockGuard, Release};
use crate::lock::{Lock, Wait};
use crate::lost::{LostReason, LostWatch};
use crate::servers::Servers;

/// The server's default `lock.leader-channel-prefix`.
pub const DEFAULT_LEADER_CHANNEL_PREFIX: &str = "lock.leader";

/// The channel an election key's leaders are announced on: `lock.leader:{KEY}`, or
/// `lock.leader:KEY` when KEY contains `{` (named as the lost-hold channel).
pub fn leader_channel(key: &[u8]) -> Vec<u8> {
    crate::signal::lost_signal_channel_with_prefix(DEFAULT_LEADER_CHANNEL_PREFIX.as_bytes(), key)
}

/// Who leads an election: `LOCK.LEADER`'s reply, and what an [`Observer`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leading candidate's name.
    pub candidate: Vec<u8>,
    /// Its epoch: the fencing token of its hold, above every earlier leader's.
    pub epoch: u64,
    /// The value it proclaimed in this epoch, if any.
    pub value: Option<Vec<u8>>,
}

/// A handle on one election key, for one candidate
/// ([`LockClient::election`](crate::LockClient::election)): campaign for it, read its leader,
/// observe its leaders.
///
/// - [`Election::campaign`] waits in the server's FIFO queue (`LOCK.CAMPAIGN ... WAIT`, on a
///   connection of its own) until this candidate leads, and returns its [`Leadership`]. The
///   leadership is a hold like a [`Lock`](crate::Lock)'s: the watchdog renews it every
///   `lease / 3`, and it is reported lost as any hold is.
/// - `EPHEMERAL` by default: the leadership is bound to a connection it owns, so a crashed or
///   killed process stops leading at once, not at its lease end
///   ([`Election::not_ephemeral`] makes it a plain hold).
/// - [`Election::leader`] reads who leads now; [`Election::observe`] follows every change.
///
/// The candidate's name is the handle's owner string (`<client id>:<n>`): two handles are two
/// candidates. Campaigning again through a handle that leads returns the same leadership (the
/// epoch is kept).
///
/// ```no_run
/// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
/// let election = client.election("billing-scheduler");
/// let mut leadership = election.campaign_with_value("10.0.0.1:80").await?; // waits
/// let epoch = leadership.epoch(); // the fence for every write the leader makes
/// tokio::select! {
///     reason = leadership.lost() => eprintln!("deposed ({reason}): stop acting as leader"),
///     _ = lead(epoch) => {}
/// }
/// leadership.resign().await?; // the next candidate leads at once
/// # Ok(()) }
/// # async fn lead(_epoch: u64) {}
/// ```
#[derive(Clone)]
pub struct Election {
    lock: Lock,
}

impl Election {
    pub(crate) fn new(lock: Lock) -> Election {
        Election {
            lock: lock.ephemeral(),
        }
    }

    /// The lease of the leadership's hold (default [`DEFAULT_LEASE`](crate::DEFAULT_LEASE)),
    /// renewed by the watchdog every `lease / 3`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lock = self.lock.lease(lease);
        self
    }

    /// How long [`Election::campaign`] waits (default: until elected); then
    /// [`LockError::Timeout`].
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.lock = self.lock.wait_timeout(timeout);
        self
    }

    /// The leadership is a plain hold, renewed by the watchdog on the shared connection, which
    /// outlives a broken connection (and a dead process) until its lease ends.
    pub fn not_ephemeral(mut self) -> Self {
        self.lock = self.lock.without_ephemeral();
        self
    }

    /// The election key.
    pub fn key(&self) -> &[u8] {
        self.lock.key()
    }

    /// The name this handle campaigns under (`LOCK.LEADER` shows it while it leads).
    pub fn candidate(&self) -> &str {
        self.lock.owner()
    }

    /// Waits until this candidate leads and returns its leadership (`LOCK.CAMPAIGN`).
    pub async fn campaign(&self) -> Result<Leadership, LockError> {
        self.campaign_inner(None).await
    }

    /// [`Election::campaign`], proclaiming `value` with the election (`VALUE`): observers see
    /// the new leader and its value together. Campaigning again while leading proclaims it.
    pub async fn campaign_with_value(
        &self,
        value: impl AsRef<[u8]>,
    ) -> Result<Leadership, LockError> {
        self.campaign_inner(Some(value.as_ref())).await
    }

    /// One attempt, no wait: `Ok(None)` when another candidate leads (or others wait).
    pub async fn try_campaign(&self) -> Result<Option<Leadership>, LockError> {
        match self
            .lock
            .acquire_waiting(Wait::Timeout(Duration::ZERO), None)
            .await
        {
            Ok(guard) => Ok(Some(Leadership { guard })),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn campaign_inner(&self, value: Option<&[u8]>) -> Result<Leadership, LockError> {
        let guard = self.lock.acquire_waiting(self.lock.wait(), value).await?;
        Ok(Leadership { guard })
    }

    /// Who leads now (`LOCK.LEADER`), or `None` when nobody does.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        read_leader(self.lock.client(), self.key()).await
    }

    /// Follows the key's leaders: a [`Stream`](futures_core::Stream) of [`Leader`] in the order
    /// they led (see [`Observer`]). Call it inside a tokio runtime.
    pub fn observe(&self) -> Observer {
        Observer::start(self.lock.client().clone(), self.key().into())
    }
}

/// This candidate leads: its [`epoch`](Leadership::epoch) (the fencing token of its hold),
/// [`lost`](Leadership::lost), [`proclaim`](Leadership::proclaim),
/// [`resign`](Leadership::resign). Dropping it resigns (in the background).
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The epoch: a fencing token, above every earlier leader's. Pass it with every write the
    /// leader makes, and have the resource refuse an epoch below the highest it has seen.
    pub fn epoch(&self) -> u64 {
        self.guard.token()
    }

    /// The election key.
    pub fn key(&self) -> &[u8] {
        self.guard.key()
    }

    /// The candidate's name.
    pub fn candidate(&self) -> &str {
        self.guard.owner()
    }

    /// `Some(reason)` once the leadership is known lost (deposed).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.guard.lost_reason()
    }

    /// Resolves with the reason when the leadership is lost: its lease ended, its connection
    /// closed, it was forced out, a renewal or [`Leadership::proclaim`] found it gone. Never
    /// after a resignation.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.guard.lost()
    }

    /// A [`LostWatch`] of this leadership.
    pub fn watch(&self) -> LostWatch {
        self.guard.watch()
    }

    /// Publishes `value` (at most 4096 bytes) for observers (`LOCK.PROCLAIM`): `true`, or
    /// `false` when this leadership is over — resigned, lost, past its local deadline (then
    /// reported lost, [`LostReason::Unreachable`]), or refused by the server because the
    /// candidate no longer leads in this epoch (then reported lost, [`LostReason::HoldGone`]).
    /// A deposed leader's proclamation is never published.
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<bool, LockError> {
        proclaim(&self.guard, value.as_ref()).await
    }

    /// Stops leading (`LOCK.RELEASE`): the next candidate in the queue is elected at once. As
    /// [`LockGuard::release`]: [`LockError::NotHeld`] if the leadership was lost before.
    pub async fn resign(&mut self) -> Result<Release, LockError> {
        self.guard.release().await
    }

    pub(crate) fn into_inner(self) -> LockGuard {
        self.guard
    }
}

/// [`Leadership::proclaim`] of the leadership `guard` holds (the blocking API's too).
pub(crate) async fn proclaim(guard: &LockGuard, value: &[u8]) -> Result<bool, LockError> {
    {
        let core = guard.core();
        if guard.is_released() || !core.status.is_active() {
            return Ok(false);
        }
        if Instant::now() >= core.deadline() {
            core.lose(LostReason::Unreachable);
            return Ok(false);
        }
        let mut cmd = redis::cmd("LOCK.PROCLAIM");
        cmd.arg(core.key())
            .arg(core.owner.as_bytes())
            .arg(core.token())
            .arg(value);
        match core.query(&cmd).await {
            Ok(Value::Int(1)) => Ok(true),
            Ok(Value::Int(0)) => {
                core.lose(LostReason::HoldGone);
                Ok(false)
            }
            Ok(other) => Err(LockError::UnexpectedReply(format!(
                "LOCK.PROCLAIM answered {other:?}"
            ))),
            Err(e) if e.is_retryable() && core.conn.is_own() => {
                // The server ends an EPHEMERAL hold with its connection.
                core.lose(LostReason::ConnectionClosed);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// `LOCK.LEADER key`.
async fn read_leader(client: &ClientInner, key: &[u8]) -> Result<Option<Leader>, LockError> {
    let mut cmd = redis::cmd("LOCK.LEADER");
    cmd.arg(key);
    parse_leader(client.commands.query(&cmd).await?)
}

/// A `LOCK.LEADER` reply: `[leader, epoch, value|nil]`, or nil when nobody leads.
fn parse_leader(reply: Value) -> Result<Option<Leader>, LockError> {
    match reply {
        Value::Nil => Ok(None),
        Value::Array(items) => match items.as_slice() {
            [Value::BulkString(candidate), Value::Int(epoch), value] if *epoch > 0 => {
                let value = match value {
                    Value::Nil => None,
                    Value::BulkString(v) => Some(v.clone()),
                    other => {
                        return Err(LockError::UnexpectedReply(format!(
                            "LOCK.LEADER's value is {other:?}"
                        )))
                    }
                };
                Ok(Some(Leader {
                    candidate: candidate.clone(),
                    epoch: u64::try_from(*epoch).unwrap_or(0),
                    value,
                }))
            }
            _ => Err(LockError::UnexpectedReply(format!(
                "LOCK.LEADER answered {items:?}"
            ))),
        },
        other => Err(LockError::UnexpectedReply(format!(
            "LOCK.LEADER answered {other:?}"
        ))),
    }
}

/// What an observer yields, from the leader read and the leader channel's messages (the same
/// rules as the Python library's `LeaderFeed`).
///
/// The observer subscribes first, then reads `LOCK.LEADER` ([`Feed::read`]), then hands every
/// message to [`Feed::message`]. Epochs only rise, so nothing of an epoch below the last one
/// yielded is yielded again; within one epoch a proclamation is yielded when its value differs
/// from the last yielded. A proclamation of an epoch whose election was missed cannot be placed:
/// `stale` is set, and the observer reads `LOCK.LEADER` again.
#[derive(Debug, Default)]
pub(crate) struct Feed {
    last: Option<Leader>,
    stale: bool,
}

impl Feed {
    fn offer(&mut self, leader: Leader) -> Option<Leader> {
        if let Some(last) = &self.last {
            if leader.epoch < last.epoch || (leader.epoch == last.epoch && leader == *last) {
                return None;
            }
            if leader.epoch == last.epoch && leader.value.is_none() {
                // An election message of the epoch already seen (its value is known).
                return None;
            }
        }
        self.last = Some(leader.clone());
        Some(leader)
    }

    pub(crate) fn read(&mut self, leader: Option<Leader>) -> Option<Leader> {
        self.stale = false;
        leader.and_then(|l| self.offer(l))
    }

    pub(crate) fn message(&mut self, payload: &[u8]) -> Option<Leader> {
        let mut parts = payload.splitn(3, |b| *b == b' ');
        let word = parts.next()?;
        let epoch: u64 = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let tail = parts.next().unwrap_or_default();
        match word {
            b"elected" if !tail.is_empty() => self.offer(Leader {
                candidate: tail.to_vec(),
                epoch,
                value: None,
            }),
            b"proclaimed" => {
                let last = match &self.last {
                    Some(last) if epoch <= last.epoch => last,
                    _ => {
                        // Whose value is it? LOCK.LEADER says.
                        self.stale = true;
                        return None;
                    }
                };
                if epoch < last.epoch {
                    return None;
                }
                let leader = Leader {
                    candidate: last.candidate.clone(),
                    epoch,
                    value: Some(tail.to_vec()),
                };
                self.offer(leader)
            }
            _ => None,
        }
    }
}

/// The leaders of one election key, in the order they led: a
/// [`Stream`](futures_core::Stream) of [`Leader`] ([`Election::observe`]), also read with
/// [`Observer::next`].
///
/// It subscribes to the key's leader channel on a connection of its own (`SUBSCRIBE`, or
/// `SSUBSCRIBE` on the key's master in a cluster), then reads `LOCK.LEADER` and yields the
/// current leader, then a leader per message: each newly elected candidate (`value` `None`), and
/// each value it proclaims. It never yields an epoch below the last it yielded, nor the same
/// leader twice in a row. When the connection breaks it connects again, subscribes, and reads
/// `LOCK.LEADER` again (pub/sub is at most once: what was published meanwhile is gone, the read
/// tells the current leader). The end of a leadership is not announced: the next election is.
///
/// The work runs on a task of the runtime `observe` was called on; dropping the observer ends
/// it and closes its connection. The stream never ends by itself.
///
/// ```no_run
/// # async fn demo(client: redis_lock_client::LockClient) {
/// let mut leaders = client.election("billing-scheduler").observe();
/// while let Some(leader) = leaders.next().await {
///     println!("epoch {}: {:?} leads, value {:?}", leader.epoch, leader.candidate, leader.value);
/// }
/// # }
/// ```
pub struct Observer {
    rx: mpsc::UnboundedReceiver<Leader>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Observer {
    fn start(client: Arc<ClientInner>, key: Arc<[u8]>) -> Observer {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(follow(client, key, tx));
        Observer { rx, task }
    }

    /// The next leader (waits for it). `None` only once the observer's task has ended (its
    /// runtime shut down).
    pub async fn next(&mut self) -> Option<Leader> {
        self.rx.recv().await
    }
}

impl futures_core::Stream for Observer {
    type Item = Leader;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Leader>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A subscription to one leader channel: kept only to keep its connection open.
#[allow(dead_code)]
enum Subscription {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

/// Subscribes (on the key's node) with the pushes sent to `pushes`.
async fn subscribe(
    client: &ClientInner,
    channel: &[u8],
    pushes: mpsc::UnboundedSender<redis::PushInfo>,
) -> Result<Subscription, LockError> {
    match &client.servers {
        Servers::Single { resp3, .. } => {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(client.command_timeout))
                .set_response_timeout(Some(client.command_timeout))
                .set_push_sender(pushes);
            let mut conn = resp3
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(LockError::Connection)?;
            conn.subscribe(channel).await?;
            Ok(Subscription::Single(conn))
        }
        Servers::Cluster { info, .. } => {
            // The cluster connection sends SSUBSCRIBE to the channel's node (the key's master)
            // and subscribes again after a reconnect or a slot move.
            let mut conn = ClusterClientBuilder::new(vec![info.clone()])
                .use_protocol(ProtocolVersion::RESP3)
                .connection_timeout(client.command_timeout)
                .response_timeout(client.command_timeout)
                .push_sender(pushes)
                .build()
                .map_err(LockError::Connection)?
                .get_async_connection()
                .await
                .map_err(LockError::Connection)?;
            conn.ssubscribe(channel).await?;
            Ok(Subscription::Cluster(conn))
        }
    }
}

/// The observer's task: subscribe, read, follow; again after the connection breaks.
async fn follow(client: Arc<ClientInner>, key: Arc<[u8]>, out: mpsc::UnboundedSender<Leader>) {
    let channel = leader_channel(&key);
    let mut feed = Feed::default();
    let mut delay = Duration::from_millis(50);
    loop {
        let (tx, mut pushes) = mpsc::unbounded_channel();
        let subscribed = async {
            let sub = subscribe(&client, &channel, tx).await?;
            let leader = read_leader(&client, &key).await?;
            Ok::<_, LockError>((sub, leader))
        };
        let _sub = match subscribed.await {
            Ok((sub, leader)) => {
                delay = Duration::from_millis(50);
                if let Some(l) = feed.read(leader) {
                    if out.send(l).is_err() {
                        return;
                    }
                }
                sub
            }
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        // Messages until the connection breaks.
        loop {
            let Some(push) = pushes.recv().await else {
                break;
            };
            let mut ready = VecDeque::new();
            match push.kind {
                PushKind::Disconnection => break,
                PushKind::Message | PushKind::SMessage => {
                    if let [Value::BulkString(ch), Value::BulkString(payload), ..] =
                        push.data.as_slice()
                    {
                        if *ch == channel {
                            ready.extend(feed.message(payload));
                        }
                    }
                }
                _ => {}
            }
            if feed.stale {
                // The next message or reconnection tells, if this read fails.
                if let Ok(leader) = read_leader(&client, &key).await {
                    ready.extend(feed.read(leader));
                }
            }
            for l in ready {
                if out.send(l).is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(candidate: &str, epoch: u64, value: Option<&str>) -> Leader {
        Leader {
            candidate: candidate.as_bytes().to_vec(),
            epoch,
            value: value.map(|v| v.as_bytes().to_vec()),
        }
    }

    #[test]
    fn the_feed_yields_each_change_once_in_epoch_order() {
        let mut feed = Feed::default();
        assert_eq!(
            feed.read(Some(leader("a", 5, Some("x")))),
            Some(leader("a", 5, Some("x")))
        );
        // A message published before the read: older, or the same.
        assert_eq!(feed.message(b"elected 5 a"), None);
        assert_eq!(feed.message(b"proclaimed 5 x"), None);
        assert_eq!(feed.message(b"elected 4 z"), None);
        assert_eq!(
            feed.message(b"proclaimed 5 y y"),
            Some(leader("a", 5, Some("y y")))
        );
        assert_eq!(feed.message(b"elected 9 b"), Some(leader("b", 9, None)));
        assert_eq!(
            feed.message(b"proclaimed 9 v"),
            Some(leader("b", 9, Some("v")))
        );
        // A proclamation of a missed election: read LOCK.LEADER again.
        assert_eq!(feed.message(b"proclaimed 12 w"), None);
        assert!(feed.stale);
        assert_eq!(
            feed.read(Some(leader("c", 12, Some("w")))),
            Some(leader("c", 12, Some("w")))
        );
        assert!(!feed.stale);
        for junk in [&b"elected x c"[..], b"elected 13", b"resigned 13 c", b""] {
            assert_eq!(feed.message(junk), None);
        }
    }

    #[test]
    fn leader_replies_parse() {
        assert_eq!(parse_leader(Value::Nil).unwrap(), None);
        let reply = Value::Array(vec![
            Value::BulkString(b"a".to_vec()),
            Value::Int(7),
            Value::Nil,
        ]);
        assert_eq!(parse_leader(reply).unwrap(), Some(leader("a", 7, None)));
        assert!(parse_leader(Value::Int(1)).is_err());
    }
}
