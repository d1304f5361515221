//! The lock family of docs/lock-family.md against its Redisson counterparts: the module's
//! `SHARED` and `LIMIT n` holds next to Redisson's `RReadWriteLock` and `RSemaphore`, each
//! driven command for command the way its client drives it.
//!
//! Redisson's scripts below are written for this bench, not pasted: they make the same
//! `redis.call`s in the same order, on the same keys, channels and messages, with the same
//! replies, as the scripts of Redisson's `RedissonReadLock.java`, `RedissonWriteLock.java` and
//! `RedissonSemaphore.java` (redisson/redisson, `redisson/src/main/java/org/redisson/`, Apache
//! License 2.0), so the server does Redisson's work. Like the bench's RLock driver, the unlock
//! scripts are those of Redisson releases before the unlock latch (newer releases also `GET`
//! and `SET ... PX` a `redisson_unlock_latch` key per unlock to make a retried unlock
//! idempotent: two more server calls per release than shown here).

use std::time::Duration;

use super::{owner_id, Tally, LEASE_MS};
use crate::resp::{RawConn, Resp};
use lock_testkit::Server;

/// Permits of the semaphore scenario: `LIMIT 4` for the module, 4 permits for `RSemaphore`.
pub const PERMITS: u32 = 4;

/// How long one module `WAIT` may block before the client asks again.
const WAIT_MS: u64 = 10_000;

/// How long a Redisson semaphore waiter waits for a release message before trying again.
/// Redisson's `acquire()` waits without a limit; this only keeps a lost message from hanging
/// the bench, and never passes in a healthy run.
const SEMAPHORE_SAFETY_WAIT: Duration = Duration::from_secs(10);

/// `RReadWriteLock.readLock()`'s lock script. KEYS: lock, timeout-key prefix
/// (`{lock}:<reader>:rwlock_timeout`); ARGV: lease ms, reader name, the same client's writer
/// name. nil when granted, else the lock's pttl. Each read hold also gets its own timeout key.
pub const REDISSON_READ_LOCK: &str = "\
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local holds = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local timeout_key = KEYS[2] .. ':' .. holds
  redis.call('set', timeout_key, 1)
  redis.call('pexpire', timeout_key, ARGV[1])
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(left, ARGV[1]))
  return nil
end
return redis.call('pttl', KEYS[1])";

/// `RReadWriteLock.readLock()`'s unlock script. KEYS: lock, channel, timeout-key prefix, key
/// prefix (`{lock}`); ARGV: unlock message (0), reader name. 1 = the lock is free (published),
/// 0 = other holds remain (the lock's expiry is recomputed from every read hold's timeout key),
/// nil = not held by this reader.
pub const REDISSON_READ_UNLOCK: &str = "\
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
local holds = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if holds == 0 then
  redis.call('hdel', KEYS[1], ARGV[2])
end
redis.call('del', KEYS[3] .. ':' .. (holds + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local longest = -3
  for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    local count = tonumber(redis.call('hget', KEYS[1], field))
    if type(count) == 'number' then
      for i = count, 1, -1 do
        local left = redis.call('pttl', KEYS[4] .. ':' .. field .. ':rwlock_timeout:' .. i)
        longest = math.max(left, longest)
      end
    end
  end
  if longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1";

/// `RReadWriteLock.writeLock()`'s lock script. KEYS: lock; ARGV: lease ms, writer name
/// (`<client>:<thread>:write`). nil when granted, else the lock's pttl.
pub const REDISSON_WRITE_LOCK: &str = "\
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' then
  if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    local left = redis.call('pttl', KEYS[1])
    redis.call('pexpire', KEYS[1], left + ARGV[1])
    return nil
  end
end
return redis.call('pttl', KEYS[1])";

/// `RReadWriteLock.writeLock()`'s unlock script. KEYS: lock, channel; ARGV: read-unlock message
/// (1: wake every waiter), lease ms, writer name. 1 = released, 0 = re-entered hold counted
/// down, nil = not held by this writer.
pub const REDISSON_WRITE_UNLOCK: &str = "\
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
if mode == 'write' then
  if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
  end
  local holds = redis.call('hincrby', KEYS[1], ARGV[3], -1)
  if holds > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
  end
  redis.call('hdel', KEYS[1], ARGV[3])
  if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[2], ARGV[1])
  else
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  return 1
end
return nil";

/// `RSemaphore.tryAcquire(permits)`. KEYS: semaphore (a string counting free permits); ARGV:
/// permits wanted. 1 = taken, 0 = not enough free.
pub const REDISSON_SEMAPHORE_ACQUIRE: &str = "\
local free = redis.call('get', KEYS[1])
if free ~= false and tonumber(free) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1])
  return 1
