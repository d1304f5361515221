//! The approaches being compared and how a client of each one takes and gives back a lock.
//!
//! Each driver does what its real client does, command for command, so that "commands sent per
//! acquisition" and the server's work are the recipe's own and not an artefact of the bench.

pub mod family;
mod module;
pub mod multikey;
mod polling;
mod redisson;

pub use module::ModuleClient;
pub use polling::{PollingClient, POLL_INTERVAL_MS};
pub use redisson::{unlock_channel, RedissonClient};

use crate::resp::Resp;
use lock_testkit::Server;

/// A lease long enough never to run out during a measurement.
pub const LEASE_MS: u64 = 30_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Approach {
    /// `LOCK.ACQUIRE ... [WAIT]` + `LOCK.RELEASE`.
    Module,
    /// Redisson's RLock lock/unlock scripts via EVALSHA, waiting by pub/sub.
    Redisson,
    /// `SET key token NX PX lease` + compare-and-delete script, sleep-and-retry polling.
    Polling,
    /// Plain `SET` + `DEL`: not a lock, the floor any lock is measured against.
    SetDel,
}

impl Approach {
    /// The three locks, in report order.
    pub const LOCKS: [Approach; 3] = [Approach::Module, Approach::Redisson, Approach::Polling];
    /// The locks plus the floor, in report order.
    pub const ALL: [Approach; 4] = [
        Approach::Module,
        Approach::Redisson,
        Approach::Polling,
        Approach::SetDel,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Approach::Module => "LOCK.* module",
            Approach::Redisson => "Redisson RLock (Lua + pub/sub)",
            Approach::Polling => "SET NX PX + CAD (polling)",
            Approach::SetDel => "SET/DEL (floor)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Approach::Module => "module",
            Approach::Redisson => "Redisson",
            Approach::Polling => "SET NX polling",
            Approach::SetDel => "SET/DEL",
        }
    }

    /// The chart's colour for this approach.
    pub fn colour(self) -> &'static str {
        match self {
            Approach::Module => "#1f77b4",
            Approach::Redisson => "#d62728",
            Approach::Polling => "#ff7f0e",
            Approach::SetDel => "#7f7f7f",
        }
    }
}

/// Redisson's RLock lock script (KEYS[1] lock, ARGV[1] lease ms, ARGV[2] owner): nil when
/// acquired, else the holder's remaining ttl. Verbatim from Redisson.
pub const REDISSON_LOCK: &str = "if (redis.call('exists', KEYS[1]) == 0) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

/// Redisson's RLock unlock script (KEYS[1] lock, KEYS[2] channel, ARGV[1] unlock message,
/// ARGV[2] lease ms, ARGV[3] owner). Verbatim from Redisson.
pub const REDISSON_UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end; return nil;";

/// The compare-and-delete release every `SET NX PX` recipe uses (redsync, the Redis docs).
pub const COMPARE_AND_DELETE: &str =
    "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";

/// `SCRIPT LOAD`: the script's SHA1, for EVALSHA.
pub fn load_script(con: &mut redis::Connection, source: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(con)
        .expect("SCRIPT LOAD")
}

/// SHA1s of the scripts, loaded once per server with SCRIPT LOAD; clients call EVALSHA.
#[derive(Clone)]
pub struct Scripts {
    pub redisson_lock: String,
    pub redisson_unlock: String,
    pub compare_and_delete: String,
}

impl Scripts {
    pub fn load(server: &Server) -> Scripts {
        let mut con = server.connect();
        let mut load = |source: &str| load_script(&mut con, source);
        Scripts {
            redisson_lock: load(REDISSON_LOCK),
            redisson_unlock: load(REDISSON_UNLOCK),
            compare_and_delete: load(COMPARE_AND_DELETE),
        }
    }
}

/// What a client sent and received, counted on the client side.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub commands_sent: u64,
    /// Pub/sub unlock messages received (Redisson's wake-ups).
    pub messages_received: u64,
}

