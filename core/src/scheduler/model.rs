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
        /// `TICKET`, asked on this connection (an `EPHEMERAL` one is bound to it).
        ticket: Option<u8>,
    },
    /// A ticket's client pops it (`BLPOP`).
    Pop {
        pick: usize,
    },
    /// `LOCK.CANCEL` of any ticket made so far.
    Cancel {
        pick: usize,
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
        5 => (0u8..2, any::<bool>(), proptest::option::of(prop_oneof![Just(0u64), 1u64..400]), 1u64..300, proptest::option::of(0u8..3), proptest::option::of(0u8..3))
            .prop_map(|(key, shared, wait, lease, client, ticket)| Op::Acquire { key, shared, wait, lease, client, ticket }),
        2 => any::<usize>().prop_map(|pick| Op::Pop { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
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

/// Where a ticket is, as its client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Queued,
    /// Answered: decided (written when `written` is set).
    Answered {
        value: TicketValue,
        written: bool,
    },
    /// Popped by its client, cancelled, or gone with its connection: done.
    Done,
}

#[derive(Default)]
struct Model {
    queues: HashMap<LockKey, Vec<u32>>,
    /// The waiters that are tickets, and where each is.
    tickets: HashMap<u32, (Ticket, Seen)>,
    /// Every ticket grant and how it was delivered: popped, handed to a canceller, or passed
    /// on (its connection closed first). Exactly one each.
    delivered: HashMap<u32, &'static str>,
    /// Timeouts written exactly at their deadline (every answer written at once).
    exact_times: bool,
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
    /// Checks every answer the scheduler gave since the last call: to blocked clients (the
    /// port's answers) and to tickets (decided, or written into the ticket).
    fn check_answers(&mut self, s: &Scheduler<u32>, port: &FakePort) -> Result<(), TestCaseError> {
        let answers = port.answers_at();
        let mut new: Vec<(u32, Answer, Option<UnixMs>)> = answers
            .iter()
            .skip(self.checked)
            .map(|(h, a, at)| (*h, a.clone(), Some(*at)))
            .collect();
        self.checked = answers.len();
        let decided: HashMap<TicketName, TicketValue> = s.decided_tickets().into_iter().collect();
        let written: HashMap<TicketName, (TicketValue, UnixMs)> = tickets_answered(port);
        lapses_checked(port).map_err(TestCaseError::fail)?;
        for (handle, (ticket, seen)) in self.tickets.iter_mut() {
            let now = match (decided.get(&ticket.name), written.get(&ticket.name)) {
                (_, Some((value, at))) => Some((value.clone(), true, Some(*at))),
                (Some(value), None) => Some((value.clone(), false, None)),
                (None, None) => None,
            };
            let Some((value, is_written, at)) = now else {
                continue;
            };
            match seen {
                Seen::Queued => {
                    let answer = match &value {
                        TicketValue::Granted(tokens) => {
                            let key = self
                                .queues
                                .iter()
                                .find(|(_, q)| q.contains(handle))
                                .map(|(k, _)| k.clone())
                                .ok_or_else(|| {
                                    TestCaseError::fail(format!("{handle} granted but not queued"))
                                })?;
                            prop_assert_eq!(tokens.len(), 1);
                            Answer::Granted {
                                token: tokens[0],
                                key,
                                owner: self.owner[handle].as_bytes().into(),
                                kind: self.mode[handle].kind(),
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
                    *seen = Seen::Answered {
                        value,
                        written: is_written,
                    };
                }
                Seen::Answered {
                    value: was,
                    written: w,
                } => {
                    prop_assert_eq!(&*was, &value, "a ticket answered twice");
                    *w = is_written;
                }
                Seen::Done => prop_assert!(!is_written || written.contains_key(&ticket.name)),
            }
        }
        // Grants in the order they were made (tokens rise), then the rest.
        new.sort_by_key(|(_, a, _)| match a {
            Answer::Granted { token, .. } => (0, *token),
            _ => (1, 0),
        });
        let mut step_max = self.last_grant_token;
        for (handle, answer, at) in new {
            prop_assert!(
                !self.answered.contains_key(&handle),
                "{handle} answered twice"
            );
            if self.replaced.contains(&handle) {
                prop_assert_eq!(&answer, &Answer::Refused(REPLACED.to_string()));
                self.answered.insert(handle, answer);
                continue;
            }
            let key = self
                .queues
                .iter()
                .find(|(_, q)| q.contains(&handle))
                .map(|(k, _)| k.clone())
                .ok_or_else(|| TestCaseError::fail(format!("{handle} answered but not queued")))?;
            match &answer {
                Answer::Granted {
                    token,
                    key: granted_key,
                    owner,
                    kind,
                } => {
                    prop_assert_eq!(granted_key, &key);
                    // FIFO: everyone ahead of it left the queue (answered, gone) before it.
                    let queue = &self.queues[&key];
                    for ahead in queue.iter().take_while(|h| **h != handle) {
                        prop_assert!(
                            !is_queued(s, *ahead, &self.tickets),
                            "not FIFO: {handle} granted while {ahead} waits ahead of it"
                        );
                    }
                    prop_assert!(*token > step_max, "token did not rise");
                    step_max = *token;
                    prop_assert_eq!(owner.as_ref(), self.owner[&handle].as_bytes());
                    prop_assert_eq!(*kind, self.mode[&handle].kind());
                    if let Some(c) = self.client.get(&handle) {
                        self.bound
                            .entry(*c)
                            .or_default()
                            .push((key.clone(), *token));
                    }
                }
                Answer::TimedOut => {
                    // The one timer fires exactly at each deadline: never early, never late (a
                    // ticket's answer may be written later, when writes wait for their turn).
                    let deadline = self.deadline[&handle];
                    match (self.tickets.contains_key(&handle), at) {
                        (false, Some(at)) => {
                            prop_assert_eq!(at, deadline, "timed out at the wrong time")
                        }
                        (true, Some(at)) if self.exact_times => {
                            prop_assert_eq!(at, deadline, "ticket timed out at the wrong time")
                        }
                        _ => prop_assert!(deadline <= port.now, "ticket timed out early"),
                    }
                }
                Answer::Refused(reply) => prop_assert!(false, "refused: {}", reply),
                Answer::GrantedAll { .. } => prop_assert!(false, "no multi-key request here"),
            }
            if let Some(q) = self.queues.get_mut(&key) {
                q.retain(|h| *h != handle);
            }
            self.answered.insert(handle, answer);
        }
        self.last_grant_token = step_max;
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

    /// A ticket's client pops it: what it pops is what was written, and a grant popped is
    /// delivered.
    fn pop(
        &mut self,
        s: &mut Scheduler<u32>,
        port: &mut FakePort,
        handle: u32,
    ) -> Result<(), TestCaseError> {
        let Some((ticket, seen)) = self.tickets.get_mut(&handle) else {
            return Ok(());
        };
        let popped = pop(s, port, &ticket.name).and_then(|v| TicketValue::decode(&v));
        if let Some(value) = popped {
            // A grant not popped by its lease end is rewritten `expired` (nothing held), also
            // one whose connection closed while writes were paused (the close and the lapse
            // are both looked at when the pause ends).
            let lapsed = value == TicketValue::Lapsed
                && matches!(
                    seen,
                    Seen::Done
                        | Seen::Answered {
                            value: TicketValue::Granted(_),
                            written: true
                        }
                );
            if !lapsed {
                prop_assert_eq!(
                    seen.clone(),
                    Seen::Answered {
                        value: value.clone(),
                        written: true
                    },
                    "popped what was not written"
                );
            }
            *seen = Seen::Done;
            if matches!(value, TicketValue::Granted(_)) {
                prop_assert!(
                    self.delivered.insert(handle, "popped").is_none(),
                    "delivered twice"
                );
            }
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

/// Whether the scheduler still has this waiter queued.
fn is_queued(s: &Scheduler<u32>, handle: u32, tickets: &HashMap<u32, (Ticket, Seen)>) -> bool {
    let probe = match tickets.get(&handle) {
        Some((ticket, _)) => Handle::Ticket(*ticket),
        None => Handle::Blocked(handle),
    };
    s.queues.id_of(probe).is_some()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_scheduler_matches_a_fifo_model(
        ops in proptest::collection::vec(op(), 1..120),
        deliver_max in prop_oneof![3 => Just(usize::MAX), 1 => 0usize..3],
    ) {
        let mut s: Scheduler<u32> = Scheduler::default();
        let mut port = FakePort { deliver_max, ..FakePort::default() };
        let keys = [LockKey::new(0, b"a"), LockKey::new(0, b"b")];
        let mut model = Model { exact_times: deliver_max == usize::MAX, ..Model::default() };
        let mut next_handle = 0u32;
        let mut direct = 0u32;
        for op in ops {
            let mut swept = false;
            let paused = port.writes == Writes::Paused;
            match op {
                // Client commands are writes: Redis postpones them during a pause.
                Op::Acquire { key, shared, wait: w, lease, client, ticket } if !paused => {
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
                                let bind = match ticket {
                                    // An EPHEMERAL ticket's hold is bound to the asking connection.
                                    Some(conn) => client.map(|_| ClientId::from(conn)),
                                    None => client.map(ClientId::from),
                                };
                                match ticket {
                                    Some(conn) => {
                                        let t = wait_ticket(&mut s, &mut port, ClientId::from(conn), std::slice::from_ref(k), &owner, mode, lease, wait, bind)
                                            .map_err(|e| TestCaseError::fail(e.reply()))?;
                                        model.tickets.insert(h, (t, Seen::Queued));
                                    }
                                    None => {
                                        wait_as(&mut s, &mut port, h, k, &owner, mode, lease, wait, bind)
                                            .map_err(|e| TestCaseError::fail(e.reply()))?;
                                    }
                                }
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
                        .filter(|h| model.client.get(h) == Some(&c) && !model.tickets.contains_key(h)).collect();
                    // Its tickets: queued ones leave, grants nobody popped are passed on.
                    let mut passed_on = Vec::new();
                    for (h, (t, seen)) in model.tickets.iter_mut() {
                        if t.client != c {
                            continue;
                        }
                        match seen {
                            Seen::Queued => {
                                for q in model.queues.values_mut() {
                                    q.retain(|x| x != h);
                                }
                                model.answered.insert(*h, Answer::Refused("closed".into()));
                            }
                            // Lapsed unpopped: `expired` stays for whoever pops it.
                            Seen::Answered { value: TicketValue::Granted(_), .. } if lapsed(&port, &t.name) => continue,
                            Seen::Answered { value: TicketValue::Granted(tokens), .. } => {
                                prop_assert!(model.delivered.insert(*h, "passed on").is_none(), "delivered twice");
                                let k = keys.iter().find(|k| port.lock(k).is_some_and(|l| l.holds.iter().any(|x| x.token == Some(tokens[0]))));
                                if let Some(k) = k {
                                    passed_on.push((k.clone(), tokens[0]));
                                }
                            }
                            // A written marker stays for whoever pops it, until it expires.
                            Seen::Answered { written: true, .. } => continue,
                            _ => {}
                        }
                        *seen = Seen::Done;
                    }
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
                        for (k, token) in &passed_on {
                            let now = port.now;
                            let still = port.lock(k).is_some_and(|l| l.holds.iter().any(|h| h.token == Some(*token) && !h.ended(now)));
                            prop_assert!(!still, "a grant nobody popped was not passed on");
                        }
                        for (k, token) in model.bound.remove(&c).unwrap_or_default() {
                            let now = port.now;
                            let still = port.lock(&k).is_some_and(|l| l.holds.iter().any(|h| h.token == Some(token) && !h.ended(now)));
                            prop_assert!(!still, "a closed connection's hold survived");
                        }
                    }
                }
                Op::Pop { pick } => {
                    let mut written: Vec<u32> = model.tickets.iter()
                        .filter(|(_, (_, seen))| matches!(seen, Seen::Answered { written: true, .. }))
                        .map(|(h, _)| *h).collect();
                    written.sort_unstable();
                    if !written.is_empty() {
                        let h = written[pick % written.len()];
                        model.pop(&mut s, &mut port, h)?;
                    }
                }
                Op::Cancel { pick } if !paused => {
                    let mut all: Vec<u32> = model.tickets.keys().copied().collect();
                    all.sort_unstable();
                    if !all.is_empty() {
                        let h = all[pick % all.len()];
                        let (t, seen) = model.tickets[&h].clone();
                        let present = port.ticket_unpopped(&t.name) && !lapsed(&port, &t.name);
                        let want = match &seen {
                            Seen::Queued => Cancelled::Left,
                            Seen::Answered { value: TicketValue::Granted(tokens), written } if !written || (present && port.tokens_held(tokens)) => {
                                Cancelled::Handed(tokens.clone())
                            }
                            _ => Cancelled::Nothing,
                        };
                        let now = port.now;
                        let got = s.cancel(&mut port, t.name, now);
                        prop_assert_eq!(&got, &want, "cancel of {} ({:?})", h, seen);
                        match got {
                            Cancelled::Left => {
                                for q in model.queues.values_mut() {
                                    q.retain(|x| *x != h);
                                }
                                model.answered.insert(h, Answer::Refused("cancelled".into()));
                            }
                            Cancelled::Handed(_) => {
                                prop_assert!(model.delivered.insert(h, "handed").is_none(), "delivered twice");
                            }
                            Cancelled::Nothing => {}
                        }
                        prop_assert!(!port.ticket_unpopped(&t.name), "a cancelled ticket still holds an answer");
                        model.tickets.insert(h, (t, Seen::Done));
                        // The adapter's 0 ms timer.
                        advance_to(&mut s, &mut port, now);
                    }
                }
                Op::Leave { pick } => {
                    let queued: Vec<u32> = model.queues.values().flatten().copied()
                        .filter(|h| !model.tickets.contains_key(h)).collect();
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
            model.check_answers(&s, &port)?;
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
            let handles: Vec<u32> = model.tickets.keys().copied().collect();
            for h in handles {
                model.pop(&mut s, &mut port, h)?;
            }
            if model.queues.values().all(Vec::is_empty) {
                break;
            }
        }
        prop_assert!(model.queues.values().all(Vec::is_empty), "waiters never answered");
        let to = port.now + 10;
        advance_to(&mut s, &mut port, to);
        model.check_answers(&s, &port)?;
        let handles: Vec<u32> = model.tickets.keys().copied().collect();
        for h in handles {
            model.pop(&mut s, &mut port, h)?;
        }
        for (h, (_, seen)) in &model.tickets {
            // Answered exactly once: every ticket ended popped, cancelled or with its connection
            // (a marker or a grant whose ticket expired unpopped is done too).
            let done = matches!(seen, Seen::Done)
                || matches!(seen, Seen::Answered { written: true, .. });
            prop_assert!(done, "ticket {} never answered: {:?}", h, seen);
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
