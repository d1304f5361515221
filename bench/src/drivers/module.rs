//! The module: one `LOCK.ACQUIRE ... WAIT` that the server answers when the lock is ours, one
//! `LOCK.RELEASE`. No retries, no subscriptions.

use super::{owner_id, LockClient, Tally, LEASE_MS};
use lock_testkit::Server;

/// How long one blocking acquire may wait before the client asks again. Long: in the
/// benchmark a timeout would mean the lock was starved.
const WAIT_MS: u64 = 10_000;

pub struct ModuleClient {
    con: redis::Connection,
    owner: String,
    tally: Tally,
}

impl ModuleClient {
    pub fn new(server: &Server, id: usize) -> ModuleClient {
        ModuleClient {
            con: server.connect(),
            owner: owner_id(id),
            tally: Tally::default(),
        }
    }
}

impl LockClient for ModuleClient {
    fn acquire(&mut self, key: &str) -> Option<i64> {
        loop {
            self.tally.commands_sent += 1;
            let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg(&self.owner)
                .arg(LEASE_MS)
                .arg("WAIT")
                .arg(WAIT_MS)
                .query(&mut self.con)
                .expect("LOCK.ACQUIRE");
            if token.is_some() {
                return token;
            }
        }
    }

    fn release(&mut self, key: &str) {
        self.tally.commands_sent += 1;
        let remaining: Option<i64> = redis::cmd("LOCK.RELEASE")
            .arg(key)
            .arg(&self.owner)
            .query(&mut self.con)
            .expect("LOCK.RELEASE");
        assert_eq!(remaining, Some(0), "LOCK.RELEASE by the holder");
    }

    fn tally(&self) -> Tally {
        self.tally
    }
}