end
return 0";

/// `RSemaphore.release(permits)`. KEYS: semaphore, channel; ARGV: permits. Publishes the free
/// count, which wakes every subscribed waiter.
pub const REDISSON_SEMAPHORE_RELEASE: &str = "\
local free = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], free)";

/// `RLock`'s unlock message and `RReadWriteLock`'s read-unlock message (`LockPubSub`).
const UNLOCK_MESSAGE: &str = "0";
const READ_UNLOCK_MESSAGE: &str = "1";

/// Redisson's name for a derived key or channel: `<prefix>:{<name>}`, or `<prefix>:<name>` when
/// the name already has a hash tag.
fn prefixed(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// `{<name>}`, or the name itself when it already has a hash tag (Redisson's `suffixName`
/// base).
fn tagged(name: &str) -> String {
    if name.contains('{') {
        name.to_string()
    } else {
        format!("{{{name}}}")
    }
}

pub fn rwlock_channel(key: &str) -> String {
    prefixed("redisson_rwlock", key)
}

pub fn semaphore_channel(key: &str) -> String {
    prefixed("redisson_sc", key)
}

/// SHA1s of the family's Redisson scripts on one server.
#[derive(Clone)]
pub struct FamilyScripts {
    read_lock: String,
    read_unlock: String,
    write_lock: String,
    write_unlock: String,
    semaphore_acquire: String,
    semaphore_release: String,
}

impl FamilyScripts {
    pub fn load(server: &Server) -> FamilyScripts {
        let mut con = server.connect();
        let mut load = |source: &str| super::load_script(&mut con, source);
        FamilyScripts {
            read_lock: load(REDISSON_READ_LOCK),
            read_unlock: load(REDISSON_READ_UNLOCK),
            write_lock: load(REDISSON_WRITE_LOCK),
            write_unlock: load(REDISSON_WRITE_UNLOCK),
            semaphore_acquire: load(REDISSON_SEMAPHORE_ACQUIRE),
            semaphore_release: load(REDISSON_SEMAPHORE_RELEASE),
        }
    }
}

/// The kind of hold one acquisition asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A read lock: `SHARED` / `readLock()`.
    Shared,
    /// A write lock: no option / `writeLock()`.
    Exclusive,
    /// One permit: `LIMIT 4` / `RSemaphore.acquire()`.
    Permit,
}

/// Who is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldApproach {
    Module,
    RedissonReadWrite,
    RedissonSemaphore,
}

impl HoldApproach {
    pub fn label(self) -> &'static str {
        match self {
            HoldApproach::Module => "LOCK.* module",
            HoldApproach::RedissonReadWrite => "Redisson RReadWriteLock (Lua + pub/sub)",
            HoldApproach::RedissonSemaphore => "Redisson RSemaphore (Lua + pub/sub)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            HoldApproach::Module => "module",
            HoldApproach::RedissonReadWrite => "rrwlock",
            HoldApproach::RedissonSemaphore => "rsemaphore",
        }
    }
}