/// One simulated client of a lock: its own connection(s), its own owner id.
pub trait LockClient: Send {
    /// Takes the lock on `key`, waiting as the recipe waits; returns the fencing token when
    /// the approach has one.
    fn acquire(&mut self, key: &str) -> Option<i64>;
    fn release(&mut self, key: &str);
    fn tally(&self) -> Tally;
}

/// A client of `approach` numbered `id`.
pub fn client(
    approach: Approach,
    server: &Server,
    scripts: &Scripts,
    id: usize,
) -> Box<dyn LockClient> {
    match approach {
        Approach::Module => Box::new(ModuleClient::new(server, id)),
        Approach::Redisson => Box::new(RedissonClient::new(server, scripts, id)),
        Approach::Polling => Box::new(PollingClient::new(server, scripts, id)),
        Approach::SetDel => unreachable!("SET/DEL is not a lock; it is only the throughput floor"),
    }
}

/// An owner id shaped like Redisson's `<client uuid>:<thread id>`, the same length for every
/// approach so that key and value sizes do not favour one of them.
pub fn owner_id(id: usize) -> String {
    format!("5f0e8c1a-3b7d-4e29-9c44-{id:012x}:1")
}

/// A command as its arguments, the one description both the `redis` crate and the raw RESP
/// client send.
pub type Args = Vec<Vec<u8>>;

fn args<const N: usize>(parts: [&[u8]; N]) -> Args {
    parts.iter().map(|p| p.to_vec()).collect()
}

/// The two commands of one uncontended acquire+release pair on `key`.
pub fn pair_args(approach: Approach, scripts: &Scripts, key: &str, owner: &str) -> (Args, Args) {
    let lease = LEASE_MS.to_string();
    let (key, owner, lease) = (key.as_bytes(), owner.as_bytes(), lease.as_bytes());
    match approach {
        Approach::Module => (
            args([b"LOCK.ACQUIRE", key, owner, lease]),
            args([b"LOCK.RELEASE", key, owner]),
        ),
        Approach::Redisson => {
            let channel = unlock_channel(std::str::from_utf8(key).expect("UTF-8 key"));
            (
                args([
                    b"EVALSHA",
                    scripts.redisson_lock.as_bytes(),
                    b"1",
                    key,
                    lease,
                    owner,
                ]),
                args([
                    b"EVALSHA",
                    scripts.redisson_unlock.as_bytes(),
                    b"2",
                    key,
                    channel.as_bytes(),
                    b"0",
                    lease,
                    owner,
                ]),
            )
        }
        Approach::Polling => (
            args([b"SET", key, owner, b"NX", b"PX", lease]),
            args([
                b"EVALSHA",
                scripts.compare_and_delete.as_bytes(),
                b"1",
                key,
                owner,
            ]),
        ),
        Approach::SetDel => (args([b"SET", key, owner]), args([b"DEL", key])),
    }
}

/// `args` as a `redis` crate command.
pub fn as_cmd(args: &Args) -> redis::Cmd {
    let mut cmd = redis::cmd(std::str::from_utf8(&args[0]).expect("ASCII command name"));
    for arg in &args[1..] {
        cmd.arg(arg.as_slice());
    }
    cmd
}

/// The two commands of one pair, for the `redis` crate.
pub fn pair_commands(
    approach: Approach,
    scripts: &Scripts,
    key: &str,
    owner: &str,
) -> (redis::Cmd, redis::Cmd) {
    let (acquire, release) = pair_args(approach, scripts, key, owner);
    (as_cmd(&acquire), as_cmd(&release))
}

/// Whether a reply to a pair's acquire means the lock was taken.
pub fn acquired(approach: Approach, reply: &Resp) -> bool {
    match approach {
        Approach::Module => matches!(reply, Resp::Int(token) if *token > 0),
        Approach::Redisson => *reply == Resp::Bulk(None),
        Approach::Polling | Approach::SetDel => *reply == Resp::Simple("OK".into()),
    }
}
