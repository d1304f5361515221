//! Retries of a blocking acquire whose grant the client may never have read.
//!
//! A client library whose own read timeout fires just as the server grants its
//! `LOCK.ACQUIRE ... WAIT` closes the connection with the grant unread, reconnects and sends the
//! same `WAIT` again (redis-py and redis-rb do this by default). The owner already holds the
//! lock by then, so the retry would count as a re-entry: count 2 after one acquire, and the one
//! release the caller makes leaves the lock held until its lease ends.
//!
//! The server cannot see whether a reply was read. What it can see: the connection that
//! received the grant closed within [`UNREAD_GRACE_MS`] of it without sending any other LOCK.*
//! command. Such a grant is taken as possibly unread, and a `WAIT` by the same owner for the
//! same key within [`RETRY_WINDOW_MS`], while the hold is exactly that grant (count 1, same
//! token) and nothing else touched the key, is taken as the client's retry of the same request:
//! it returns the same token and counts nothing.

use std::collections::HashMap;
use std::hash::Hash;

use crate::queue::LockKey;
use crate::UnixMs;

/// How soon after a grant its connection must close for the grant to count as possibly unread.
/// A client that times out as the grant arrives closes within about a round trip of it.
pub const UNREAD_GRACE_MS: u64 = 200;

/// How long after that close a `WAIT` by the same owner counts as its retry.
pub const RETRY_WINDOW_MS: u64 = 10_000;

#[derive(Debug)]
struct Delivered {
    key: LockKey,
    owner: Box<[u8]>,
    token: u64,
    at: UnixMs,
}

#[derive(Debug)]
struct Unread {
    owner: Box<[u8]>,
    token: u64,
    since: UnixMs,
}

/// Recent `WAIT` grants by client (`C`: the server's client id), and the grants that may be
/// unread, by key. Both stay small: entries older than their window are dropped as new ones
/// come.
#[derive(Debug)]
pub struct Retries<C> {
    delivered: HashMap<C, Delivered>,
    unread: HashMap<LockKey, Unread>,
}

impl<C> Default for Retries<C> {
    fn default() -> Self {
        Retries {
            delivered: HashMap::new(),
            unread: HashMap::new(),
        }
    }
}

/// The hold at the key when a `WAIT` retry may be recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub count: u64,
    pub token: Option<u64>,
}

impl<C: Copy + Eq + Hash> Retries<C> {
    /// Nothing to remember: LOCK.* commands skip every other call.
    pub fn is_empty(&self) -> bool {
        self.delivered.is_empty() && self.unread.is_empty()
    }

    /// A `WAIT` grant's reply was sent to `client`.
    pub fn delivered(&mut self, client: C, key: LockKey, owner: &[u8], token: u64, now: UnixMs) {
        self.delivered
            .retain(|_, d| now.saturating_sub(d.at) <= UNREAD_GRACE_MS);
        self.delivered.insert(
            client,
            Delivered {
                key,
                owner: owner.into(),
                token,
                at: now,
            },
        );
    }

    /// `client` sent a LOCK.* command: it is reading its replies.
    pub fn active(&mut self, client: C) {
        self.delivered.remove(&client);
    }

    /// `client`'s connection closed.
    pub fn disconnected(&mut self, client: C, now: UnixMs) {
        let Some(d) = self.delivered.remove(&client) else {
            return;
        };
        if now.saturating_sub(d.at) > UNREAD_GRACE_MS {
            return;
        }
        self.unread
            .retain(|_, u| now.saturating_sub(u.since) <= RETRY_WINDOW_MS);
        self.unread.insert(
            d.key,
            Unread {
                owner: d.owner,
                token: d.token,
                since: now,
            },
        );
    }

    /// A LOCK.* command other than a recognised retry looked at `key`: whatever it did, an
    /// earlier grant there is no longer one to retry.
    pub fn touched(&mut self, key: &LockKey) {
        self.unread.remove(key);
    }

    /// Whether a `WAIT` by `owner` on `key`, which finds `held`, is the retry of a grant that
    /// may be unread. Consumes the record either way: a retry is recognised once.
    pub fn take_retry(&mut self, key: &LockKey, owner: &[u8], held: Held, now: UnixMs) -> bool {
        match self.unread.remove(key) {
            Some(u) => {
                &*u.owner == owner
                    && held.count == 1
                    && held.token == Some(u.token)
                    && now.saturating_sub(u.since) <= RETRY_WINDOW_MS
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LockKey {
        LockKey::new(0, name.as_bytes())
    }

    const HELD: Held = Held {
        count: 1,
        token: Some(7),
    };

    /// Client 1 was granted `k` for `w` with token 7 at t=1,000.
    fn granted() -> Retries<u64> {
        let mut r = Retries::default();
        r.delivered(1, key("k"), b"w", 7, 1_000);
        r
    }

    #[test]
    fn a_retry_after_an_early_close_is_recognised_once() {
        let mut r = granted();
        r.disconnected(1, 1_050);
        assert!(r.take_retry(&key("k"), b"w", HELD, 1_300));
        assert!(!r.take_retry(&key("k"), b"w", HELD, 1_301), "only once");
        assert!(r.is_empty());
    }

    #[test]
    fn what_is_not_a_retry() {
        type Case = (&'static str, fn(&mut Retries<u64>) -> bool);
        let cases: [Case; 9] = [
            ("the connection stayed open", |r| {
                r.take_retry(&key("k"), b"w", HELD, 1_100)
            }),
            ("it closed after the grace period", |r| {
                r.disconnected(1, 1_000 + UNREAD_GRACE_MS + 1);
                r.take_retry(&key("k"), b"w", HELD, 1_300)
            }),
            ("the client sent another LOCK.* command first", |r| {
                r.active(1);
                r.disconnected(1, 1_050);
                r.take_retry(&key("k"), b"w", HELD, 1_300)
            }),
            ("another owner", |r| {
                r.disconnected(1, 1_050);
                r.take_retry(&key("k"), b"x", HELD, 1_300)
            }),
            ("another key", |r| {
                r.disconnected(1, 1_050);
                r.take_retry(&key("j"), b"w", HELD, 1_300)
            }),
            ("the hold was re-entered", |r| {
                r.disconnected(1, 1_050);
                let held = Held {
                    count: 2,
                    token: Some(7),
                };
                r.take_retry(&key("k"), b"w", held, 1_300)
            }),
            ("a newer hold of the same owner", |r| {
                r.disconnected(1, 1_050);
                let held = Held {
                    count: 1,
                    token: Some(8),
                };
                r.take_retry(&key("k"), b"w", held, 1_300)
            }),
            ("the retry came too late", |r| {
                r.disconnected(1, 1_050);
                r.take_retry(&key("k"), b"w", HELD, 1_050 + RETRY_WINDOW_MS + 1)
            }),
            ("another command touched the key", |r| {
                r.disconnected(1, 1_050);
                r.touched(&key("k"));
                r.take_retry(&key("k"), b"w", HELD, 1_300)
            }),
        ];
        for (name, case) in cases {
            let mut r = granted();
            assert!(!case(&mut r), "{name}");
        }
    }

    #[test]
    fn old_records_are_dropped_as_new_ones_come() {
        let mut r = Retries::default();
        for client in 0..1_000u64 {
            r.delivered(client, key("k"), b"w", client, client * 1_000);
        }
        assert_eq!(r.delivered.len(), 1);
        for client in 0..1_000u64 {
            let at = client * 100_000;
            r.delivered(client, key(&client.to_string()), b"w", 1, at);
            r.disconnected(client, at + 1);
        }
        assert_eq!(r.unread.len(), 1);
    }
}