/// One simulated client of a read-write lock or semaphore.
pub trait HoldClient: Send {
    /// Takes a hold of kind `mode` on `key`, waiting as the recipe waits. `Ok(false)`: a wait
    /// ran out without a grant (the caller asks again or stops); `Err`: the server refused the
    /// request (e.g. a module without the option).
    fn acquire(&mut self, key: &str, mode: Mode) -> Result<bool, String>;
    fn release(&mut self, key: &str, mode: Mode) -> Result<(), String>;
    fn tally(&self) -> Tally;
}

/// A client of `approach` numbered `id`.
pub fn hold_client(
    approach: HoldApproach,
    server: &Server,
    scripts: &FamilyScripts,
    id: usize,
) -> Box<dyn HoldClient> {
    match approach {
        HoldApproach::Module => Box::new(ModuleHoldClient::new(server, id)),
        HoldApproach::RedissonReadWrite => Box::new(RedissonRwClient::new(server, scripts, id)),
        HoldApproach::RedissonSemaphore => {
            Box::new(RedissonSemaphoreClient::new(server, scripts, id))
        }
    }
}

/// "ERR syntax error" rather than the crate's prose.
pub fn server_error(error: redis::RedisError) -> String {
    match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => error.to_string(),
    }
}

/// The module: `LOCK.ACQUIRE key owner lease [SHARED | LIMIT 4] WAIT t`, `LOCK.RELEASE`.
pub struct ModuleHoldClient {
    con: redis::Connection,
    owner: String,
    tally: Tally,
}

impl ModuleHoldClient {
    pub fn new(server: &Server, id: usize) -> ModuleHoldClient {
        ModuleHoldClient {
            con: server.connect(),
            owner: owner_id(id),
            tally: Tally::default(),
        }
    }
}

/// The words after the lease that ask for `mode`.
pub fn module_options(mode: Mode) -> Vec<String> {
    match mode {
        Mode::Shared => vec!["SHARED".into()],
        Mode::Exclusive => vec![],
        Mode::Permit => vec!["LIMIT".into(), PERMITS.to_string()],
    }
}

impl HoldClient for ModuleHoldClient {
    fn acquire(&mut self, key: &str, mode: Mode) -> Result<bool, String> {
        self.tally.commands_sent += 1;
        let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(&self.owner)
            .arg(LEASE_MS)
            .arg(module_options(mode))
            .arg("WAIT")
            .arg(WAIT_MS)
            .query(&mut self.con)
            .map_err(server_error)?;
        Ok(token.is_some())
    }

    fn release(&mut self, key: &str, _mode: Mode) -> Result<(), String> {
        self.tally.commands_sent += 1;
        let remaining: Option<i64> = redis::cmd("LOCK.RELEASE")
            .arg(key)
            .arg(&self.owner)
            .query(&mut self.con)
            .map_err(server_error)?;
        match remaining {
            Some(0) => Ok(()),
            other => Err(format!("LOCK.RELEASE by the holder answered {other:?}")),
        }
    }

    fn tally(&self) -> Tally {
        self.tally
    }
}

/// A Redisson instance's subscription connection: SUBSCRIBE before waiting, one message (or a
/// timeout) per wait, UNSUBSCRIBE once acquired, as `RedissonLock.lock()` and
/// `RedissonSemaphore.acquire()` do. Messages are counted as wake-ups.
struct Subscription {
    con: RawConn,
}

impl Subscription {
    fn connect(server: &Server) -> Subscription {
        Subscription {
            con: RawConn::connect(server.address(0)).expect("subscription connection"),
        }
    }

    fn subscribe(&mut self, channel: &str, tally: &mut Tally) {
        tally.commands_sent += 1;
        self.con
            .send(&[b"SUBSCRIBE", channel.as_bytes()])
            .expect("SUBSCRIBE");
        self.read_until(b"subscribe", tally);
    }

    fn unsubscribe(&mut self, channel: &str, tally: &mut Tally) {
        tally.commands_sent += 1;
        self.con
            .send(&[b"UNSUBSCRIBE", channel.as_bytes()])
            .expect("UNSUBSCRIBE");
        // Messages published before the server saw UNSUBSCRIBE still arrive: wake-ups the
        // server paid for, so they are counted.
        self.read_until(b"unsubscribe", tally);
    }

