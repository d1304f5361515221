//! Following an election's leaders: `LOCK.LEADER` and the key's leader channel.

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

/// What an observer yields: only what `LOCK.LEADER` answers (the same rules as the Python
/// library's `LeaderFeed`).
///
/// The observer subscribes first, then reads `LOCK.LEADER` ([`Feed::read`]). A message of the
/// leader channel is a hint, never evidence: anyone allowed to publish on the channel can send
/// one, with any epoch. A message that names the observer's own database and key (keys `k` and
/// `{k}`, and one key name in two databases, share a channel) only asks for another read
/// ([`Feed::message`]); what it claims is never yielded and never kept. Among the reads, epochs
/// only rise: a read of an epoch below the last one yielded (a server behind the others) is not
/// yielded, nor the same leader twice in a row.
#[derive(Debug)]
pub(crate) struct Feed {
    db: i64,
    key: Arc<[u8]>,
    last: Option<Leader>,
}

impl Feed {
    pub(crate) fn new(db: i64, key: Arc<[u8]>) -> Feed {
        Feed {
            db,
            key,
            last: None,
        }
    }

    /// A `LOCK.LEADER` answer: the leader to yield, if it changed.
    pub(crate) fn read(&mut self, leader: Option<Leader>) -> Option<Leader> {
        let leader = leader?;
        if let Some(last) = &self.last {
            if leader.epoch < last.epoch || leader == *last {
                return None;
            }
        }
        self.last = Some(leader.clone());
        Some(leader)
    }

    /// A message of the leader channel: whether it asks for a read (a well-formed message
    /// about this observer's database and key).
    pub(crate) fn message(&self, payload: &[u8]) -> bool {
        LeaderMessage::parse(payload).is_some_and(|m| m.is_about(self.db, &self.key))
    }
}

/// The leaders of one election key, in the order they led: a
/// [`Stream`](futures_core::Stream) of [`Leader`] ([`Election::observe`](crate::Election::observe)), also read with
/// [`Observer::next`].
///
/// It subscribes to the key's leader channel on a connection of its own (`SUBSCRIBE`, or
/// `SSUBSCRIBE` on the key's master in a cluster), then reads `LOCK.LEADER` and yields the
/// current leader. Each message about its key (an election, a proclamation) makes it read
/// `LOCK.LEADER` again, one round trip on the client's shared connection, and it yields what the
/// read answers when that changed: a newly elected candidate (`value` `None` until it
/// proclaims one; a candidate elected with a value comes with it), a new value. A message is
/// never believed by itself: anyone allowed to publish on the channel can send one, so the
/// observer yields only leaders the server names. It never yields an epoch below the last it
/// yielded, nor the same leader twice in a row. When the connection breaks (or a read fails)
/// it connects again, subscribes, and reads `LOCK.LEADER` again (pub/sub is at most once: what
/// was published meanwhile is gone, the read tells the current leader). The end of a
/// leadership is not announced: the next election is.
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
            // A server with the redislock Functions library has no elections: the stream
            // ends, never tried again.
            Err(LockError::NotSupported(_)) => return,
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        // Messages until the connection breaks, or (through Sentinel) the master changes: then
        // it subscribes and reads again on the new master. A message about the key asks for a
        // read; messages already waiting are taken first, so that a burst costs one read.
        let mut changed = std::pin::pin!(crate::master::changed(ctx.servers.changes()));
        'messages: loop {
            let push = tokio::select! {
                push = pushes.recv() => push,
                _ = &mut changed => None,
            };
            let mut read = false;
            let mut next = push;
            loop {
                let Some(push) = next else {
                    break 'messages;
                };
                match push.kind {
                    PushKind::Disconnection => break 'messages,
                    PushKind::Message | PushKind::SMessage => {
                        if let [Value::BulkString(ch), Value::BulkString(payload), ..] =
                            push.data.as_slice()
                        {
                            read |= *ch == channel && feed.message(payload);
                        }
                    }
                    _ => {}
                }
                match pushes.try_recv() {
                    Ok(push) => next = Some(push),
                    Err(_) => break,
                }
            }
            if !read {
                continue;
            }
            // A failed read: subscribe and read again (nothing said since is missed).
            let Ok(leader) = read_leader(&ctx.commands, &key).await else {
                break;
            };
            if let Some(l) = feed.read(leader) {
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
    fn the_feed_yields_each_change_it_reads_once_in_epoch_order() {
        let mut feed = Feed::new(0, Arc::from(&b"svc"[..]));
        assert_eq!(feed.read(None), None);
        assert_eq!(
            feed.read(Some(leader("a", 5, Some("x")))),
            Some(leader("a", 5, Some("x")))
        );
        // The same answer again, or an older one (a server behind): nothing.
        assert_eq!(feed.read(Some(leader("a", 5, Some("x")))), None);
        assert_eq!(feed.read(Some(leader("z", 4, Some("x")))), None);
        assert_eq!(
            feed.read(Some(leader("a", 5, Some("y y")))),
            Some(leader("a", 5, Some("y y")))
        );
        assert_eq!(
            feed.read(Some(leader("b", 9, None))),
            Some(leader("b", 9, None))
        );
        assert_eq!(
            feed.read(Some(leader("b", 9, Some("v")))),
            Some(leader("b", 9, Some("v")))
        );
        // Nobody leads: nothing to yield, and the last leader is kept.
        assert_eq!(feed.read(None), None);
        assert_eq!(feed.read(Some(leader("b", 9, Some("v")))), None);
    }

    #[test]
    fn a_message_only_asks_for_a_read_and_its_epoch_is_never_kept() {
        let mut feed = Feed::new(0, Arc::from(&b"svc"[..]));
        assert_eq!(
            feed.read(Some(leader("a", 5, Some("x")))),
            Some(leader("a", 5, Some("x")))
        );
        // Forged: a huge epoch, a candidate the server never elected. A read is asked for,
        // and the read's answer (the real leader, a lower epoch) is what counts.
        assert!(feed.message(b"elected 0 9000000000000000 3 svc evil-node"));
        assert!(feed.message(b"proclaimed 0 9000000000000000 3 svc 6.6.6.6:66"));
        assert_eq!(feed.read(Some(leader("a", 5, Some("x")))), None);
        assert_eq!(
            feed.read(Some(leader("b", 7, None))),
            Some(leader("b", 7, None)),
            "a real leader after the forgery is followed"
        );
        for junk in [
            &b"elected 0 x 3 svc c"[..],
            b"elected 0 13 3 svc",
            b"resigned 0 13 3 svc c",
            b"elected 13 c",
            b"",
        ] {
            assert!(!feed.message(junk), "{}", String::from_utf8_lossy(junk));
        }
    }

    #[test]
    fn the_feed_reads_only_for_messages_about_its_own_database_and_key() {
        // `svc` and `{svc}` share a channel, as `svc` in db 0 and db 1 do; their epochs come
        // from one counter and interleave.
        let feed = Feed::new(0, Arc::from(&b"svc"[..]));
        assert!(feed.message(b"elected 0 5 3 svc mine"));
        assert!(feed.message(b"proclaimed 0 5 3 svc here"));
        for foreign in [
            &b"elected 1 6 3 svc theirs"[..],
            b"elected 0 7 5 {svc} theirs",
            b"proclaimed 1 6 3 svc v",
            b"proclaimed 0 7 5 {svc} v",
        ] {
            assert!(
                !feed.message(foreign),
                "{}",
                String::from_utf8_lossy(foreign)
            );
        }
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
