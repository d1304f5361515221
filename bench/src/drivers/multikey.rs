//! Three ways for one client to hold several locks at once, each driven command for command as
//! its client drives it (scenario `multikey`, issue 22):
//!
//! - **Module**: one `LOCK.MACQUIRE numkeys key... owner lease WAIT t` (queued on every key at
//!   once, granted when it heads every queue), one `LOCK.MRELEASE`.
//! - **Redisson's MultiLock algorithm**, reimplemented here from Redisson's published
//!   `RedissonMultiLock` (redisson/redisson, `redisson/src/main/java/org/redisson/
//!   RedissonMultiLock.java`, read at its 2019 and 2020 revisions, which agree on this path;
//!   Apache License 2.0). No Java code is copied; the Lua scripts are the RLock scripts the
//!   bench already runs verbatim (`REDISSON_LOCK`, `REDISSON_UNLOCK`). What `multiLock.lock()`
//!   does, and so what this driver does:
//!   1. `lock()` without a lease (the watchdog's 30 s lease, `LEASE_MS` here) sets
//!      `waitTime = locks × 1500 ms` and loops `tryLock(waitTime, -1)` until it returns true.
//!      There is no back-off between rounds: the next round starts at once. (Only `lock(lease)`
//!      randomises its `waitTime`, between lease/2 and the lease.)
//!   2. `tryLock(waitTime)` walks the locks **in the caller's order**, one RLock `tryLock(remain)`
//!      each, holding the ones already taken while it waits for the next (hold and wait).
//!      `remain` starts at `waitTime` and shrinks with the time spent.
//!   3. An RLock `tryLock(remain)`: run the lock script; on a ttl, SUBSCRIBE to the lock's
//!      channel, retry the script, and after each failure wait for an unlock message for at
//!      most min(ttl, time left); give up when `remain` is spent; UNSUBSCRIBE.
//!   4. When one lock fails (its `remain` ran out), unlock the locks taken (the unlock script,
//!      one per lock) and restart from the first lock; after **every** lock, taken or not, if
//!      `remain` ≤ 0, unlock what is held and return false — even after taking the last one.
//!      `failedLocksLimit()` is 0 for a MultiLock (RedLock overrides it), so one failure fails.
//!
//!   What is not modelled: the watchdog's renewals (every 10 s; no hold here lasts that long),
//!   Redisson sharing one subscription per channel among the threads of one JVM (each simulated
//!   client is its own Redisson instance, as in the bench's RLock driver), and its async
//!   pipelining of the unlocks of one round (sent one after another here: the same commands).
//! - **Sequential**: `LOCK.ACQUIRE key owner lease WAIT t` on each key in sorted order (the
//!   usual way to avoid deadlock without a multi-key command), then `LOCK.RELEASE` on each.
//!
//! Every wait is bounded so that the bench cannot hang: the module's WAIT and each Redisson
//! message wait end by themselves, and a client told to stop abandons its attempt (giving back
//! what it holds) at its next chance.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{owner_id, unlock_channel, Scripts, LEASE_MS};
use crate::resp::RawConn;
use lock_testkit::Server;

/// How long one module `WAIT` blocks before the client asks again (a timeout is counted as a
/// restart). Long against any wait this scenario sees; it only bounds the end of a cell.
const WAIT_MS: u64 = 2_000;

/// Redisson's `lock()` wait per round: `locks.size() * 1500` ms.
const REDISSON_WAIT_PER_LOCK_MS: u64 = 1_500;

/// How often a Redisson client waiting for an unlock message looks at the stop flag. It sends
/// nothing when it looks, so this changes no count.
const STOP_CHECK: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MultiApproach {
    Module,
    RedissonMultiLock,
    Sequential,
}

impl MultiApproach {
    pub const ALL: [MultiApproach; 3] = [
        MultiApproach::Module,
        MultiApproach::RedissonMultiLock,
        MultiApproach::Sequential,
    ];