    fn read_until(&mut self, confirmation: &[u8], tally: &mut Tally) {
        loop {
            let reply = self.con.read().expect("subscription read");
            if reply.is_message() {
                tally.messages_received += 1;
            } else if reply.kind() == Some(confirmation) {
                return;
            }
        }
    }

    /// Waits for one message, at most `timeout` (Redisson's latch `tryAcquire(ttl)`), or
    /// without a limit (`acquire()`).
    fn wait(&mut self, timeout: Option<Duration>, tally: &mut Tally) {
        let reply = match timeout {
            Some(limit) => self.con.read_within(limit).expect("subscription read"),
            None => Some(self.con.read().expect("subscription read")),
        };
        if reply.is_some_and(|r| r.is_message()) {
            tally.messages_received += 1;
        }
    }
}

/// `RReadWriteLock`: `readLock().lock(lease)` / `writeLock().lock(lease)` — try the script; on a
/// ttl, SUBSCRIBE to `redisson_rwlock:{key}`, retry after every message or when the ttl
/// passes, UNSUBSCRIBE once granted (`RedissonLock.lock()`, which both locks inherit).
pub struct RedissonRwClient {
    con: redis::Connection,
    subscription: Subscription,
    /// `<client id>:<thread id>`: the read hold's field.
    reader: String,
    /// `<client id>:<thread id>:write`: the write hold's field.
    writer: String,
    scripts: FamilyScripts,
    tally: Tally,
}

impl RedissonRwClient {
    pub fn new(server: &Server, scripts: &FamilyScripts, id: usize) -> RedissonRwClient {
        let reader = owner_id(id);
        RedissonRwClient {
            con: server.connect(),
            subscription: Subscription::connect(server),
            writer: format!("{reader}:write"),
            reader,
            scripts: scripts.clone(),
            tally: Tally::default(),
        }
    }

    /// `{key}:<reader>:rwlock_timeout`: where each read hold's timeout key lives.
    fn timeout_prefix(&self, key: &str) -> String {
        format!("{}:{}:rwlock_timeout", tagged(key), self.reader)
    }

    /// One run of the lock script: `None` granted, `Some(ttl)` held by others.
    fn try_lock(&mut self, key: &str, mode: Mode) -> Result<Option<i64>, String> {
        self.tally.commands_sent += 1;
        let mut cmd = redis::cmd("EVALSHA");
        match mode {
            Mode::Shared => cmd
                .arg(&self.scripts.read_lock)
                .arg(2)
                .arg(key)
                .arg(self.timeout_prefix(key))
                .arg(LEASE_MS)
                .arg(&self.reader)
                .arg(&self.writer),
            Mode::Exclusive => cmd
                .arg(&self.scripts.write_lock)
                .arg(1)
                .arg(key)
                .arg(LEASE_MS)
                .arg(&self.writer),
            Mode::Permit => unreachable!("RReadWriteLock has no permits"),
        };
        cmd.query(&mut self.con).map_err(server_error)
    }
}

impl HoldClient for RedissonRwClient {
    fn acquire(&mut self, key: &str, mode: Mode) -> Result<bool, String> {
        if self.try_lock(key, mode)?.is_none() {
            return Ok(true);
        }
        let channel = rwlock_channel(key);
        self.subscription.subscribe(&channel, &mut self.tally);
        // Retry right after subscribing: the unlock may have come before the subscription.
        while let Some(ttl_ms) = self.try_lock(key, mode)? {
            let timeout = (ttl_ms >= 0).then(|| Duration::from_millis(ttl_ms as u64));
            self.subscription.wait(timeout, &mut self.tally);
        }
        self.subscription.unsubscribe(&channel, &mut self.tally);
        Ok(true)
    }

