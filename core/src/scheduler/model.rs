use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::testing::*;
use super::*;
use crate::args::Reentry;
use crate::hold::{self, Decision, Family, Lock};
use crate::kind::Queue;

const LIMIT: u64 = 2;

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        key: u8,
        shared: bool,
        wait: Option<u64>,
        lease: u64,
        client: Option<u8>,
    },
    Release {
        key: u8,
        pick: usize,
    },
    Leave {
        pick: usize,
    },
    /// A queued owner asks again (its client gave up but kept the connection).
    Retry {
        pick: usize,
        wait: u64,
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
    /// Time runs to the binding sweep's next deadline.
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..2, any::<bool>(), proptest::option::of(prop_oneof![Just(0u64), 1u64..400]), 1u64..300, proptest::option::of(0u8..3))
            .prop_map(|(key, shared, wait, lease, client)| Op::Acquire { key, shared, wait, lease, client }),
        3 => (0u8..2, any::<usize>()).prop_map(|(key, pick)| Op::Release { key, pick }),
        1 => any::<usize>().prop_map(|pick| Op::Leave { pick }),
        1 => (any::<usize>(), 0u64..400).prop_map(|(pick, wait)| Op::Retry { pick, wait }),
        3 => (0u64..200).prop_map(|ms| Op::Advance { ms }),
        1 => any::<bool>().prop_map(Op::Pause),
        1 => (0u8..2).prop_map(|key| Op::DeleteOutside { key }),
        1 => (0u8..2, any::<usize>()).prop_map(|(key, pick)| Op::Undelivered { key, pick }),
        1 => (0u8..3).prop_map(|client| Op::Disconnect { client }),
        1 => Just(Op::Sweep),
    ]
}

fn mode_for(key: usize, shared: bool) -> Mode {
    match (key, shared) {
        (1, _) => Mode::Limit(LIMIT),
        (_, true) => Mode::Shared,
        _ => Mode::Exclusive,
    }
}

#[derive(Default)]
struct Model {
    queues: HashMap<LockKey, Vec<u32>>,
    deadline: HashMap<u32, UnixMs>,
    owner: HashMap<u32, String>,
    mode: HashMap<u32, Mode>,
    client: HashMap<u32, ClientId>,
    answered: HashMap<u32, Answer>,
    /// Waits replaced by a newer wait of their owner: answered with an error.
    replaced: HashSet<u32>,
    /// Holds bound to each connection: (key, token).
    bound: HashMap<ClientId, Vec<(LockKey, u64)>>,
    last_grant_token: u64,
    checked: usize,
}

impl Model {
    /// Checks every answer the scheduler gave since the last call.
    fn check_answers(&mut self, port: &FakePort) -> Result<(), TestCaseError> {
        let answers = port.answers_at();
        for (handle, answer, at) in answers.iter().skip(self.checked) {
            prop_assert!(
                !self.answered.contains_key(handle),
                "{handle} answered twice"
            );
            if self.replaced.contains(handle) {
                prop_assert_eq!(answer, &Answer::Refused(REPLACED.to_string()));
                self.answered.insert(*handle, answer.clone());
                continue;
            }
            let (key, queue) = self
                .queues
                .iter_mut()
                .find(|(_, q)| q.contains(handle))
                .ok_or_else(|| TestCaseError::fail(format!("{handle} answered but not queued")))?;
            match answer {
                Answer::Granted {
                    token,
                    key: granted_key,
                    owner,
                    kind,
                } => {
                    prop_assert_eq!(granted_key, key);
                    prop_assert_eq!(queue.first(), Some(handle), "not FIFO");
                    prop_assert!(*token > self.last_grant_token, "token did not rise");
                    self.last_grant_token = *token;
                    prop_assert_eq!(owner.as_ref(), self.owner[handle].as_bytes());
                    prop_assert_eq!(*kind, self.mode[handle].kind());
                    if let Some(c) = self.client.get(handle) {
                        self.bound
                            .entry(*c)
                            .or_default()
                            .push((key.clone(), *token));
                    }
                }
                Answer::TimedOut => {
                    // The one timer fires exactly at each deadline: never early, never late.
                    prop_assert_eq!(*at, self.deadline[handle], "timed out at the wrong time");
                }
                Answer::Refused(reply) => prop_assert!(false, "refused: {}", reply),
                Answer::GrantedAll { .. } => prop_assert!(false, "no multi-key request here"),
            }
            queue.retain(|h| h != handle);
            self.answered.insert(*handle, answer.clone());
        }
        self.checked = answers.len();
        Ok(())
    }

