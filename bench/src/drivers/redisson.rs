//! Redisson's `RLock.lock()`: try the lock script; when it answers the holder's ttl, SUBSCRIBE
//! to the lock's unlock channel, then retry the script after every unlock message (or when the
//! ttl passes) until it answers nil, and UNSUBSCRIBE. Each simulated client is its own Redisson
//! instance with its own subscription connection, as separate services are.

use std::time::Duration;

use super::{owner_id, LockClient, Scripts, Tally, LEASE_MS};
use crate::resp::RawConn;
use lock_testkit::Server;

/// Redisson's channel for a lock: `redisson_lock__channel:{<key>}` (the key is hash-tagged so
/// the channel lives with the lock in a cluster), or `redisson_lock__channel:<key>` when the
/// key already has a tag.
pub fn unlock_channel(key: &str) -> String {
    if key.contains('{') {
        format!("redisson_lock__channel:{key}")
    } else {
        format!("redisson_lock__channel:{{{key}}}")
    }
}

/// What the lock script answered.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Acquired,
    /// Another owner holds it for `ttl_ms` more (-1: no lease).
    Held {
        ttl_ms: i64,
    },
}

pub struct RedissonClient {
    con: redis::Connection,
    subscription: RawConn,
    owner: String,
    scripts: Scripts,
    tally: Tally,
}

impl RedissonClient {
    pub fn new(server: &Server, scripts: &Scripts, id: usize) -> RedissonClient {
        RedissonClient {
            con: server.connect(),
            subscription: RawConn::connect(server.address(0)).expect("subscription connection"),
            owner: owner_id(id),
            scripts: scripts.clone(),
            tally: Tally::default(),
        }
    }

    /// One run of the lock script.
    fn try_lock(&mut self, key: &str) -> Attempt {
        self.tally.commands_sent += 1;
        let ttl: Option<i64> = redis::cmd("EVALSHA")
            .arg(&self.scripts.redisson_lock)
            .arg(1)
            .arg(key)
            .arg(LEASE_MS)
            .arg(&self.owner)
            .query(&mut self.con)
            .expect("Redisson lock script");
        match ttl {
            None => Attempt::Acquired,
            Some(ttl_ms) => Attempt::Held { ttl_ms },
        }
    }

    fn subscribe(&mut self, channel: &str) {
        self.tally.commands_sent += 1;
        self.subscription
            .send(&[b"SUBSCRIBE", channel.as_bytes()])
            .expect("SUBSCRIBE");
        self.read_until_confirmed(b"subscribe");
    }

    fn unsubscribe(&mut self, channel: &str) {
        self.tally.commands_sent += 1;
        self.subscription
            .send(&[b"UNSUBSCRIBE", channel.as_bytes()])
            .expect("UNSUBSCRIBE");
        // Unlock messages published before the server saw UNSUBSCRIBE still arrive: they are
        // wake-ups the server paid for, so they are counted.
        self.read_until_confirmed(b"unsubscribe");
    }

    fn read_until_confirmed(&mut self, confirmation: &[u8]) {
        loop {
            let reply = self.subscription.read().expect("subscription read");
            if reply.is_message() {
                self.tally.messages_received += 1;
            } else if reply.kind() == Some(confirmation) {
                return;
            }
        }
    }

    /// Waits for an unlock message, at most `ttl_ms` (Redisson's latch `tryAcquire(ttl)`).
    fn wait_for_unlock(&mut self, ttl_ms: i64) {
        let reply = if ttl_ms >= 0 {
            self.subscription
                .read_within(Duration::from_millis(ttl_ms as u64))
                .expect("subscription read")
        } else {
            Some(self.subscription.read().expect("subscription read"))
        };
        if reply.is_some_and(|r| r.is_message()) {
            self.tally.messages_received += 1;
        }
    }
}

impl LockClient for RedissonClient {
    fn acquire(&mut self, key: &str) -> Option<i64> {
        if self.try_lock(key) == Attempt::Acquired {
            // Free: taken at once, no subscription. Redisson has no fencing token.
            return None;
        }
        let channel = unlock_channel(key);
        self.subscribe(&channel);
        // Retry right after subscribing: the unlock may have happened before the subscription.
        while let Attempt::Held { ttl_ms } = self.try_lock(key) {
            self.wait_for_unlock(ttl_ms);
        }
        self.unsubscribe(&channel);
        // Redisson has no fencing token.
        None
    }

    fn release(&mut self, key: &str) {
        self.tally.commands_sent += 1;
        let released: Option<i64> = redis::cmd("EVALSHA")
            .arg(&self.scripts.redisson_unlock)
            .arg(2)
            .arg(key)
            .arg(unlock_channel(key))
            .arg("0")
            .arg(LEASE_MS)
            .arg(&self.owner)
            .query(&mut self.con)
            .expect("Redisson unlock script");
        assert_eq!(released, Some(1), "Redisson unlock by the holder");
    }

    fn tally(&self) -> Tally {
        self.tally
    }
}
