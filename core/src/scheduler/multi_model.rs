//! Model-based, for multi-key requests: random mixes of one-key and multi-key acquires
//! (exclusive and shared, with and without `WAIT`, some bound to connections) on three
//! read-write keys, releases of one key or of every key an owner holds, timeouts, waiters that
//! leave, connections that close, deletes from outside, pauses and undelivered grants — checked
//! against a plain model: one FIFO list per key, a request standing in the list of each of its
//! keys.
//!
//! Properties: a grant goes only to a request that heads the list of every one of its keys
//! (FIFO per key: nobody passes a waiter on a key they share); a multi-key grant writes every
//! key before it is answered (all or nothing) with a token per key that rises on that key;
//! never a writer beside another owner's hold; no request is left waiting while it heads all
//! its lists and every key has room for it (no deadlock, no lost wake-up); every waiter is
//! answered exactly once, a timeout exactly at its deadline; once everyone is done nothing
//! stays scheduled.

use std::collections::HashMap;

use proptest::prelude::*;

use super::testing::*;
use super::*;
use crate::args::Reentry;
use crate::hold::{self, Decision, Lock};
use crate::kind::Queue;

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        /// Which of the three keys (a bit each), in a rotated order.
        keys: u8,
        rotate: u8,
        shared: bool,
        wait: Option<u64>,
        lease: u64,
        client: Option<u8>,
    },
    Release {
        key: u8,
        pick: usize,
    },
    /// An owner releases every key it holds (`LOCK.MRELEASE`).
    ReleaseAll {
        pick: usize,
    },
    Leave {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
    Pause(bool),
    DeleteOutside {
        key: u8,
    },
    Undelivered {
        key: u8,
        pick: usize,
    },
    Disconnect {
        client: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1u8..8, 0u8..3, any::<bool>(), prop_oneof![1 => Just(None), 4 => prop_oneof![Just(Some(0u64)), (1u64..400).prop_map(Some)]], 1u64..300, proptest::option::of(0u8..3))
            .prop_map(|(keys, rotate, shared, wait, lease, client)| Op::Acquire { keys, rotate, shared, wait, lease, client }),
        2 => (0u8..3, any::<usize>()).prop_map(|(key, pick)| Op::Release { key, pick }),
        2 => any::<usize>().prop_map(|pick| Op::ReleaseAll { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Leave { pick }),
        3 => (0u64..200).prop_map(|ms| Op::Advance { ms }),
        1 => any::<bool>().prop_map(Op::Pause),
        1 => (0u8..3).prop_map(|key| Op::DeleteOutside { key }),
        1 => (0u8..3, any::<usize>()).prop_map(|(key, pick)| Op::Undelivered { key, pick }),
        1 => (0u8..3).prop_map(|client| Op::Disconnect { client }),
    ]
}

struct Request {
    keys: Vec<LockKey>,
    owner: String,
    mode: Mode,
    deadline: UnixMs,
    client: Option<ClientId>,
}

#[derive(Default)]
struct Model {
    queues: HashMap<LockKey, Vec<u32>>,
    requests: HashMap<u32, Request>,
    answered: HashMap<u32, Answer>,
    last_token: HashMap<LockKey, u64>,
    checked: usize,
}

impl Model {
    fn queue(&mut self, handle: u32, request: Request) {
        for key in &request.keys {
            self.queues.entry(key.clone()).or_default().push(handle);
        }
        self.requests.insert(handle, request);
    }

    fn leave(&mut self, handle: u32) {
        for queue in self.queues.values_mut() {
            queue.retain(|h| *h != handle);
        }
    }

    fn heads_all(&self, handle: u32) -> bool {
        self.requests[&handle]
            .keys
            .iter()
            .all(|k| self.queues.get(k).and_then(|q| q.first()) == Some(&handle))
    }

