//! An acquire that waits on a server with the `redislock` Functions library, which cannot
//! block: it listens to the lock's unlock message and asks again at each one, and when the
//! holder's lease ends. The same rule as the Python library's (`_unlocked.py`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use redis::Value;
use tokio::time::Instant;

use crate::backend::lease_left;
use crate::channel::unlock_channel;
use crate::conn::Commands;
use crate::error::LockError;
use crate::servers::Servers;

/// How long after the holder's lease ends the acquire is asked again (Redis removes an expired
/// key when it is next touched: the acquire itself).
const LEASE_MARGIN: Duration = Duration::from_millis(2);

type Messages = Pin<Box<dyn Stream<Item = redis::Msg> + Send>>;

/// `ask` (an acquire that does not wait, with `ONCE`: asking again never counts a re-entry
/// twice) until it is granted or `until` passes (`None`: no end): subscribed first
/// (`SUBSCRIBE` to the key's unlock channel, on a connection of its own), then asked; while
/// refused, asked again at each message on the channel (a hint: anything on it only has the
/// acquire asked again), and at the holder's lease end (read with `LOCK.INFO`'s `lock_info`)
/// or the deadline, whichever comes first. The acquire's reply: the token, or nil (not granted
/// by the deadline). A subscription that broke is made again before the next ask, so that no
/// release between the two is missed. Dropped, the subscription's connection is closed.
pub(crate) async fn wait_unlocked<F, Fut>(
    servers: &Servers,
    commands: &Commands,
    key: &[u8],
    timeout: Duration,
    until: Option<Instant>,
    mut ask: F,
) -> Result<Value, LockError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Value, LockError>>,
{
    let channel = unlock_channel(key);
    let mut info = redis::cmd("LOCK.INFO");
    info.arg(key);
    let mut listening: Option<Messages> = None;
    loop {
        if listening.is_none() && until.is_none_or(|u| Instant::now() < u) {
            listening = Some(subscribe(servers, key, &channel, timeout).await?);
        }
        let reply = ask().await?;
        if reply != Value::Nil {
            return Ok(reply);
        }
        let left = until.map(|u| u.saturating_duration_since(Instant::now()));
        let Some(messages) = listening.as_mut() else {
            return Ok(Value::Nil);
        };
        if left.is_some_and(|l| l.is_zero()) {
            return Ok(Value::Nil);
        }
        let pause = match lease_left(&commands.query_routed(&info, Some(key)).await?) {
            None => continue, // freed meanwhile: asked again at once
            Some(ms) => match u64::try_from(ms) {
                Ok(ms) => Some(Duration::from_millis(ms) + LEASE_MARGIN),
                Err(_) => None, // no lease: only a message or the deadline
            },
        };
        let pause = match (pause, left) {
            (Some(p), Some(l)) => Some(p.min(l)),
            (p, l) => p.or(l),
        };
        let next = std::future::poll_fn(|cx| messages.as_mut().poll_next(cx));
        let message = match pause {
            Some(pause) => tokio::time::timeout(pause, next).await.ok(),
            None => Some(next.await),
        };
        if let Some(None) = message {
            // The subscription broke: made again before the next ask.
            listening = None;
        }
    }
}

/// A connection of its own to `key`'s server, subscribed to `channel` (its confirmation
/// read): the stream of its messages.
async fn subscribe(
    servers: &Servers,
    key: &[u8],
    channel: &[u8],
    timeout: Duration,
) -> Result<Messages, LockError> {
    let (node, _) = servers.node_of(key).await?;
    let subscribed = async {
        let mut pubsub = node.client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    match tokio::time::timeout(timeout, subscribed).await {
        Ok(Ok(pubsub)) => Ok(Box::pin(pubsub.into_on_message())),
        Ok(Err(e)) => Err(LockError::from(e)),
        Err(_) => Err(LockError::Connection(redis::RedisError::from(
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "SUBSCRIBE to the unlock channel got no reply in time",
            ),
        ))),
    }
}