    pub fn label(self) -> &'static str {
        match self {
            MultiApproach::Module => "LOCK.MACQUIRE … WAIT + LOCK.MRELEASE (module)",
            MultiApproach::RedissonMultiLock => {
                "Redisson MultiLock algorithm (RLock scripts, caller's order)"
            }
            MultiApproach::Sequential => "LOCK.ACQUIRE … WAIT per key, sorted (module)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            MultiApproach::Module => "macquire",
            MultiApproach::RedissonMultiLock => "multilock",
            MultiApproach::Sequential => "sorted",
        }
    }
}

/// How one acquisition ended.
#[derive(Debug)]
pub enum Acquired {
    /// Every key held; the fencing tokens in the order of the keys asked, when the approach has
    /// them (Redisson has none).
    All { tokens: Vec<Option<i64>> },
    /// The client was told to stop while waiting and gave back whatever it held.
    Abandoned,
}

/// What a client sent, counted on the client side.
#[derive(Debug, Default, Clone, Copy)]
pub struct MultiTally {
    pub commands_sent: u64,
    /// Attempts that ended without the keys and were started again: module WAIT timeouts,
    /// Redisson `tryLock` rounds whose wait ran out (each gave back what it held).
    pub restarts: u64,
    /// Pub/sub unlock messages received (Redisson's wake-ups).
    pub messages_received: u64,
}

pub trait MultiLockClient: Send {
    /// Takes every key of `keys` (distinct), waiting as the approach waits.
    fn acquire(&mut self, keys: &[String], stop: &AtomicBool) -> Result<Acquired, String>;
    fn release(&mut self, keys: &[String]) -> Result<(), String>;
    fn tally(&self) -> MultiTally;
}

pub fn client(
    approach: MultiApproach,
    server: &Server,
    scripts: &Scripts,
    id: usize,
) -> Box<dyn MultiLockClient> {
    match approach {
        MultiApproach::Module => Box::new(MacquireClient {
            con: server.connect(),
            owner: owner_id(id),
            tally: MultiTally::default(),
        }),
        MultiApproach::RedissonMultiLock => Box::new(RedissonMultiLockClient {
            con: server.connect(),
            subscription: RawConn::connect(server.address(0)).expect("subscription connection"),
            owner: owner_id(id),
            scripts: scripts.clone(),
            tally: MultiTally::default(),
        }),
        MultiApproach::Sequential => Box::new(SortedClient {
            con: server.connect(),
            owner: owner_id(id),
            tally: MultiTally::default(),
        }),
    }
}

fn server_error(error: redis::RedisError) -> String {
    error.to_string()
}

struct MacquireClient {
    con: redis::Connection,
    owner: String,
    tally: MultiTally,
}

impl MultiLockClient for MacquireClient {
    fn acquire(&mut self, keys: &[String], stop: &AtomicBool) -> Result<Acquired, String> {
        loop {
            self.tally.commands_sent += 1;
            let tokens: Option<Vec<i64>> = redis::cmd("LOCK.MACQUIRE")
                .arg(keys.len())
                .arg(keys)
                .arg(&self.owner)
                .arg(LEASE_MS)
                .arg("WAIT")
                .arg(WAIT_MS)
                .query(&mut self.con)
                .map_err(server_error)?;
            match tokens {
                Some(tokens) if tokens.len() == keys.len() => {
                    return Ok(Acquired::All {
                        tokens: tokens.into_iter().map(Some).collect(),
                    })
                }
                Some(tokens) => {
                    return Err(format!(
                        "LOCK.MACQUIRE answered {} tokens for {} keys",
                        tokens.len(),
                        keys.len()
                    ))
                }
                None if stop.load(Ordering::Relaxed) => return Ok(Acquired::Abandoned),
                None => self.tally.restarts += 1,
            }
        }
    }

    fn release(&mut self, keys: &[String]) -> Result<(), String> {
        self.tally.commands_sent += 1;
        let released: Vec<Option<i64>> = redis::cmd("LOCK.MRELEASE")
            .arg(keys.len())
            .arg(keys)
            .arg(&self.owner)
            .query(&mut self.con)
            .map_err(server_error)?;
        if released.iter().any(|r| *r != Some(0)) {
            return Err(format!("LOCK.MRELEASE by the holder answered {released:?}"));
        }
        Ok(())
    }