    fn release(&mut self, key: &str, mode: Mode) -> Result<(), String> {
        self.tally.commands_sent += 1;
        let channel = rwlock_channel(key);
        let mut cmd = redis::cmd("EVALSHA");
        match mode {
            Mode::Shared => cmd
                .arg(&self.scripts.read_unlock)
                .arg(4)
                .arg(key)
                .arg(&channel)
                .arg(self.timeout_prefix(key))
                .arg(tagged(key))
                .arg(UNLOCK_MESSAGE)
                .arg(&self.reader),
            Mode::Exclusive => cmd
                .arg(&self.scripts.write_unlock)
                .arg(2)
                .arg(key)
                .arg(&channel)
                .arg(READ_UNLOCK_MESSAGE)
                .arg(LEASE_MS)
                .arg(&self.writer),
            Mode::Permit => unreachable!("RReadWriteLock has no permits"),
        };
        let released: Option<i64> = cmd.query(&mut self.con).map_err(server_error)?;
        match (mode, released) {
            (Mode::Shared, Some(0 | 1)) | (Mode::Exclusive, Some(1)) => Ok(()),
            (_, other) => Err(format!("Redisson {mode:?} unlock answered {other:?}")),
        }
    }

    fn tally(&self) -> Tally {
        self.tally
    }
}

/// `RSemaphore.acquire()` / `release()`: try the script; when no permit is free, SUBSCRIBE to
/// `redisson_sc:{key}`, retry after every release message, UNSUBSCRIBE once granted. The
/// semaphore is a plain counter of free permits, set to 4 before the run (`trySetPermits`):
/// permits have no owner and no lease.
pub struct RedissonSemaphoreClient {
    con: redis::Connection,
    subscription: Subscription,
    scripts: FamilyScripts,
    tally: Tally,
}

impl RedissonSemaphoreClient {
    pub fn new(server: &Server, scripts: &FamilyScripts, _id: usize) -> Self {
        RedissonSemaphoreClient {
            con: server.connect(),
            subscription: Subscription::connect(server),
            scripts: scripts.clone(),
            tally: Tally::default(),
        }
    }

    fn try_acquire(&mut self, key: &str) -> Result<bool, String> {
        self.tally.commands_sent += 1;
        let taken: i64 = redis::cmd("EVALSHA")
            .arg(&self.scripts.semaphore_acquire)
            .arg(1)
            .arg(key)
            .arg(1)
            .query(&mut self.con)
            .map_err(server_error)?;
        Ok(taken == 1)
    }
}

impl HoldClient for RedissonSemaphoreClient {
    fn acquire(&mut self, key: &str, _mode: Mode) -> Result<bool, String> {
        if self.try_acquire(key)? {
            return Ok(true);
        }
        let channel = semaphore_channel(key);
        self.subscription.subscribe(&channel, &mut self.tally);
        while !self.try_acquire(key)? {
            self.subscription
                .wait(Some(SEMAPHORE_SAFETY_WAIT), &mut self.tally);
        }
        self.subscription.unsubscribe(&channel, &mut self.tally);
        Ok(true)
    }

    fn release(&mut self, key: &str, _mode: Mode) -> Result<(), String> {
        self.tally.commands_sent += 1;
        let _: Option<i64> = redis::cmd("EVALSHA")
            .arg(&self.scripts.semaphore_release)
            .arg(2)
            .arg(key)
            .arg(semaphore_channel(key))
            .arg(1)
            .query(&mut self.con)
            .map_err(server_error)?;
        Ok(())
    }

    fn tally(&self) -> Tally {
        self.tally
    }
}

/// Sets the Redisson semaphore's free permits before a run (`RSemaphore.trySetPermits`).
pub fn set_permits(server: &Server, key: &str) {
    let mut con = server.connect();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(PERMITS)
        .query(&mut con)
        .expect("SET permits");
}

/// Whether a module reply is a grant (a positive token).
pub fn is_grant(reply: &Resp) -> bool {
    matches!(reply, Resp::Int(token) if *token > 0)
}
