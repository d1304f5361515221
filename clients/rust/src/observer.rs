//! Following an election's leaders: `LOCK.LEADER` and the key's leader channel.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::{AsyncConnectionConfig, ProtocolVersion, PushKind, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::channel::leader_channel;
use crate::conn::Commands;
use crate::context::Context;
use crate::error::LockError;
use crate::message::LeaderMessage;
use crate::naming::setname;
use crate::servers::Servers;

/// Who leads an election: `LOCK.LEADER`'s reply, and what an [`Observer`] yields.
///
/// ```
/// use redis_lock_client::Leader;
///
/// let leader = Leader {
///     candidate: b"3f2a:1".to_vec(),
///     epoch: 7,
///     value: Some(b"10.0.0.1:80".to_vec()),
/// };
/// assert_eq!(leader.to_string(), "epoch 7: 3f2a:1, value 10.0.0.1:80");
/// assert_eq!(leader.candidate_str(), "3f2a:1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leading candidate's name (binary-safe; [`Leader::candidate_str`] reads it as text).
    pub candidate: Vec<u8>,
    /// Its epoch: the fencing token of its hold, above every earlier leader's.
    pub epoch: u64,
    /// The value it proclaimed in this epoch, if any ([`Leader::value_str`] reads it as text).
    pub value: Option<Vec<u8>>,
}

impl Leader {
    /// The candidate's name as text (invalid UTF-8 replaced by U+FFFD).
    pub fn candidate_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.candidate)
    }

    /// The proclaimed value as text (invalid UTF-8 replaced by U+FFFD), if any.
    pub fn value_str(&self) -> Option<std::borrow::Cow<'_, str>> {
        self.value.as_deref().map(String::from_utf8_lossy)
    }
}

impl std::fmt::Display for Leader {
    /// `epoch 7: <candidate>`, and `, value <value>` when it proclaimed one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {}: {}", self.epoch, self.candidate_str())?;
        if let Some(value) = self.value_str() {
            write!(f, ", value {value}")?;
        }
        Ok(())
    }
}

/// `LOCK.LEADER key`.
pub(crate) async fn read_leader(
    commands: &Commands,
    key: &[u8],
) -> Result<Option<Leader>, LockError> {
    let mut cmd = redis::cmd("LOCK.LEADER");
    cmd.arg(key);
    parse_leader(commands.query_routed(&cmd, Some(key)).await?)
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
/// message to [`Feed::message`], which acts only on those naming its own database and key (keys
/// `k` and `{k}`, and one key name in two databases, share a channel). Among those, epochs only
/// rise, so nothing of an epoch below the last one yielded is yielded again; within one epoch a
/// proclamation is yielded when its value differs from the last yielded. A proclamation of an
/// epoch whose election was missed cannot be placed: `stale` is set, and the observer reads
/// `LOCK.LEADER` again.
#[derive(Debug)]
pub(crate) struct Feed {
    db: i64,
    key: Arc<[u8]>,
    last: Option<Leader>,
    stale: bool,
}

impl Feed {
    pub(crate) fn new(db: i64, key: Arc<[u8]>) -> Feed {
        Feed {
            db,
            key,
            last: None,
            stale: false,
        }
    }

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
        let message = LeaderMessage::parse(payload)?;
        if !message.is_about(self.db, &self.key) {
            return None;
        }
        match message {
            LeaderMessage::Elected {
                epoch, candidate, ..
            } => self.offer(Leader {
                candidate,
                epoch,
                value: None,
            }),
            LeaderMessage::Proclaimed { epoch, value, .. } => {
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
                    value: Some(value),
                };
                self.offer(leader)
            }
        }
    }
}