    fn tally(&self) -> MultiTally {
        self.tally
    }
}

struct SortedClient {
    con: redis::Connection,
    owner: String,
    tally: MultiTally,
}

impl SortedClient {
    fn release_one(&mut self, key: &str) -> Result<(), String> {
        self.tally.commands_sent += 1;
        let remaining: Option<i64> = redis::cmd("LOCK.RELEASE")
            .arg(key)
            .arg(&self.owner)
            .query(&mut self.con)
            .map_err(server_error)?;
        if remaining != Some(0) {
            return Err(format!("LOCK.RELEASE by the holder answered {remaining:?}"));
        }
        Ok(())
    }
}

impl MultiLockClient for SortedClient {
    fn acquire(&mut self, keys: &[String], stop: &AtomicBool) -> Result<Acquired, String> {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
        let mut tokens = vec![None; keys.len()];
        let mut held: Vec<usize> = Vec::new();
        for i in order {
            loop {
                self.tally.commands_sent += 1;
                let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                    .arg(&keys[i])
                    .arg(&self.owner)
                    .arg(LEASE_MS)
                    .arg("WAIT")
                    .arg(WAIT_MS)
                    .query(&mut self.con)
                    .map_err(server_error)?;
                if token.is_some() {
                    tokens[i] = token;
                    held.push(i);
                    break;
                }
                if stop.load(Ordering::Relaxed) {
                    for &h in held.iter().rev() {
                        self.release_one(&keys[h])?;
                    }
                    return Ok(Acquired::Abandoned);
                }
                // Keep what is held (sorted order cannot deadlock) and ask again.
                self.tally.restarts += 1;
            }
        }
        Ok(Acquired::All { tokens })
    }

    fn release(&mut self, keys: &[String]) -> Result<(), String> {
        for key in keys {
            self.release_one(key)?;
        }
        Ok(())
    }

    fn tally(&self) -> MultiTally {
        self.tally
    }
}

/// How one RLock `tryLock(wait)` ended.
enum Single {
    Taken,
    /// Its wait ran out.
    Failed,
    /// The bench told the client to stop.
    Stopped,
}

/// How one MultiLock `tryLock(waitTime)` round ended.
enum Round {
    Taken,
    /// `remain` ran out: what was held has been given back.
    Expired,
    Stopped,
}

struct RedissonMultiLockClient {
    con: redis::Connection,
    subscription: RawConn,
    owner: String,
    scripts: Scripts,
    tally: MultiTally,
}

impl RedissonMultiLockClient {
    /// One run of the RLock lock script: `None` when taken, else the holder's ttl.
    fn lock_script(&mut self, key: &str) -> Result<Option<i64>, String> {
        self.tally.commands_sent += 1;
        redis::cmd("EVALSHA")
            .arg(&self.scripts.redisson_lock)
            .arg(1)
            .arg(key)
            .arg(LEASE_MS)
            .arg(&self.owner)
            .query(&mut self.con)
            .map_err(server_error)
    }

    fn unlock(&mut self, key: &str) -> Result<(), String> {
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
            .map_err(server_error)?;
        if released != Some(1) {
            return Err(format!(
                "Redisson unlock by the holder answered {released:?}"
            ));
        }
        Ok(())
    }

    /// `unlockInner(acquiredLocks)`.
    fn unlock_all(&mut self, keys: &[String], held: &[usize]) -> Result<(), String> {
        for &h in held {
            self.unlock(&keys[h])?;
        }
        Ok(())
    }

    fn subscribe(&mut self, channel: &str) -> Result<(), String> {
        self.tally.commands_sent += 1;
        self.subscription
            .send(&[b"SUBSCRIBE", channel.as_bytes()])
            .map_err(|e| e.to_string())?;
        self.read_until_confirmed(b"subscribe")
    }

    fn unsubscribe(&mut self, channel: &str) -> Result<(), String> {
        self.tally.commands_sent += 1;
        self.subscription
            .send(&[b"UNSUBSCRIBE", channel.as_bytes()])
            .map_err(|e| e.to_string())?;
        self.read_until_confirmed(b"unsubscribe")
    }