    /// The reference rules on the fake server's state.
    fn check_holds(&self, port: &mut FakePort, keys: &[LockKey]) -> Result<(), TestCaseError> {
        for (i, k) in keys.iter().enumerate() {
            let Some(lock) = port.lock(k).cloned() else {
                continue;
            };
            if i == 1 {
                prop_assert_eq!(lock.family, Family::Semaphore { limit: LIMIT });
                prop_assert!(
                    lock.holds.len() as u64 <= LIMIT,
                    "more permits than the limit"
                );
            } else if let Some(x) = lock.exclusive() {
                prop_assert!(
                    lock.holds.iter().all(|h| h.owner == x.owner),
                    "a writer beside another owner's hold: {:?}",
                    lock.holds
                );
            }
        }
        Ok(())
    }

    /// Nobody waits while the key has room for the head of its queue.
    /// A hold bound by a command stays bound while it exists; right after a sweep the
    /// gauge counts exactly the live holds that are bound (none that ended unseen).
    fn check_bindings(
        &self,
        s: &Scheduler<u32>,
        port: &mut FakePort,
        keys: &[LockKey],
        swept: bool,
    ) -> Result<(), TestCaseError> {
        // Live: not past its lease end (while writes are paused the store keeps ended holds,
        // as Redis keeps an expired key, but every command treats them as gone).
        let now = port.now;
        let live = |h: &&crate::hold::Hold| h.expires_at.is_none_or(|at| now <= at);
        for (c, held) in &self.bound {
            for (k, token) in held {
                let exists = port
                    .lock(k)
                    .is_some_and(|l| l.holds.iter().filter(live).any(|h| h.token == Some(*token)));
                if exists {
                    prop_assert_eq!(
                        s.bound_client(k, *token),
                        Some(*c),
                        "a live hold lost its binding"
                    );
                }
            }
        }
        if swept {
            let live_bound = keys
                .iter()
                .filter_map(|k| port.lock(k).cloned().map(|l| (k, l)))
                .map(|(k, l)| {
                    l.holds
                        .iter()
                        .filter(live)
                        .filter(|h| h.token.is_some_and(|t| s.bound_client(k, t).is_some()))
                        .count()
                })
                .sum::<usize>();
            prop_assert_eq!(
                s.bound_holds(),
                live_bound,
                "bindings of holds gone after a sweep"
            );
        }
        Ok(())
    }

