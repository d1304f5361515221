//! Consuming the server's lost-hold signal (issue #20 part 1; the server does not publish it yet).
//!
//! When a hold ends by anything but its owner's own `LOCK.RELEASE`, the module is to publish
//! `<reason> <token> <owner>` on `lock.lost:{KEY}` (`lock.lost:KEY` when KEY contains `{`,
//! Redisson's channel naming). The client keeps one pub/sub connection and subscribes to the
//! channel of each key it holds while it holds it; a message marks a hold lost only if its owner
//! and token are this hold's.
//!
//! Pub/sub is at-most-once: a message published while the connection is down is gone. The
//! watchdog stays the backstop; the signal only makes the common case fast.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushKind};
use tokio::sync::mpsc;

use crate::hold::HoldCore;
use crate::lost::LostReason;

/// The channel the server publishes a key's lost-hold messages on: `lock.lost:{KEY}`, or
/// `lock.lost:KEY` when KEY already contains `{` (so the channel hashes to the key's slot).
pub fn lost_signal_channel(key: &[u8]) -> Vec<u8> {
    let mut channel = Vec::with_capacity(key.len() + 12);
    channel.extend_from_slice(b"lock.lost:");
    if key.contains(&b'{') {
        channel.extend_from_slice(key);
    } else {
        channel.push(b'{');
        channel.extend_from_slice(key);
        channel.push(b'}');
    }
    channel
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
    client: redis::Client,
    state: Mutex<HubState>,
    /// Serializes (re)connecting, subscribing and unsubscribing.
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

#[derive(Default)]
struct HubState {
    watched: HashMap<Vec<u8>, Vec<Weak<HoldCore>>>,
}

impl SignalHub {
    /// `client` must speak RESP3 (pushes arrive on the connection that subscribed).
    pub(crate) fn new(client: redis::Client) -> Arc<SignalHub> {
        Arc::new(SignalHub {
            client,
            state: Mutex::new(HubState::default()),
            conn: tokio::sync::Mutex::new(None),
        })
    }

    /// Starts watching `hold`'s channel; returns once the server confirmed the subscription.
    /// A message published before that is missed (the watchdog still covers the hold).
    pub(crate) async fn watch(self: &Arc<Self>, hold: &Arc<HoldCore>) -> redis::RedisResult<()> {
        let channel = lost_signal_channel(&hold.key);
        let first = {
            let mut state = lock_state(&self.state);
            let entry = state.watched.entry(channel.clone()).or_default();
            entry.retain(|w| w.strong_count() > 0);
            entry.push(Arc::downgrade(hold));
            entry.len() == 1
        };
        if first {
            let mut guard = self.conn.lock().await;
            let conn = self.connection(&mut guard).await?;
            conn.subscribe(&channel).await?;
        }
        Ok(())
    }

    /// Stops watching `hold`; unsubscribes when no other hold of the client uses the channel.
    pub(crate) async fn unwatch(self: &Arc<Self>, hold: &HoldCore) {
        let channel = lost_signal_channel(&hold.key);
        let last = {
            let mut state = lock_state(&self.state);
            let Some(entry) = state.watched.get_mut(&channel) else {
                return;
            };
            entry.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), hold));
            if entry.is_empty() {
                state.watched.remove(&channel);
                true
            } else {
                false
            }
        };
        if last {
            let mut guard = self.conn.lock().await;
            if let Some(conn) = guard.as_mut() {
                // A failure leaves a subscription nobody reads: harmless, and a reconnect drops it.
                let _ = conn.unsubscribe(&channel).await;
            }
        }
    }

    /// The pub/sub connection, connecting (and starting its reader) if there is none.
    async fn connection<'a>(
        self: &Arc<Self>,
        slot: &'a mut Option<MultiplexedConnection>,
    ) -> redis::RedisResult<&'a mut MultiplexedConnection> {
        if slot.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            let config = AsyncConnectionConfig::new().set_push_sender(tx);
            let conn = self
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
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

    fn dispatch(&self, channel: &[u8], payload: &[u8]) {
        let Some(signal) = LostSignal::parse(payload) else {
            return;
        };
        let holds: Vec<Arc<HoldCore>> = {
            let state = lock_state(&self.state);
            match state.watched.get(channel) {
                Some(entry) => entry.iter().filter_map(Weak::upgrade).collect(),
                None => return,
            }
        };
        for hold in holds {
            if hold.owner.as_bytes() == signal.owner.as_slice() && hold.token == signal.token {
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
                    if conn.subscribe(&channels).await.is_ok() {
                        return;
                    }
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
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
            PushKind::Disconnection => {
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
