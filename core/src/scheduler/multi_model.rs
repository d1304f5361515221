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
//! stays scheduled. Some requests are tickets (`TICKET`): their answers are written into the
//! ticket, which their clients pop or cancel, or which their connection's close passes on; the
//! same properties hold for them, and every grant is delivered exactly once.

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
        ticket: Option<u8>,
    },
    Pop {
        pick: usize,
    },
    Cancel {
        pick: usize,
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
        8 => (1u8..8, 0u8..3, any::<bool>(), prop_oneof![1 => Just(None), 4 => prop_oneof![Just(Some(0u64)), (1u64..400).prop_map(Some)]], 1u64..300, proptest::option::of(0u8..3), proptest::option::of(0u8..3))
            .prop_map(|(keys, rotate, shared, wait, lease, client, ticket)| Op::Acquire { keys, rotate, shared, wait, lease, client, ticket }),
        2 => any::<usize>().prop_map(|pick| Op::Pop { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
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
    /// A ticket's request: the ticket and what its client saw of it.
    ticket: Option<(Ticket, TicketSeen)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TicketSeen {
    Queued,
    Answered { value: TicketValue, written: bool },
    Done,
}

#[derive(Default)]
struct Model {
    queues: HashMap<LockKey, Vec<u32>>,
    requests: HashMap<u32, Request>,
    answered: HashMap<u32, Answer>,
    last_token: HashMap<LockKey, u64>,
    checked: usize,
    /// How each ticket grant was delivered (exactly once).
    delivered: HashMap<u32, &'static str>,
    exact_times: bool,
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

    /// Whether every waiter ahead of `handle` in each of its lists is gone from the scheduler's
    /// queues: nobody passed a waiter on a key they share.
    fn nobody_ahead(&self, s: &Scheduler<u32>, handle: u32) -> bool {
        self.requests[&handle].keys.iter().all(|k| {
            self.queues.get(k).is_none_or(|q| {
                q.iter()
                    .take_while(|h| **h != handle)
                    .all(|ahead| !self.is_queued(s, *ahead))
            })
        })
    }

    fn is_queued(&self, s: &Scheduler<u32>, handle: u32) -> bool {
        let probe = match &self.requests[&handle].ticket {
            Some((ticket, _)) => Handle::Ticket(*ticket),
            None => Handle::Blocked(handle),
        };
        s.queues.id_of(probe).is_some()
    }

    /// Every answer given since the last call (to blocked clients, and decided for or written
    /// into tickets), against the lists and the writes before it.
    fn check_answers(&mut self, s: &Scheduler<u32>, port: &FakePort) -> Result<(), TestCaseError> {
        let mut written: Vec<(LockKey, u64)> = Vec::new();
        let mut new: Vec<(u32, Answer, Option<UnixMs>)> = Vec::new();
        let mut seen = 0usize;
        for effect in &port.effects {
            match effect {
                Effect::Wrote { key, token, .. } => written.push((key.clone(), *token)),
                Effect::Answered { handle, answer, at } => {
                    seen += 1;
                    if seen <= self.checked {
                        continue;
                    }
                    // Told only after its keys were written.
                    let holds = match answer {
                        Answer::Granted { key, token, .. } => vec![(key.clone(), *token)],
                        Answer::GrantedAll { holds, .. } => holds.clone(),
                        _ => Vec::new(),
                    };
                    for hold in holds {
                        prop_assert!(
                            written.contains(&hold),
                            "answered before {:?} was written",
                            hold.0
                        );
                    }
                    new.push((*handle, answer.clone(), Some(*at)));
                }
                _ => {}
            }
        }
        self.checked = seen;
        let decided: HashMap<TicketName, TicketValue> = s.decided_tickets().into_iter().collect();
        let in_tickets: HashMap<TicketName, (TicketValue, UnixMs)> = tickets_answered(port);
        lapses_checked(port).map_err(TestCaseError::fail)?;
        for (handle, request) in self.requests.iter_mut() {
            let Some((ticket, seen)) = &mut request.ticket else {
                continue;
            };
            let now = match (decided.get(&ticket.name), in_tickets.get(&ticket.name)) {
                (_, Some((value, at))) => Some((value.clone(), true, Some(*at))),
                (Some(value), None) => Some((value.clone(), false, None)),
                (None, None) => None,
            };
            let Some((value, is_written, at)) = now else {
                continue;
            };
            match seen {
                TicketSeen::Queued => {
                    let answer = match &value {
                        TicketValue::Granted(tokens) => {
                            prop_assert_eq!(tokens.len(), request.keys.len());
                            prop_assert_eq!(
                                ticket.name.shape == Shape::Many,
                                request.keys.len() > 1
                            );
                            let holds: Vec<(LockKey, u64)> = request
                                .keys
                                .iter()
                                .cloned()
                                .zip(tokens.iter().copied())
                                .collect();
                            for hold in &holds {
                                prop_assert!(
                                    written.contains(hold),
                                    "a ticket granted before {:?} was written",
                                    hold.0
                                );
                            }
                            match holds.as_slice() {
                                [(key, token)] => Answer::Granted {
                                    token: *token,
                                    key: key.clone(),
                                    owner: request.owner.as_bytes().into(),
                                    kind: request.mode.kind(),
                                },
                                _ => Answer::GrantedAll {
                                    holds,
                                    owner: request.owner.as_bytes().into(),
                                    kind: request.mode.kind(),
                                },
                            }
                        }
                        TicketValue::TimedOut => Answer::TimedOut,
                        TicketValue::Refused(reply) => Answer::Refused(reply.clone()),
                        TicketValue::Lapsed => {
                            return Err(TestCaseError::fail(format!(
                                "{handle} answered expired, never granted"
                            )))
                        }
                    };
                    new.push((*handle, answer, at));
                    *seen = TicketSeen::Answered {
                        value,
                        written: is_written,
                    };
                }
                TicketSeen::Answered {
                    value: was,
                    written: w,
                } => {
                    prop_assert_eq!(&*was, &value, "a ticket answered twice");
                    *w = is_written;
                }
                TicketSeen::Done => {}
            }
        }
        // Grants in the order they were made (tokens rise), then the rest.
        new.sort_by_key(|(_, a, _)| match a {
            Answer::Granted { token, .. } => (0, *token),
            Answer::GrantedAll { holds, .. } => (0, holds.iter().map(|h| h.1).min().unwrap_or(0)),
            _ => (1, 0),
        });
        for (handle, answer, at) in new {
            prop_assert!(
                !self.answered.contains_key(&handle),
                "{handle} answered twice"
            );
            prop_assert!(self.requests.contains_key(&handle), "{handle} never queued");
            match &answer {
                Answer::Granted { key, token, .. } => {
                    prop_assert_eq!(&self.requests[&handle].keys, &vec![key.clone()]);
                    prop_assert!(self.nobody_ahead(s, handle), "{handle} passed a waiter");
                    self.token_rises(key, *token)?;
                }
                Answer::GrantedAll { holds, owner, .. } => {
                    let keys: Vec<LockKey> = holds.iter().map(|(k, _)| k.clone()).collect();
                    prop_assert_eq!(&self.requests[&handle].keys, &keys);
                    prop_assert_eq!(owner.as_ref(), self.requests[&handle].owner.as_bytes());
                    prop_assert!(self.nobody_ahead(s, handle), "{handle} passed a waiter");
                    for (key, token) in holds {
                        self.token_rises(key, *token)?;
                    }
                }
                Answer::TimedOut => {
                    let deadline = self.requests[&handle].deadline;
                    let ticket = self.requests[&handle].ticket.is_some();
                    match at {
                        Some(at) if !ticket || self.exact_times => {
                            prop_assert_eq!(at, deadline, "timed out at the wrong time")
                        }
                        _ => prop_assert!(deadline <= port.now, "timed out early"),
                    }
                }
                Answer::Refused(reply) => prop_assert!(false, "refused: {}", reply),
            }
            self.leave(handle);
            self.answered.insert(handle, answer);
        }
        Ok(())
    }

    /// A ticket's client pops it.
    fn pop(
        &mut self,
        s: &mut Scheduler<u32>,
        port: &mut FakePort,
        handle: u32,
    ) -> Result<(), TestCaseError> {
        let Some((ticket, seen)) = self
            .requests
            .get_mut(&handle)
            .and_then(|r| r.ticket.as_mut())
        else {
            return Ok(());
        };
        if let Some(value) = pop(s, port, &ticket.name).and_then(|v| TicketValue::decode(&v)) {
            // A grant not popped by its lease end is rewritten `expired` (nothing held), also
            // one whose connection closed while writes were paused (the close and the lapse
            // are both looked at when the pause ends).
            let lapsed = value == TicketValue::Lapsed
                && matches!(
                    seen,
                    TicketSeen::Done
                        | TicketSeen::Answered {
                            value: TicketValue::Granted(_),
                            written: true
                        }
                );
            if !lapsed {
                prop_assert_eq!(
                    seen.clone(),
                    TicketSeen::Answered {
                        value: value.clone(),
                        written: true
                    },
                    "popped what was not written"
                );
            }
            *seen = TicketSeen::Done;
            if matches!(value, TicketValue::Granted(_)) {
                prop_assert!(
                    self.delivered.insert(handle, "popped").is_none(),
                    "delivered twice"
                );
            }
        }
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
    fn multi_key_requests_match_a_fifo_model(
        ops in proptest::collection::vec(op(), 1..150),
        deliver_max in prop_oneof![3 => Just(usize::MAX), 1 => 0usize..3],
    ) {
        let mut s: Scheduler<u32> = Scheduler::default();
        let mut port = FakePort { deliver_max, ..FakePort::default() };
        let keys = [LockKey::new(0, b"a"), LockKey::new(0, b"b"), LockKey::new(0, b"c")];
        let mut model = Model { exact_times: deliver_max == usize::MAX, ..Model::default() };
        let mut next = 0u32;
        for op in ops {
            let paused = port.writes == Writes::Paused;
            match op {
                Op::Acquire { keys: mask, rotate, shared, wait, lease, client, ticket } if !paused => {
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
                                let deadline = if ms == 0 { UnixMs::MAX } else { port.now + ms };
                                match ticket {
                                    Some(conn) => {
                                        // An EPHEMERAL ticket's holds are bound to the asking connection.
                                        let conn = ClientId::from(conn);
                                        let bind = client.map(|_| conn);
                                        let t = wait_ticket(&mut s, &mut port, conn, &mine, &owner, mode, lease, wait, bind)
                                            .map_err(|e| TestCaseError::fail(e.reply()))?;
                                        let ticket = Some((t, TicketSeen::Queued));
                                        model.queue(next, Request { keys: mine, owner, mode, deadline, client: bind, ticket });
                                    }
                                    None => {
                                        let bind = client.map(ClientId::from);
                                        wait_multi(&mut s, &mut port, next, &mine, &owner, mode, lease, wait, bind)
                                            .map_err(|e| TestCaseError::fail(e.reply()))?;
                                        model.queue(next, Request { keys: mine, owner, mode, deadline, client: bind, ticket: None });
                                    }
                                }
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
                Op::Pop { pick } => {
                    let mut written: Vec<u32> = model.requests.iter()
                        .filter(|(_, r)| matches!(r.ticket, Some((_, TicketSeen::Answered { written: true, .. }))))
                        .map(|(h, _)| *h).collect();
                    written.sort_unstable();
                    if !written.is_empty() {
                        let h = written[pick % written.len()];
                        model.pop(&mut s, &mut port, h)?;
                    }
                }
                Op::Cancel { pick } if !paused => {
                    let mut all: Vec<u32> = model.requests.iter()
                        .filter(|(_, r)| r.ticket.is_some()).map(|(h, _)| *h).collect();
                    all.sort_unstable();
                    if !all.is_empty() {
                        let h = all[pick % all.len()];
                        let (t, seen) = model.requests[&h].ticket.clone().unwrap();
                        let present = port.ticket_unpopped(&t.name) && !lapsed(&port, &t.name);
                        let want = match &seen {
                            TicketSeen::Queued => Cancelled::Left,
                            TicketSeen::Answered { value: TicketValue::Granted(tokens), written } if !written || (present && port.tokens_held(tokens)) => {
                                Cancelled::Handed(tokens.clone())
                            }
                            _ => Cancelled::Nothing,
                        };
                        let now = port.now;
                        let got = s.cancel(&mut port, t.name, now);
                        prop_assert_eq!(&got, &want, "cancel of {} ({:?})", h, seen);
                        match got {
                            Cancelled::Left => {
                                model.leave(h);
                                model.answered.insert(h, Answer::Refused("cancelled".into()));
                            }
                            Cancelled::Handed(_) => {
                                prop_assert!(model.delivered.insert(h, "handed").is_none(), "delivered twice");
                            }
                            Cancelled::Nothing => {}
                        }
                        prop_assert!(!port.ticket_unpopped(&t.name));
                        if let Some(r) = model.requests.get_mut(&h) {
                            r.ticket = Some((t, TicketSeen::Done));
                        }
                    }
                }
                Op::Leave { pick } => {
                    let waiting: Vec<u32> = model.waiting().into_iter()
                        .filter(|h| model.requests[h].ticket.is_none()).collect();
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
                        if model.requests[&h].client == Some(c) && model.requests[&h].ticket.is_none() {
                            prop_assert!(s.waiter_left(&mut port, h, now));
                            model.leave(h);
                        }
                    }
                    // Its tickets: queued ones leave, grants nobody popped are passed on.
                    let mut passed_on: Vec<(LockKey, u64)> = Vec::new();
                    let mut left = Vec::new();
                    for (h, r) in model.requests.iter_mut() {
                        let Some((t, seen)) = &mut r.ticket else { continue };
                        if t.client != c {
                            continue;
                        }
                        match seen {
                            TicketSeen::Queued => left.push(*h),
                            TicketSeen::Answered { value: TicketValue::Granted(_), .. } if lapsed(&port, &t.name) => continue,
                            TicketSeen::Answered { value: TicketValue::Granted(tokens), .. } => {
                                prop_assert!(model.delivered.insert(*h, "passed on").is_none(), "delivered twice");
                                passed_on.extend(r.keys.iter().cloned().zip(tokens.iter().copied()));
                            }
                            TicketSeen::Answered { written: true, .. } => continue,
                            _ => {}
                        }
                        *seen = TicketSeen::Done;
                    }
                    for h in left {
                        model.leave(h);
                        model.answered.insert(h, Answer::Refused("closed".into()));
                    }
                    s.clients_gone(&mut port, vec![c], now);
                    advance_to(&mut s, &mut port, now);
                    if port.writes == Writes::Allowed {
                        for (k, token) in &passed_on {
                            let now = port.now;
                            let still = port.lock(k).is_some_and(|l| l.holds.iter().any(|h| h.token == Some(*token) && !h.ended(now)));
                            prop_assert!(!still, "a grant nobody popped was not passed on");
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
                        let to = port.now + PAUSE_POLL_MS;
                        advance_to(&mut s, &mut port, to);
                    }
                }
                _ => {}
            }
            // The adapter's 0 ms timers run before anything else is served.
            let now = port.now;
            advance_to(&mut s, &mut port, now);
            model.check_answers(&s, &port)?;
            check_exclusion(&mut port, &keys)?;
            model.check_progress(&mut port)?;
        }
        if port.writes == Writes::Paused {
            port.writes = Writes::Allowed;
            let to = port.now + PAUSE_POLL_MS;
            advance_to(&mut s, &mut port, to);
        }
        port.deliver_max = usize::MAX;
        for _ in 0..1_000 {
            let to = port.now + 500;
            advance_to(&mut s, &mut port, to);
            for k in &keys {
                if port.lock(k).is_some() {
                    release(&mut s, &mut port, k);
                }
            }
            model.check_answers(&s, &port)?;
            let handles: Vec<u32> = model.requests.keys().copied().collect();
            for h in handles {
                model.pop(&mut s, &mut port, h)?;
            }
            if model.waiting().is_empty() {
                break;
            }
        }
        prop_assert!(model.waiting().is_empty(), "waiters never answered");
        let to = port.now + 10;
        advance_to(&mut s, &mut port, to);
        model.check_answers(&s, &port)?;
        let handles: Vec<u32> = model.requests.keys().copied().collect();
        for h in handles {
            model.pop(&mut s, &mut port, h)?;
        }
        for (h, r) in &model.requests {
            if let Some((_, seen)) = &r.ticket {
                let done = matches!(seen, TicketSeen::Done | TicketSeen::Answered { written: true, .. });
                prop_assert!(done, "ticket {} never answered: {:?}", h, seen);
            }
        }
        for c in 0..3 {
            let now = port.now;
            s.clients_gone(&mut port, vec![c], now);
        }
        let to = port.now + 1_000;
        advance_to(&mut s, &mut port, to);
        prop_assert!(s.is_idle(), "something stays scheduled with nobody waiting");
    }
}
