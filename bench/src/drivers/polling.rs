//! The `SET NX PX` recipe: `SET key token NX PX lease`; when that fails, sleep and try again.
//! Release with the compare-and-delete script so a client never deletes another's lock.

use std::time::Duration;

use rand::Rng;

use super::{LockClient, Scripts, Tally, LEASE_MS};
use lock_testkit::Server;

/// Sleep between attempts, uniformly random in this range (jitter keeps clients from polling in
/// lockstep). Shorter than redsync's default 50–250 ms, so the recipe is shown at its fastest
/// handoff, and paid for in polls.
pub const POLL_INTERVAL_MS: (u64, u64) = (1, 10);

pub struct PollingClient {
    con: redis::Connection,
    id: usize,
    acquisitions: u64,
    token: String,
    scripts: Scripts,
    tally: Tally,
}

impl PollingClient {
    pub fn new(server: &Server, scripts: &Scripts, id: usize) -> PollingClient {
        PollingClient {
            con: server.connect(),
            id,
            acquisitions: 0,
            token: String::new(),
            scripts: scripts.clone(),
            tally: Tally::default(),
        }
    }
}

impl LockClient for PollingClient {
    fn acquire(&mut self, key: &str) -> Option<i64> {
        // A fresh random-looking token per acquisition, as redsync does.
        self.acquisitions += 1;
        self.token = format!("{:016x}{:016x}", self.id, self.acquisitions);
        let mut rng = rand::thread_rng();
        loop {
            self.tally.commands_sent += 1;
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&self.token)
                .arg("NX")
                .arg("PX")
                .arg(LEASE_MS)
                .query(&mut self.con)
                .expect("SET NX PX");
            if set.is_some() {
                return None;
            }
            let (low, high) = POLL_INTERVAL_MS;
            std::thread::sleep(Duration::from_micros(
                rng.gen_range(low * 1000..high * 1000),
            ));
        }
    }

    fn release(&mut self, key: &str) {
        self.tally.commands_sent += 1;
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&self.scripts.compare_and_delete)
            .arg(1)
            .arg(key)
            .arg(&self.token)
            .query(&mut self.con)
            .expect("compare-and-delete script");
        assert_eq!(deleted, 1, "compare-and-delete by the holder");
    }

    fn tally(&self) -> Tally {
        self.tally
    }
}
