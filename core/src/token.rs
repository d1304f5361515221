//! Fencing tokens: strictly increasing per lock key, across deletions, restarts, failovers and
//! slot migrations.
//!
//! Each cluster slot (per database) has a counter key holding a **bound**: a value at least as
//! large as every token ever handed out for that slot. A new token is above the bound it reads,
//! so tokens rise wherever the bound goes (it persists, replicates and migrates with the slot).
//!
//! Writing and replicating the bound on every grant would be most of a grant's cost, so the
//! module *reserves* a window: it stores `token + WINDOW` once and then hands out tokens from
//! that window from memory, writing nothing until the window is used up. The in-memory
//! reservation is trusted only while the stored bound still equals the bound it wrote; any
//! other value (FLUSHALL, a deleted or rewritten counter, a slot that came back from another
//! node, a reload) means someone else may have handed out tokens, and the next token goes
//! above the stored value again.
//!
//! In a cluster the counter moves with its slot, and a node mints only from a counter it holds:
//! while a slot is being moved to or from a node (or is owned elsewhere), a node that finds no
//! counter refuses the grant with `TRYAGAIN` instead of starting one from its clock. The
//! importing node's counter has not arrived yet, or the migrating node's has already left; in
//! both cases the counter on the other node is above tokens this node's clock may be below
//! (every hand-over of a slot runs its tokens up to a window ahead of the clock).
//!
//! Tokens also never fall below the server clock (`now_ms * 1000`): if the bound is lost or
//! rolled back (FLUSHALL, an RDB snapshot older than the last reservation, a failover to a
//! replica that missed it), a later clock reading is above every earlier token unless the clock
//! went back, a slot sustained more than 1,000 grants per millisecond, or tokens had run ahead
//! of the clock (by about a window: see [`WINDOW`] and `next_token`'s reservation).

use crate::layout::MAX_STORED_INTEGER;
use crate::{LockError, UnixMs};

/// Token values per millisecond of the server clock: a token is never below `now_ms * 1000`.
pub const TOKENS_PER_MS: u64 = 1_000;

/// How far ahead of a token its stored bound is reserved: one second of clock. A slot's bound
/// is then written at most about once a second while the slot grants (or once per million
/// grants). A promoted replica starts its tokens above the bound it holds, up to a window ahead
/// of its clock, and that window must be shorter than the time between two promotions: a
/// replica promoted after the first promoted one failed may have missed all of that one's
/// writes, and goes above the same bound again; by then its clock must be past every token
/// the first one handed out. A minute's window handed the same tokens out twice after two
/// failovers a few seconds apart (`tokens_rise_through_failovers_that_lose_writes`); with a
/// second, a replica promoted a Sentinel `down-after-milliseconds` of 1 s after its master's
/// last grant keeps tokens rising. The window is one of clock (see `next_token`).
pub const WINDOW: u64 = 1_000 * TOKENS_PER_MS;

/// What a node found in a slot's counter key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// The bound the counter holds.
    Bound(u64),
    /// No counter (or one that holds no number) on a node that serves the slot and is moving it
    /// nowhere, or outside a cluster: the slot has none here (its first grant, a flush), and
    /// tokens start above what this process handed out and the clock.
    Missing,
    /// No counter on a node the slot is being moved to or from (or that does not own it): the
    /// counter may be on the other node, holding a bound above tokens handed out there, which
    /// this node's clock and memory may be below. No token can be minted here until it arrives.
    Elsewhere,
}

impl Counter {
    fn bound(self) -> Option<u64> {
        match self {
            Counter::Bound(bound) => Some(bound),
            Counter::Missing | Counter::Elsewhere => None,
        }
    }
}

impl From<Option<u64>> for Counter {
    /// A counter read on a node that serves its slot settled: a missing one is `Missing`.
    fn from(stored: Option<u64>) -> Self {
        stored.map_or(Counter::Missing, Counter::Bound)
    }
}

/// The token for a new hold, and the new bound to store (and replicate) when one is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub token: u64,
    pub store_bound: Option<u64>,
}