    fn waiting(&self) -> Vec<u32> {
        let mut all: Vec<u32> = self.queues.values().flatten().copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    fn token_rises(&mut self, key: &LockKey, token: u64) -> Result<(), TestCaseError> {
        let last = self.last_token.entry(key.clone()).or_default();
        prop_assert!(token > *last, "token {} on {:?} after {}", token, key, last);
        *last = token;
        Ok(())
    }

    /// Every answer given since the last call, against the lists and the writes before it.
    fn check_answers(&mut self, port: &FakePort) -> Result<(), TestCaseError> {
        let mut written: Vec<(LockKey, u64)> = Vec::new();
        let mut seen = 0usize;
        for effect in &port.effects {
            match effect {
                Effect::Wrote { key, token, .. } => written.push((key.clone(), *token)),
                Effect::Answered { handle, answer, at } => {
                    seen += 1;
                    if seen <= self.checked {
                        continue;
                    }
                    prop_assert!(
                        !self.answered.contains_key(handle),
                        "{handle} answered twice"
                    );
                    prop_assert!(self.requests.contains_key(handle), "{handle} never queued");
                    match answer {
                        Answer::Granted { key, token, .. } => {
                            prop_assert_eq!(&self.requests[handle].keys, &vec![key.clone()]);
                            prop_assert!(self.heads_all(*handle), "{handle} passed a waiter");
                            prop_assert!(written.contains(&(key.clone(), *token)));
                            self.token_rises(key, *token)?;
                        }
                        Answer::GrantedAll { holds, owner, .. } => {
                            let keys: Vec<LockKey> = holds.iter().map(|(k, _)| k.clone()).collect();
                            prop_assert_eq!(&self.requests[handle].keys, &keys);
                            prop_assert_eq!(owner.as_ref(), self.requests[handle].owner.as_bytes());
                            prop_assert!(self.heads_all(*handle), "{handle} passed a waiter");
                            for (key, token) in holds {
                                prop_assert!(
                                    written.contains(&(key.clone(), *token)),
                                    "answered before {:?} was written",
                                    key
                                );
                                self.token_rises(key, *token)?;
                            }
                        }
                        Answer::TimedOut => {
                            prop_assert_eq!(
                                *at,
                                self.requests[handle].deadline,
                                "timed out at the wrong time"
                            );
                        }
                        Answer::Refused(reply) => prop_assert!(false, "refused: {}", reply),
                    }
                    self.leave(*handle);
                    self.answered.insert(*handle, answer.clone());
                }
                _ => {}
            }
        }
        self.checked = seen;
        Ok(())
    }

    /// A request that heads every one of its lists, where every key has room for it, is not
    /// left waiting.
    fn check_progress(&self, port: &mut FakePort) -> Result<(), TestCaseError> {
        if port.writes != Writes::Allowed {
            return Ok(());
        }
        let now = port.now;
        for handle in self.waiting() {
            if !self.heads_all(handle) {
                continue;
            }
            let request = &self.requests[&handle];
            let fits = request.keys.iter().all(|k| {
                let lock = port.lock(k).cloned().unwrap_or_else(Lock::free);
                matches!(
                    hold::decide(
                        &lock,
                        request.owner.as_bytes(),
                        request.mode,
                        1,
                        Reentry::Counted,
                        Queue::Empty,
                        now
                    ),
                    Ok(Decision::Grant(_))
                )
            });
            prop_assert!(
                !fits,
                "{} left waiting on {:?} with room",
                handle,
                request.keys
            );
        }
        Ok(())
    }
}

fn check_exclusion(port: &mut FakePort, keys: &[LockKey]) -> Result<(), TestCaseError> {
    for k in keys {
        if let Some(lock) = port.lock(k).cloned() {
            if let Some(x) = lock.exclusive() {
                prop_assert!(
                    lock.holds.iter().all(|h| h.owner == x.owner),
                    "a writer beside another owner's hold: {:?}",
                    lock.holds
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn multi_key_requests_match_a_fifo_model(ops in proptest::collection::vec(op(), 1..150)) {
        let mut s: Scheduler<u32> = Scheduler::default();
        let mut port = FakePort::default();
        let keys = [LockKey::new(0, b"a"), LockKey::new(0, b"b"), LockKey::new(0, b"c")];
        let mut model = Model::default();
        let mut next = 0u32;
        for op in ops {
            let paused = port.writes == Writes::Paused;
            match op {
                Op::Acquire { keys: mask, rotate, shared, wait, lease, client } if !paused => {
                    let mut mine: Vec<LockKey> = (0..3)
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| keys[i].clone())
                        .collect();
                    let len = mine.len();
                    mine.rotate_left(usize::from(rotate) % len);
                    let mode = if shared { Mode::Shared } else { Mode::Exclusive };
                    next += 1;
                    let owner = format!("o{next}");
                    let asked: Vec<(LockKey, bool)> =
                        mine.iter().map(|k| (k.clone(), s.waiters_on(k) > 0)).collect();
                    let before = port.effects.len();
                    let granted = acquire_multi(&mut port, &asked, &owner, mode, lease)
                        .map_err(|e| TestCaseError::fail(e.reply()))?;
                    prop_assert_eq!(port.effects.len(), before, "a direct acquire is not the scheduler's");
                    match granted {
                        Some(tokens) => {
                            for (k, t) in mine.iter().zip(tokens) {
                                model.token_rises(k, t)?;
                                if let Some(c) = client {
                                    let now = port.now;
                                    s.bind(&mut port, ClientId::from(c), k, mode.kind(), t, now);
                                }
                            }
                        }
                        None => {
                            // Nothing was written: all or nothing.
                            for k in &mine {
                                let held = port.lock(k).is_some_and(|l| l.holds.iter().any(|h| h.owner.as_slice() == owner.as_bytes()));
                                prop_assert!(!held, "a refused multi-key acquire took {:?}", k);
                            }
                            if let Some(ms) = wait {
                                let wait = if ms == 0 { Wait::Forever } else { Wait::For(ms) };
                                let bind = client.map(ClientId::from);
                                wait_multi(&mut s, &mut port, next, &mine, &owner, mode, lease, wait, bind)
                                    .map_err(|e| TestCaseError::fail(e.reply()))?;
                                let deadline = if ms == 0 { UnixMs::MAX } else { port.now + ms };
                                model.queue(next, Request { keys: mine, owner, mode, deadline, client: bind });
                            }
                        }
                    }
                }
                Op::Release { key, pick } if !paused => {
                    let k = &keys[usize::from(key)];
                    if let Some(lock) = port.lock(k).cloned() {
                        let owner = lock.holds[pick % lock.holds.len()].owner.as_slice().to_vec();
                        release_owner(&mut s, &mut port, k, &owner);
                    }
                }
                Op::ReleaseAll { pick } if !paused => {
                    let mut owners: Vec<Vec<u8>> = Vec::new();
                    for k in &keys {
                        if let Some(lock) = port.lock(k).cloned() {
                            owners.extend(lock.holds.iter().map(|h| h.owner.as_slice().to_vec()));
                        }
                    }
                    if !owners.is_empty() {
                        let owner = owners[pick % owners.len()].clone();
                        for k in &keys {
                            release_owner(&mut s, &mut port, k, &owner);
                        }
                    }
                }
                Op::DeleteOutside { key } if !paused => {
                    let k = &keys[usize::from(key)];
                    port.keys.remove(k);
                    let now = port.now;
                    s.keys_changed(&mut port, vec![Change::Key(k.clone(), Cause::Freed)], now);
                }
                Op::Undelivered { key, pick } => {
                    let k = &keys[usize::from(key)];
                    if let Some(lock) = port.lock(k).cloned() {
                        let h = &lock.holds[pick % lock.holds.len()];
                        let now = port.now;
                        let grant = GrantRef { key: k.clone(), kind: h.kind, token: h.token.unwrap() };
                        s.grant_undelivered(grant, now);
                    }
                }
                Op::Leave { pick } => {
                    let waiting = model.waiting();
                    if !waiting.is_empty() {
                        let h = waiting[pick % waiting.len()];
                        let now = port.now;
                        prop_assert!(s.waiter_left(&mut port, h, now));
                        model.leave(h);
                    }
                }
                Op::Disconnect { client } => {
                    let c = ClientId::from(client);
                    let now = port.now;
                    for h in model.waiting() {
                        if model.requests[&h].client == Some(c) {
                            prop_assert!(s.waiter_left(&mut port, h, now));
                            model.leave(h);
                        }
                    }
                    s.clients_gone(&mut port, vec![c], now);
                }
                Op::Advance { ms } => {
                    let to = port.now + ms;
                    advance_to(&mut s, &mut port, to);
                }
                Op::Pause(on) => {
                    if on {
                        port.writes = Writes::Paused;
                    } else if port.writes == Writes::Paused {
                        port.writes = Writes::Allowed;
                        let to = port.now + PAUSE_POLL_MS;
                        advance_to(&mut s, &mut port, to);
                    }
                }
                _ => {}
            }
            // The adapter's 0 ms timers run before anything else is served.
            let now = port.now;
            advance_to(&mut s, &mut port, now);
            model.check_answers(&port)?;
            check_exclusion(&mut port, &keys)?;
            model.check_progress(&mut port)?;
        }
        if port.writes == Writes::Paused {
            port.writes = Writes::Allowed;
            let to = port.now + PAUSE_POLL_MS;
            advance_to(&mut s, &mut port, to);
        }
        for _ in 0..1_000 {
            let to = port.now + 500;
            advance_to(&mut s, &mut port, to);
            for k in &keys {
                if port.lock(k).is_some() {
                    release(&mut s, &mut port, k);
                }
            }
            model.check_answers(&port)?;
            if model.waiting().is_empty() {
                break;
            }
        }
        prop_assert!(model.waiting().is_empty(), "waiters never answered");
        for c in 0..3 {
            let now = port.now;
            s.clients_gone(&mut port, vec![c], now);
        }
        let to = port.now + 1_000;
        advance_to(&mut s, &mut port, to);
        prop_assert!(s.is_idle(), "something stays scheduled with nobody waiting");
    }
}