/// The leaders of one election key, in the order they led: a
/// [`Stream`](futures_core::Stream) of [`Leader`] ([`Election::observe`](crate::Election::observe)), also read with
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
///     // "epoch 7: 3f2a…:1, value 10.0.0.1:80"
///     println!("{leader}");
///     // or the fields, as text: leader.candidate_str(), leader.value_str()
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
    pub(crate) fn start(ctx: Arc<Context>, key: Arc<[u8]>) -> Observer {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(follow(ctx, key, tx));
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

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Leader>> {
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
    ctx: &Context,
    channel: &[u8],
    pushes: mpsc::UnboundedSender<redis::PushInfo>,
) -> Result<Subscription, LockError> {
    match &ctx.servers {
        Servers::Single(master) => {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(ctx.command_timeout))
                .set_response_timeout(Some(ctx.command_timeout))
                .set_push_sender(pushes);
            // Through Sentinel, the master it names now (again after each reconnect).
            let node = master.node().await?;
            let mut conn = match node
                .resp3
                .get_multiplexed_async_connection_with_config(&config)
                .await
            {
                Ok(conn) => conn,
                Err(e) => {
                    master.forget(&node);
                    return Err(LockError::Connection(e));
                }
            };
            // Refused (an ACL without CLIENT): the connection works unnamed.
            let _ = setname(&ctx.name).query_async::<Value>(&mut conn).await;
            conn.subscribe(channel).await?;
            Ok(Subscription::Single(conn))
        }
        Servers::Cluster { info, .. } => {
            // The cluster connection sends SSUBSCRIBE to the channel's node (the key's master)
            // and subscribes again after a reconnect or a slot move.
            let mut conn = ClusterClientBuilder::new(vec![info.clone()])
                .use_protocol(ProtocolVersion::RESP3)
                .connection_timeout(ctx.command_timeout)
                .response_timeout(ctx.command_timeout)
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
async fn follow(ctx: Arc<Context>, key: Arc<[u8]>, out: mpsc::UnboundedSender<Leader>) {
    let channel = leader_channel(&key);
    let mut feed = Feed::new(ctx.db, key.clone());
    let mut delay = Duration::from_millis(50);
    loop {
        let (tx, mut pushes) = mpsc::unbounded_channel();
        let subscribed = async {
            let sub = subscribe(&ctx, &channel, tx).await?;
            let leader = read_leader(&ctx.commands, &key).await?;
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
        // Messages until the connection breaks, or (through Sentinel) the master changes: then
        // it subscribes and reads again on the new master.
        let mut changed = std::pin::pin!(crate::master::changed(ctx.servers.changes()));
        loop {
            let push = tokio::select! {
                push = pushes.recv() => push,
                _ = &mut changed => None,
            };
            let Some(push) = push else {
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
                if let Ok(leader) = read_leader(&ctx.commands, &key).await {
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
        let mut feed = Feed::new(0, Arc::from(&b"svc"[..]));
        assert_eq!(
            feed.read(Some(leader("a", 5, Some("x")))),
            Some(leader("a", 5, Some("x")))
        );
        // A message published before the read: older, or the same.
        assert_eq!(feed.message(b"elected 0 5 3 svc a"), None);
        assert_eq!(feed.message(b"proclaimed 0 5 3 svc x"), None);
        assert_eq!(feed.message(b"elected 0 4 3 svc z"), None);
        assert_eq!(
            feed.message(b"proclaimed 0 5 3 svc y y"),
            Some(leader("a", 5, Some("y y")))
        );
        assert_eq!(
            feed.message(b"elected 0 9 3 svc b"),
            Some(leader("b", 9, None))
        );
        assert_eq!(
            feed.message(b"proclaimed 0 9 3 svc v"),
            Some(leader("b", 9, Some("v")))
        );
        // A proclamation of a missed election: read LOCK.LEADER again.
        assert_eq!(feed.message(b"proclaimed 0 12 3 svc w"), None);
        assert!(feed.stale);
        assert_eq!(
            feed.read(Some(leader("c", 12, Some("w")))),
            Some(leader("c", 12, Some("w")))
        );
        assert!(!feed.stale);
        for junk in [
            &b"elected 0 x 3 svc c"[..],
            b"elected 0 13 3 svc",
            b"resigned 0 13 3 svc c",
            b"elected 13 c",
            b"",
        ] {
            assert_eq!(feed.message(junk), None);
        }
    }

    #[test]
    fn the_feed_ignores_elections_of_other_databases_and_keys_on_its_channel() {
        // `svc` and `{svc}` share a channel, as `svc` in db 0 and db 1 do; their epochs come
        // from one counter and interleave.
        let mut feed = Feed::new(0, Arc::from(&b"svc"[..]));
        assert_eq!(
            feed.message(b"elected 0 5 3 svc mine"),
            Some(leader("mine", 5, None))
        );
        for foreign in [
            &b"elected 1 6 3 svc theirs"[..],
            b"elected 0 7 5 {svc} theirs",
            b"proclaimed 1 6 3 svc v",
            b"proclaimed 0 7 5 {svc} v",
        ] {
            assert_eq!(
                feed.message(foreign),
                None,
                "{}",
                String::from_utf8_lossy(foreign)
            );
        }
        assert!(!feed.stale, "a foreign proclamation is no missed election");
        // Our leader's later proclamation is not dropped as older than a foreign epoch.
        assert_eq!(
            feed.message(b"proclaimed 0 5 3 svc here"),
            Some(leader("mine", 5, Some("here")))
        );
    }

    #[test]
    fn a_leader_prints_as_text() {
        assert_eq!(
            leader("node-1", 7, Some("10.0.0.1:80")).to_string(),
            "epoch 7: node-1, value 10.0.0.1:80"
        );
        assert_eq!(leader("node-1", 7, None).to_string(), "epoch 7: node-1");
        assert_eq!(leader("n", 1, Some("v")).value_str().as_deref(), Some("v"));
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