/// What this process remembers of one slot: the last token it handed out there, in *any*
/// database, and per database the bound it reserved in that database's counter.
///
/// The last token is kept across databases because `SWAPDB` and `MOVE` carry lock keys (and
/// counters) from one database to another: a key's next token must be above every token this
/// process handed out for that name, wherever the counter it now reads came from. The bounds
/// are kept per database so that a slot used in several databases keeps a window in each,
/// instead of reserving a new one (a window ahead of the clock) at every switch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotMemory {
    last: Option<u64>,
    bounds: Vec<(i32, u64)>,
}

impl SlotMemory {
    /// The next token for a key of this slot in `db`, whose counter was found as `counter`;
    /// remembers it (and the new bound, which the caller stores and replicates).
    pub fn next_token(
        &mut self,
        db: i32,
        counter: impl Into<Counter>,
        now: UnixMs,
    ) -> Result<Grant, LockError> {
        let bound = self.bounds.iter().find(|(d, _)| *d == db).map(|(_, b)| *b);
        let grant = next_token(counter.into(), self.last, bound, now)?;
        self.last = Some(grant.token);
        if let Some(new) = grant.store_bound {
            match self.bounds.iter_mut().find(|(d, _)| *d == db) {
                Some(entry) => entry.1 = new,
                None => self.bounds.push((db, new)),
            }
        }
        Ok(grant)
    }

    /// The counters of `db` (of every database: `None`) are gone — a flush, or a replica's
    /// load that replaced its databases with its master's — and with them the bounds reserved
    /// in them: a counter found there later was written by someone else, even one that holds
    /// the very value reserved here (another server that reserved the same bound, and may have
    /// handed out tokens of that window). The last token stays: it is the slot's.
    pub fn forget_bounds(&mut self, db: Option<i32>) -> Vec<(i32, u64)> {
        let mut forgotten = Vec::new();
        self.bounds.retain(|&(d, bound)| {
            let keep = db.is_some_and(|db| d != db);
            if !keep {
                forgotten.push((d, bound));
            }
            keep
        });
        forgotten
    }

    /// The last token this process handed out in the slot, in any database.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// The databases this process reserved a window in (wrote the slot's counter).
    pub fn reserved_databases(&self) -> impl Iterator<Item = i32> + '_ {
        self.bounds.iter().map(|(db, _)| *db)
    }

    /// `SWAPDB a b` swapped the two databases' counters with their data: the reserved bounds
    /// follow them (the last token stays: it is the slot's, whatever the database).
    pub fn swap_databases(&mut self, a: i32, b: i32) {
        for (db, _) in &mut self.bounds {
            if *db == a {
                *db = b;
            } else if *db == b {
                *db = a;
            }
        }
    }
}