    fn check_no_idle_room(&self, port: &mut FakePort) -> Result<(), TestCaseError> {
        if port.writes != Writes::Allowed {
            return Ok(());
        }
        let now = port.now;
        for (k, queue) in &self.queues {
            let Some(head) = queue.first() else { continue };
            let lock = port.lock(k).cloned().unwrap_or_else(Lock::free);
            let d = hold::decide(
                &lock,
                self.owner[head].as_bytes(),
                self.mode[head],
                1,
                Reentry::Counted,
                Queue::Empty,
                now,
            );
            prop_assert!(
                !matches!(d, Ok(Decision::Grant(_))),
                "waiter {} left waiting on {:?} with room: {:?}",
                head,
                k,
                lock
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_scheduler_matches_a_fifo_model(ops in proptest::collection::vec(op(), 1..120)) {
        let mut s: Scheduler<u32> = Scheduler::default();
        let mut port = FakePort::default();
        let keys = [LockKey::new(0, b"a"), LockKey::new(0, b"b")];
        let mut model = Model::default();
        let mut next_handle = 0u32;
        let mut direct = 0u32;
        for op in ops {
            let mut swept = false;
            let paused = port.writes == Writes::Paused;
            match op {
                // Client commands are writes: Redis postpones them during a pause.
                Op::Acquire { key, shared, wait: w, lease, client } if !paused => {
                    let k = &keys[usize::from(key)];
                    let mode = mode_for(usize::from(key), shared);
                    direct += 1;
                    let owner = format!("d{direct}");
                    let waiting = s.waiters_on(k) > 0;
                    let granted = port.acquire(k, &owner, mode, lease, waiting);
                    match granted {
                        Ok(Some(token)) => {
                            // Direct grants are tokens too: later grants must be above them.
                            model.last_grant_token = token;
                            if let Some(c) = client {
                                let c = ClientId::from(c);
                                let now = port.now;
                                s.bind(&mut port, c, k, mode.kind(), token, now);
                                model.bound.entry(c).or_default().push((k.clone(), token));
                            }
                        }
                        Ok(None) => {
                            if let Some(ms) = w {
                                next_handle += 1;
                                let h = next_handle;
                                let wait = if ms == 0 { Wait::Forever } else { Wait::For(ms) };
                                let bind = client.map(ClientId::from);
                                wait_as(&mut s, &mut port, h, k, &owner, mode, lease, wait, bind)
                                    .map_err(|e| TestCaseError::fail(e.reply()))?;
                                model.queues.entry(k.clone()).or_default().push(h);
                                model.deadline.insert(h, if ms == 0 { UnixMs::MAX } else { port.now + ms });
                                model.owner.insert(h, owner);
                                model.mode.insert(h, mode);
                                if let Some(c) = bind {
                                    model.client.insert(h, c);
                                }
                            }
                        }
                        Err(e) => prop_assert!(false, "direct acquire refused: {}", e.reply()),
                    }
                }
                Op::Release { key, pick } if !paused => {
                    let k = &keys[usize::from(key)];
                    if let Some(lock) = port.lock(k).cloned() {
                        let h = &lock.holds[pick % lock.holds.len()];
                        release_owner(&mut s, &mut port, k, &h.owner);
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
                Op::Disconnect { client } => {
                    let c = ClientId::from(client);
                    // Its queued waiters leave with it (the server's disconnect callback).
                    let mine: Vec<u32> = model.queues.values().flatten().copied()
                        .filter(|h| model.client.get(h) == Some(&c)).collect();
                    let now = port.now;
                    for h in mine {
                        prop_assert!(s.waiter_left(&mut port, h, now));
                        for q in model.queues.values_mut() {
                            q.retain(|x| *x != h);
                        }
                    }
                    s.clients_gone(&mut port, vec![c], now);
                    advance_to(&mut s, &mut port, now);
                    if port.writes == Writes::Allowed {
                        for (k, token) in model.bound.remove(&c).unwrap_or_default() {
                            let now = port.now;
                            let still = port.lock(&k).is_some_and(|l| l.holds.iter().any(|h| h.token == Some(token) && !h.ended(now)));
                            prop_assert!(!still, "a closed connection's hold survived");
                        }
                    }
                }
                Op::Leave { pick } => {
                    let queued: Vec<u32> = model.queues.values().flatten().copied().collect();
                    if !queued.is_empty() {
                        let h = queued[pick % queued.len()];
                        let now = port.now;
                        prop_assert!(s.waiter_left(&mut port, h, now));
                        for q in model.queues.values_mut() {
                            q.retain(|x| *x != h);
                        }
                        // The adapter's 0 ms timer.
                        advance_to(&mut s, &mut port, now);
                    }
                }
                Op::Retry { pick, wait: ms } => {
                    let queued: Vec<(LockKey, usize, u32)> = model
                        .queues
                        .iter()
                        .flat_map(|(k, q)| q.iter().enumerate().map(|(i, h)| (k.clone(), i, *h)))
                        .collect();
                    if !queued.is_empty() {
                        let (k, at, old) = queued[pick % queued.len()].clone();
                        next_handle += 1;
                        let h = next_handle;
                        let owner = model.owner[&old].clone();
                        let mode = model.mode[&old];
                        let bind = model.client.get(&old).copied();
                        let wait = if ms == 0 { Wait::Forever } else { Wait::For(ms) };
                        wait_as(&mut s, &mut port, h, &k, &owner, mode, 100, wait, bind)
                            .map_err(|e| TestCaseError::fail(e.reply()))?;
                        // Same place in the queue; the old request is answered at once.
                        model.queues.get_mut(&k).unwrap()[at] = h;
                        model.replaced.insert(old);
                        model.deadline.insert(h, if ms == 0 { UnixMs::MAX } else { port.now + ms });
                        model.owner.insert(h, owner);
                        model.mode.insert(h, mode);
                        if let Some(c) = bind {
                            model.client.insert(h, c);
                        }
                    }
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
                        // Deferred work happens at the next pause check.
                        let to = port.now + PAUSE_POLL_MS;
                        advance_to(&mut s, &mut port, to);
                    }
                }
                Op::Sweep => {
                    // Until a sweep has run: the one scheduled may be cancelled on the way (its
                    // last binding went) and another armed later (a handoff bound a new one).
                    let before = s.sweeps_run;
                    for _ in 0..10 {
                        let Some(at) = s.binding_sweep.map(|d| d.at) else {
                            break;
                        };
                        advance_to(&mut s, &mut port, at);
                        if s.sweeps_run > before {
                            swept = true;
                            break;
                        }
                    }
                }
                _ => {}
            }
            model.check_answers(&port)?;
            model.check_holds(&mut port, &keys)?;
            model.check_no_idle_room(&mut port)?;
            model.check_bindings(&s, &mut port, &keys, swept)?;
        }
        // Everyone finishes: no pause, holders release, time runs out.
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
            if model.queues.values().all(Vec::is_empty) {
                break;
            }
        }
        prop_assert!(model.queues.values().all(Vec::is_empty), "waiters never answered");
        for c in 0..3 {
            let now = port.now;
            s.clients_gone(&mut port, vec![c], now);
        }
        let to = port.now + 1_000;
        advance_to(&mut s, &mut port, to);
        prop_assert!(s.is_idle(), "something stays scheduled with nobody waiting");
    }
}