    fn read_until_confirmed(&mut self, confirmation: &[u8]) -> Result<(), String> {
        loop {
            let reply = self.subscription.read().map_err(|e| e.to_string())?;
            if reply.is_message() {
                self.tally.messages_received += 1;
            } else if reply.kind() == Some(confirmation) {
                return Ok(());
            }
        }
    }

    /// Waits up to `wait` for an unlock message (Redisson's latch), looking at the stop flag
    /// every `STOP_CHECK`. False when told to stop.
    fn wait_for_unlock(&mut self, wait: Duration, stop: &AtomicBool) -> Result<bool, String> {
        let until = Instant::now() + wait;
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(true);
            }
            let reply = self
                .subscription
                .read_within(left.min(STOP_CHECK))
                .map_err(|e| e.to_string())?;
            if reply.is_some_and(|r| r.is_message()) {
                self.tally.messages_received += 1;
                return Ok(true);
            }
        }
    }

    /// RLock `tryLock(wait, -1)`.
    fn try_lock(&mut self, key: &str, wait: Duration, stop: &AtomicBool) -> Result<Single, String> {
        let deadline = Instant::now() + wait;
        if self.lock_script(key)?.is_none() {
            return Ok(Single::Taken);
        }
        if Instant::now() >= deadline {
            return Ok(Single::Failed);
        }
        let channel = unlock_channel(key);
        self.subscribe(&channel)?;
        let outcome = loop {
            let Some(ttl) = self.lock_script(key)? else {
                break Single::Taken;
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Single::Failed;
            }
            let wait = match u64::try_from(ttl) {
                Ok(ttl) if Duration::from_millis(ttl) < left => Duration::from_millis(ttl),
                _ => left,
            };
            if !self.wait_for_unlock(wait, stop)? {
                break Single::Stopped;
            }
            if Instant::now() >= deadline {
                break Single::Failed;
            }
        };
        self.unsubscribe(&channel)?;
        Ok(outcome)
    }

    /// MultiLock `tryLock(waitTime, -1)`: the keys in the caller's order.
    fn try_round(
        &mut self,
        keys: &[String],
        wait: Duration,
        stop: &AtomicBool,
    ) -> Result<Round, String> {
        let deadline = Instant::now() + wait;
        let mut held: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < keys.len() {
            let remain = deadline.saturating_duration_since(Instant::now());
            match self.try_lock(&keys[i], remain, stop)? {
                Single::Taken => {
                    held.push(i);
                    i += 1;
                }
                Single::Failed => {
                    // failedLocksLimit() == 0: give back what is held, start from the first.
                    self.unlock_all(keys, &held)?;
                    held.clear();
                    i = 0;
                }
                Single::Stopped => {
                    self.unlock_all(keys, &held)?;
                    return Ok(Round::Stopped);
                }
            }
            // Checked after every lock, the last one included.
            if Instant::now() >= deadline {
                self.unlock_all(keys, &held)?;
                return Ok(Round::Expired);
            }
        }
        Ok(Round::Taken)
    }
}

impl MultiLockClient for RedissonMultiLockClient {
    /// MultiLock `lock()`: rounds of `tryLock(locks × 1500 ms)` until one takes every lock.
    fn acquire(&mut self, keys: &[String], stop: &AtomicBool) -> Result<Acquired, String> {
        let wait = Duration::from_millis(REDISSON_WAIT_PER_LOCK_MS * keys.len() as u64);
        loop {
            match self.try_round(keys, wait, stop)? {
                Round::Taken => {
                    return Ok(Acquired::All {
                        tokens: vec![None; keys.len()],
                    })
                }
                Round::Stopped => return Ok(Acquired::Abandoned),
                Round::Expired if stop.load(Ordering::Relaxed) => return Ok(Acquired::Abandoned),
                Round::Expired => self.tally.restarts += 1,
            }
        }
    }

    /// MultiLock `unlock()`: the unlock script on every lock.
    fn release(&mut self, keys: &[String]) -> Result<(), String> {
        for key in keys {
            self.unlock(key)?;
        }
        Ok(())
    }

    fn tally(&self) -> MultiTally {
        self.tally
    }
}