/// Decides the next token from the slot's counter, the last token this process handed out in
/// the slot, the bound it reserved in this database's counter, and the server clock. A counter
/// that is `Elsewhere` refuses the grant (`TRYAGAIN`): nothing here bounds the tokens handed out
/// where it is.
///
/// Tokens are signed 64-bit integers on the wire. A token above `i64::MAX` cannot be given, and
/// saturating would repeat one, so past the limit every grant in the slot is refused: only a
/// counter written by hand near the limit can get there (the clock floor is about 2^60 in the
/// year 2200). The stored bound is capped at the limit instead: a window may just end early.
pub fn next_token(
    counter: Counter,
    last: Option<u64>,
    reserved_bound: Option<u64>,
    now: UnixMs,
) -> Result<Grant, LockError> {
    if counter == Counter::Elsewhere {
        return Err(LockError::CounterElsewhere);
    }
    let stored = counter.bound();
    let floor = now.saturating_mul(TOKENS_PER_MS).max(1);
    let above = |known: Option<u64>| known.map_or(Some(0), |v| v.checked_add(1));
    // Above what this process handed out, and the clock.
    let next = above(last)
        .map(|t| t.max(floor))
        .filter(|t| *t <= MAX_STORED_INTEGER)
        .ok_or(LockError::TokensExhausted)?;
    // Inside the window this process reserved, while nobody else changed the counter: nothing
    // to write.
    if let Some(bound) = reserved_bound.filter(|b| stored == Some(*b)) {
        if next <= bound {
            return Ok(Grant {
                token: next,
                store_bound: None,
            });
        }
    }
    // Otherwise go above the stored bound too, and reserve a new window: a window of clock
    // (up to a window ahead of the clock, not of the token), and past a token already ahead of
    // the clock, a millisecond's tokens. Reserved from the token, each restart, flush or
    // hand-over that went above a bound it did not write added a window to how far tokens ran
    // ahead of the clock, and a failover a down-after later handed them out again.
    let token = above(stored)
        .map(|t| t.max(next))
        .filter(|t| *t <= MAX_STORED_INTEGER)
        .ok_or(LockError::TokensExhausted)?;
    let reserved = token
        .saturating_add(TOKENS_PER_MS)
        .max(floor.saturating_add(WINDOW));
    Ok(Grant {
        token,
        store_bound: Some(reserved.min(MAX_STORED_INTEGER)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: UnixMs = 1_700_000_000_000;
    const FLOOR: u64 = NOW * TOKENS_PER_MS;

    fn grant(token: u64, store_bound: Option<u64>) -> Grant {
        Grant { token, store_bound }
    }

    #[test]
    fn next_token_in_every_situation() {
        // (stored bound, last token of the slot, bound reserved in this db, want)
        let cases = [
            // A new slot: from the clock, reserving a window.
            (None, None, None, grant(FLOOR, Some(FLOOR + WINDOW))),
            // Inside our window: from memory, nothing to write.
            (
                Some(FLOOR + 10),
                Some(FLOOR + 3),
                Some(FLOOR + 10),
                grant(FLOOR + 4, None),
            ),
            // The clock moved past the last token but is still inside the window.
            (
                Some(FLOOR + WINDOW),
                Some(FLOOR - 5_000),
                Some(FLOOR + WINDOW),
                grant(FLOOR, None),
            ),
            // The window is used up: a new one.
            (
                Some(FLOOR + 10),
                Some(FLOOR + 10),
                Some(FLOOR + 10),
                grant(FLOOR + 11, Some(FLOOR + WINDOW)),
            ),
            // The clock ran past the window.
            (
                Some(FLOOR - 1),
                Some(FLOOR - 9),
                Some(FLOOR - 1),
                grant(FLOOR, Some(FLOOR + WINDOW)),
            ),
            // Someone else moved the bound (another node, a reload, SWAPDB): above it.
            (
                Some(FLOOR + 50),
                Some(FLOOR + 3),
                Some(FLOOR + 10),
                grant(FLOOR + 51, Some(FLOOR + WINDOW)),
            ),
            // The bound was flushed: above what we handed out ourselves, and the clock.
            (
                None,
                Some(FLOOR + 7),
                Some(FLOOR + 10),
                grant(FLOOR + 8, Some(FLOOR + WINDOW)),
            ),
            // Another database's tokens in the same slot count too (no bound reserved here).
            (
                Some(FLOOR + 5),
                Some(FLOOR + 90),
                None,
                grant(FLOOR + 91, Some(FLOOR + WINDOW)),
            ),
            // An old counter that held the last token (or a bound behind the clock).
            (Some(41), None, None, grant(FLOOR, Some(FLOOR + WINDOW))),
            // A bound ahead of the clock (a busy slot, or a restart): above it.
            (
                Some(FLOOR + 500),
                None,
                None,
                grant(FLOOR + 501, Some(FLOOR + WINDOW)),
            ),
            // A bound more than a window ahead of the clock (a restart right after another,
            // a promotion): above it, reserving a millisecond's tokens, not a window more.
            (
                Some(FLOOR + 3 * WINDOW),
                None,
                None,
                grant(
                    FLOOR + 3 * WINDOW + 1,
                    Some(FLOOR + 3 * WINDOW + 1 + TOKENS_PER_MS),
                ),
            ),
            // Near the integer limit the window ends at the limit.
            (
                Some(MAX_STORED_INTEGER - 10),
                None,
                None,
                grant(MAX_STORED_INTEGER - 9, Some(MAX_STORED_INTEGER)),
            ),
        ];
        for (stored, last, bound, want) in cases {
            assert_eq!(
                next_token(stored.into(), last, bound, NOW),
                Ok(want),
                "{stored:?} {last:?} {bound:?}"
            );
        }
    }

    /// A counter written near `i64::MAX`: tokens rise to the limit, each once, and then every
    /// grant is refused — even after the counter is flushed, since this process handed the
    /// limit out itself. Nothing ever repeats or saturates.
    #[test]
    fn tokens_never_repeat_at_the_integer_limit() {
        let mut memory = SlotMemory::default();
        let mut stored = Some(MAX_STORED_INTEGER - 7);
        let mut seen = Vec::new();
        loop {
            match memory.next_token(0, stored, NOW) {
                Ok(g) => {
                    assert!(seen.last().is_none_or(|last| g.token > *last));
                    seen.push(g.token);
                    if let Some(bound) = g.store_bound {
                        stored = Some(bound);
                    }
                }
                Err(e) => {
                    assert_eq!(e, LockError::TokensExhausted);
                    break;
                }
            }
        }
        assert_eq!(seen.len(), 7);
        assert_eq!(seen.last(), Some(&MAX_STORED_INTEGER));
        assert_eq!(
            memory.next_token(0, None, NOW),
            Err(LockError::TokensExhausted)
        );
        assert_eq!(
            next_token(Counter::Bound(MAX_STORED_INTEGER), None, None, NOW),
            Err(LockError::TokensExhausted)
        );
        // A stored value past i64::MAX cannot be read (parse_positive refuses it), but the
        // decision refuses it too.
        assert_eq!(
            next_token(Counter::Bound(u64::MAX), None, None, NOW),
            Err(LockError::TokensExhausted)
        );
    }

    /// The adversarial test's find: grants alternating between db 0 and db 1 in one slot, then
    /// SWAPDB 0 1 (the counters swap with the data). Db 0's next token used to come from db 1's
    /// old, lower bound and repeat one handed out in db 0 before the swap; and every switch of
    /// database reserved a new window, running tokens a window of clock ahead each time.
    #[test]
    fn swapdb_and_alternating_databases_neither_repeat_nor_run_ahead() {
        let mut memory = SlotMemory::default();
        let mut counters = [None, None];
        let take = |memory: &mut SlotMemory, counters: &mut [Option<u64>; 2], db: usize| {
            let g = memory
                .next_token(db as i32, counters[db], NOW)
                .expect("a token");
            if let Some(bound) = g.store_bound {
                counters[db] = Some(bound);
            }
            g.token
        };
        let a = take(&mut memory, &mut counters, 0);
        let b = take(&mut memory, &mut counters, 1);
        let c = take(&mut memory, &mut counters, 0);
        counters.swap(0, 1);
        // Even without knowing of the swap, nothing repeats: the last token is the slot's.
        let mut unaware = memory.clone();
        let mut unaware_counters = counters;
        let e = take(&mut unaware, &mut unaware_counters, 1);
        let d = take(&mut unaware, &mut unaware_counters, 0);
        let tokens = [a, b, c, e, d];
        assert!(tokens.windows(2).all(|w| w[1] > w[0]), "{tokens:?}");
        // Told of the swap (the module is, by the SWAPDB event), no window is lost either.
        memory.swap_databases(0, 1);
        let e = take(&mut memory, &mut counters, 1);
        let d = take(&mut memory, &mut counters, 0);
        let tokens = [a, b, c, e, d];
        assert!(tokens.windows(2).all(|w| w[1] > w[0]), "{tokens:?}");
        // Alternating databases reserves one window per database, not one per switch.
        for _ in 0..100 {
            take(&mut memory, &mut counters, 0);
            take(&mut memory, &mut counters, 1);
        }
        let last = take(&mut memory, &mut counters, 0);
        assert!(
            last < FLOOR + 1_000,
            "tokens ran ahead of the clock: {}",
            last - FLOOR
        );
    }

    /// A replica that once reserved a window loads its master's data, whose counter holds the
    /// same bound (both servers reserved it: the same first token in the same millisecond), and
    /// the master handed out tokens of that window. Remembered, the window would repeat them;
    /// forgotten with the data it was reserved in, the next token goes above the bound.
    #[test]
    fn a_window_reserved_in_replaced_data_is_forgotten() {
        let mut replica = SlotMemory::default();
        let first = replica.next_token(0, Some(FLOOR + 100), NOW).unwrap();
        let mut master = SlotMemory::default();
        let same = master.next_token(0, Some(FLOOR + 100), NOW).unwrap();
        assert_eq!(first, same);
        let bound = first.store_bound;
        let given: Vec<u64> = (0..3)
            .map(|_| master.next_token(0, bound, NOW).unwrap().token)
            .collect();
        // The replica's databases are replaced by the master's: the counter holds `bound`.
        let mut remembering = replica.clone();
        let repeated = remembering.next_token(0, bound, NOW).unwrap().token;
        assert!(given.contains(&repeated), "{repeated} {given:?}");
        replica.forget_bounds(Some(1));
        assert_eq!(
            replica.bounds.len(),
            1,
            "another database's flush forgot db 0's window"
        );
        replica.forget_bounds(None);
        let next = replica.next_token(0, bound, NOW).unwrap().token;
        assert!(next > bound.unwrap(), "{next} {bound:?}");
        // A flush of one database forgets that database's window only.
        let mut two = SlotMemory::default();
        two.next_token(0, None, NOW).unwrap();
        let in_1 = two.next_token(1, None, NOW).unwrap().store_bound;
        two.forget_bounds(Some(0));
        assert_eq!(two.next_token(1, in_1, NOW).unwrap().store_bound, None);
    }

    /// Replays grants through a store that can lose or roll back its bound, and checks that
    /// tokens only ever rise.
    #[test]
    fn tokens_rise_through_restarts_rollbacks_and_clock_jumps() {
        let mut stored: Option<u64> = None;
        let mut memory = SlotMemory::default();
        let mut snapshot: Option<u64> = None;
        let mut highest = 0;
        let mut now = NOW;
        for step in 0..10_000u64 {
            now += step % 3; // several grants per millisecond, sometimes
            match step % 1_000 {
                // An RDB snapshot, and later a restart from it: memory and newer bounds lost.
                100 => snapshot = stored,
                700 => {
                    stored = snapshot;
                    memory = SlotMemory::default();
                    now += 50;
                }
                // FLUSHALL.
                400 => stored = None,
                // The clock goes back a little (NTP step).
                900 => now -= 20,
                _ => {}
            }
            let grant = memory.next_token(0, stored, now).unwrap();
            assert!(grant.token > highest, "step {step}: {grant:?} <= {highest}");
            highest = grant.token;
            if let Some(bound) = grant.store_bound {
                assert!(bound >= grant.token);
                stored = Some(bound);
            }
            assert!(stored.is_some_and(|b| b >= highest));
        }
    }

    #[test]
    fn tokens_stay_exact_in_javascript_for_centuries() {
        let year_2200 = 7_258_118_400_000;
        assert!(
            next_token(Counter::Missing, None, None, year_2200)
                .unwrap()
                .token
                + WINDOW
                < 1 << 53
        );
    }

    /// A slot moved back and forth between two nodes, as a reshard moves it: one key at a time
    /// (the counter among them, at a random place), grants asked where Redis sends them (a key
    /// still on the migrating node there, any other on the importing node with `ASKING`), and
    /// holds released and taken again throughout. Each key's tokens must rise, whichever node
    /// hands them out. Run once as the module reads counters (a missing counter is `Elsewhere`
    /// while the slot moves) and once as it read them before (always `Missing`), which the
    /// model must catch falling: a node that served the slot before minted from its clock while
    /// the other node's counter, a window ahead, had not arrived.
    #[test]
    fn tokens_of_a_key_rise_while_its_slot_moves_back_and_forth() {
        assert_eq!(migration_model(true, 40), Ok(()));
        let unaware = migration_model(false, 40);
        assert!(
            unaware.as_ref().is_err_and(|e| e.contains("fell")),
            "the model did not catch the old reading: {unaware:?}"
        );
    }

    /// The models' random numbers: `next(n)` is below `n`, the same sequence for a seed
    /// (xorshift).
    fn seeded(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        }
    }

    /// Runs `seeds` seeded histories of the model above; the first fall found, if any.
    fn migration_model(aware: bool, seeds: u64) -> Result<(), String> {
        const KEYS: usize = 4;
        // The counter is "key" KEYS in `on`.
        #[derive(Default, Clone)]
        struct Node {
            memory: SlotMemory,
            counter: Option<u64>,
            on: [bool; KEYS + 1],
        }
        for seed in 1..=seeds {
            let mut next = seeded(seed);
            let mut nodes = [Node::default(), Node::default()];
            let mut owner = 0usize;
            let mut now = NOW;
            let mut last: [Option<u64>; KEYS] = [None; KEYS];
            // On `node`, a grant of `key`: Ok(false) when refused (TRYAGAIN), Err on a fall.
            let mut grant = |nodes: &mut [Node; 2], node: usize, key: usize, moving: bool, now| {
                let n = &mut nodes[node];
                let counter = match n.counter {
                    Some(bound) => Counter::Bound(bound),
                    None if aware && moving => Counter::Elsewhere,
                    None => Counter::Missing,
                };
                match n.memory.next_token(0, counter, now) {
                    Err(LockError::CounterElsewhere) => return Ok(()),
                    Err(e) => return Err(format!("seed {seed}: {e}")),
                    Ok(g) => {
                        if let Some(bound) = g.store_bound {
                            n.counter = Some(bound);
                            n.on[KEYS] = true;
                        }
                        if last[key].is_some_and(|before| g.token <= before) {
                            return Err(format!(
                                "seed {seed}: key {key}'s token fell from {:?} to {}",
                                last[key], g.token
                            ));
                        }
                        last[key] = Some(g.token);
                        n.on[key] = true;
                    }
                }
                Ok(())
            };
            for _round in 0..6 {
                // Settled on the owner: grants and releases.
                for _ in 0..20 {
                    now += next(3);
                    let key = next(KEYS as u64) as usize;
                    if next(2) == 0 {
                        grant(&mut nodes, owner, key, false, now)?;
                    } else {
                        nodes[owner].on[key] = false;
                    }
                }
                // The slot moves to the other node, one key at a time in a random order.
                let (from, to) = (owner, 1 - owner);
                let mut order: Vec<usize> = (0..=KEYS).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, next(i as u64 + 1) as usize);
                }
                for moved in order {
                    for _ in 0..next(4) {
                        now += next(2);
                        let key = next(KEYS as u64) as usize;
                        // Redis serves a key on the migrating node while it is there, and
                        // sends every other to the importing node (ASK).
                        let at = if nodes[from].on[key] { from } else { to };
                        if next(3) == 0 {
                            nodes[at].on[key] = false;
                        } else {
                            grant(&mut nodes, at, key, true, now)?;
                        }
                    }
                    // MIGRATE: the key (or the counter) leaves `from` for `to`.
                    if nodes[from].on[moved] {
                        nodes[from].on[moved] = false;
                        nodes[to].on[moved] = true;
                        if moved == KEYS {
                            nodes[to].counter = nodes[from].counter.take();
                        }
                    }
                }
                owner = to;
            }
        }
        Ok(())
    }

    /// Sentinel's `down-after-milliseconds`, 1 s (a third of the 3 s docs/sentinel.md advises): a
    /// replica is promoted at least this long after its failed master's last grant.
    const DOWN_AFTER_MS: u64 = 1_000;

    /// One server of the failover model: what its process remembers and its slot's counter.
    #[derive(Default, Clone, Debug)]
    struct Server {
        memory: SlotMemory,
        counter: Option<u64>,
    }

    impl Server {
        fn grant(&mut self, now: UnixMs) -> u64 {
            let grant = self.memory.next_token(0, self.counter, now).unwrap();
            if let Some(bound) = grant.store_bound {
                self.counter = Some(bound);
            }
            grant.token
        }

        /// A restart that kept the data (the AOF): the process's memory is gone.
        fn restart(&mut self) {
            self.memory = SlotMemory::default();
        }

        /// `FLUSHALL` as `store::flushing`/`flushed`/`restore_flushed_counters` carry it out
        /// (outside a cluster): the counter is written back with the highest of what it held,
        /// the window reserved in it and the last token, and the window is forgotten.
        fn flushall(&mut self) {
            let held = self.counter.take();
            let last = self.memory.last().unwrap_or(0);
            let mut restored = if self.memory.reserved_databases().any(|db| db == 0) {
                held
            } else {
                None
            };
            for (_, bound) in self.memory.forget_bounds(None) {
                restored = Some(restored.unwrap_or(0).max(bound).max(last));
            }
            self.counter = restored;
        }

        /// The server follows another master (`became_replica`): the windows it reserved are
        /// not its own any more, even where no resync replaces its data.
        fn demoted(&mut self) {
            self.memory.forget_bounds(None);
        }

        /// A replica that got `master`'s writes up to now (its memory stays its own).
        fn replica_of(master: &Server) -> Server {
            Server {
                memory: SlotMemory::default(),
                counter: master.counter,
            }
        }
    }

    /// What happens in the failover model besides grants and failovers.
    #[derive(Debug, Clone, Copy)]
    struct Knobs {
        /// The least time between two promotions.
        promotions_apart_ms: u64,
        /// One step in this many (0: never), the master restarts in place (AOF), 100 ms.
        restarts: u64,
        /// One step in this many (0: never), the master takes a FLUSHALL.
        flushes: u64,
    }

    /// Three servers, one master at a time, replication that loses writes: each write of the
    /// counter reaches each replica soon, or, while its link is down (for seconds), not at all;
    /// a replica is promoted with whatever it got, a down-after after its master's last grant
    /// (the old master, restarted or not, follows it, with or without a resync). Every grant
    /// must be above every grant before it, whichever master made it. The first fall, if any.
    fn failover_model(knobs: Knobs, seeds: u64) -> Result<(), String> {
        for seed in 1..=seeds {
            let mut next = seeded(seed);
            let mut servers = vec![Server::default(); 3];
            let mut master = 0usize;
            let mut now = NOW;
            let mut promoted_at = NOW;
            let mut highest = 0u64;
            let mut linked = [true; 3];
            for step in 0..3_000 {
                now += next(40);
                if knobs.restarts > 0 && next(knobs.restarts) == 0 {
                    servers[master].restart();
                    now += 100;
                }
                // A flush before the restarted process granted is the documented exception (it
                // knows nothing to write back, and the counter and its memory are both gone).
                let granted = servers[master].memory.last().is_some();
                if knobs.flushes > 0 && next(knobs.flushes) == 0 && granted {
                    servers[master].flushall();
                }
                let token = servers[master].grant(now);
                if token <= highest {
                    return Err(format!(
                        "seed {seed}, step {step}: token {token} after {highest} ({knobs:?})"
                    ));
                }
                highest = token;
                // Replication: a replica whose link is up gets the master's counter now or a
                // little later; a link goes down (a partition) and up again now and then.
                for r in 0..servers.len() {
                    if next(60) == 0 {
                        linked[r] = !linked[r];
                    }
                    if r != master && linked[r] && next(3) == 0 {
                        servers[r].counter = servers[master].counter;
                    }
                }
                if now - promoted_at >= knobs.promotions_apart_ms && next(20) == 0 {
                    let old = master;
                    master = (master + 1 + next(2) as usize) % servers.len();
                    // The old master's last grant was before it failed; the Sentinels notice
                    // the failure a down-after later.
                    now += DOWN_AFTER_MS;
                    promoted_at = now;
                    if next(2) == 0 {
                        servers[old].restart();
                    } else {
                        servers[old].demoted();
                    }
                }
            }
        }
        Ok(())
    }

    /// The failover model with promotions a down-after apart, and with restarts in place and
    /// flushes between them. A window reserved from the token (not the clock) with a minute's
    /// length handed tokens out twice after two failovers a few seconds apart (the partition
    /// test's `{plain:b}`, seed 2); with a second's, restarts or flushes a few tenths of a
    /// second apart each added a window to the tokens' lead on the clock, and the next failover
    /// handed them out again (an adversarial review: seed 1, steps 1854 and 234).
    #[test]
    fn tokens_rise_through_failovers_that_lose_writes() {
        for knobs in [
            Knobs {
                promotions_apart_ms: 2 * DOWN_AFTER_MS,
                restarts: 0,
                flushes: 0,
            },
            Knobs {
                promotions_apart_ms: 0,
                restarts: 0,
                flushes: 0,
            },
            Knobs {
                promotions_apart_ms: 2 * DOWN_AFTER_MS,
                restarts: 200,
                flushes: 0,
            },
            Knobs {
                promotions_apart_ms: 2 * DOWN_AFTER_MS,
                restarts: 0,
                flushes: 30,
            },
            Knobs {
                promotions_apart_ms: 0,
                restarts: 100,
                flushes: 100,
            },
        ] {
            assert_eq!(failover_model(knobs, 300), Ok(()));
        }
    }

    /// The review's sequences, each ending with a grant that must be above every token before
    /// it: (what happened, the tokens before, the last grant).
    #[test]
    fn tokens_rise_after_restarts_flushes_and_moves_then_a_failover() {
        let mut cases: Vec<(&str, Vec<u64>, u64)> = Vec::new();
        // Two restarts in place 100 ms apart, then a failover to a replica whose link went
        // down before the first.
        let mut a = Server::default();
        let mut now = NOW;
        let mut seen = vec![a.grant(now)];
        let mut r = Server::replica_of(&a);
        for _ in 0..2 {
            now += 100;
            a.restart();
            seen.push(a.grant(now));
        }
        now += 100;
        seen.push(a.grant(now));
        now += DOWN_AFTER_MS;
        cases.push(("two restarts, then a failover", seen, r.grant(now)));
        // FLUSHALL and a grant, three times 50 ms apart; the replica gets the last write-back
        // but not the reservation after it.
        let mut a = Server::default();
        let mut now = NOW;
        let mut seen = vec![a.grant(now)];
        for _ in 0..3 {
            now += 50;
            a.flushall();
            seen.push(a.grant(now));
        }
        now += 50;
        a.flushall();
        let mut r = Server::replica_of(&a);
        seen.push(a.grant(now));
        now += DOWN_AFTER_MS;
        cases.push(("flushes, then a failover", seen, r.grant(now)));
        // The slot from A to B and back (MIGRATE carries the counter), then A fails over to a
        // replica that got the counter back but not A's reservation after it.
        let mut a = Server::default();
        let mut b = Server::default();
        let mut now = NOW;
        let mut seen = vec![a.grant(now)];
        now += 50;
        b.counter = a.counter.take();
        seen.push(b.grant(now));
        now += 50;
        a.counter = b.counter.take();
        let mut r = Server::replica_of(&a);
        seen.push(a.grant(now));
        now += DOWN_AFTER_MS;
        cases.push(("a slot there and back, then a failover", seen, r.grant(now)));
        // Another minter in the slot that stores its token as the bound (the Functions
        // library), alternating with the module 100 times in 100 ms; a replica that missed
        // the last two writes, promoted 10 s later.
        let mut a = Server::default();
        let mut now = NOW;
        let mut seen = Vec::new();
        for _ in 0..100 {
            now += 1;
            let by_library = (now * TOKENS_PER_MS).max(a.counter.map_or(0, |b| b + 1));
            a.counter = Some(by_library);
            seen.push(by_library);
            seen.push(a.grant(now));
        }
        let mut r = Server {
            memory: SlotMemory::default(),
            counter: Some(seen[seen.len() - 3]),
        };
        now += 10 * DOWN_AFTER_MS;
        cases.push((
            "the module and another minter alternating",
            seen,
            r.grant(now),
        ));
        // A restart (tokens a window ahead), a manual failover to B, whose reservation never
        // reaches A; B fails and A, a replica that kept its data, is promoted again.
        let mut a = Server::default();
        let mut now = NOW;
        let mut seen = vec![a.grant(now)];
        now += 100;
        a.restart();
        seen.push(a.grant(now));
        now += 10;
        let mut b = Server::replica_of(&a);
        a.demoted();
        seen.push(b.grant(now));
        now += DOWN_AFTER_MS;
        cases.push(("a failover and back", seen, a.grant(now)));
        for (what, before, token) in cases {
            let highest = before.iter().copied().max().unwrap_or(0);
            assert!(
                token > highest,
                "{what}: {token} after {highest} ({} below)",
                highest - token
            );
        }
    }
}
