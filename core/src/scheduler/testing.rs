use super::*;
use crate::args::Reentry;
use crate::hold::{self, Decision, Lock, Lost};
use crate::kind::Queue;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Wrote {
        key: LockKey,
        owner: Vec<u8>,
        token: u64,
        expires_at: UnixMs,
    },
    /// A hold (named by its token) was removed by a write.
    Removed {
        key: LockKey,
        token: u64,
    },
    Published {
        key: LockKey,
    },
    /// A holder was told it lost its hold.
    Lost {
        key: LockKey,
        lost: Lost,
    },
    /// A campaigning waiter became the leader.
    Elected {
        key: LockKey,
        token: u64,
        owner: Vec<u8>,
        value: Option<Vec<u8>>,
    },
    Answered {
        handle: u32,
        answer: Answer,
        at: UnixMs,
    },
    /// An answer written into a ticket.
    TicketWritten {
        ticket: TicketName,
        value: Vec<u8>,
        expires_at: UnixMs,
        at: UnixMs,
    },
    Noted(Note),
}

pub struct FakePort {
    pub now: UnixMs,
    pub writes: Writes,
    pub keys: HashMap<LockKey, Lock>,
    /// Keys whose slot left this node, with the redirect.
    pub moved: HashMap<LockKey, String>,
    pub tokens_exhausted: bool,
    pub last_token: u64,
    pub effects: Vec<Effect>,
    /// Reads and writes of lock keys so far (a batch reads and writes each key once).
    pub reads: usize,
    pub key_writes: usize,
    /// Ticket lists: the one element and its expiry.
    pub tickets: HashMap<TicketName, (Vec<u8>, UnixMs)>,
    /// How many ticket answers the adapter writes after each call (a turn).
    pub deliver_max: usize,
}

impl Default for FakePort {
    fn default() -> Self {
        FakePort {
            now: 1_000,
            writes: Writes::Allowed,
            keys: HashMap::new(),
            moved: HashMap::new(),
            tokens_exhausted: false,
            last_token: 0,
            effects: Vec::new(),
            reads: 0,
            key_writes: 0,
            tickets: HashMap::new(),
            deliver_max: usize::MAX,
        }
    }
}

impl FakePort {
    /// Whether every token is a live hold's, in whatever key (tokens never repeat in the fake:
    /// one counter): a cancelled grant is handed over only then.
    pub fn tokens_held(&self, tokens: &[u64]) -> bool {
        tokens.iter().all(|t| {
            self.keys.values().any(|l| {
                l.holds
                    .iter()
                    .any(|h| h.token == Some(*t) && !h.ended(self.now))
            })
        })
    }

    /// The key's lock as Redis keeps it: gone once its expiry (the last lease end) passed, as
    /// a write lookup leaves it (while writes are paused nothing is removed, as in Redis); a
    /// hold of several whose own lease ended stays stored until a write removes it. None when
    /// nothing is stored.
    pub fn lock(&mut self, key: &LockKey) -> Option<&Lock> {
        if self.writes != Writes::Paused {
            let now = self.now;
            let expired = self
                .keys
                .get(key)
                .is_some_and(|l| l.holds.iter().all(|h| h.ended(now)));
            if expired {
                self.keys.remove(key);
            }
        }
        self.keys.get(key)
    }

    /// A client's `BLPOP` of a ticket: its element, if it holds one (the list goes with it).
    pub fn pop_ticket(&mut self, ticket: &TicketName) -> Option<Vec<u8>> {
        self.expire_tickets();
        self.tickets.remove(ticket).map(|(value, _)| value)
    }

    /// Whether the ticket's list still holds its answer (nobody popped it yet).
    pub fn ticket_unpopped(&mut self, ticket: &TicketName) -> bool {
        self.expire_tickets();
        self.tickets.contains_key(ticket)
    }

    /// Tickets whose expiry passed are gone, as Redis removes them.
    fn expire_tickets(&mut self) {
        let now = self.now;
        self.tickets.retain(|_, (_, at)| now <= *at);
    }

    pub fn answers(&self) -> Vec<(u32, Answer)> {
        self.answers_at()
            .into_iter()
            .map(|(h, a, _)| (h, a))
            .collect()
    }

    /// Every answer with the time it was given.
    pub fn answers_at(&self) -> Vec<(u32, Answer, UnixMs)> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Answered { handle, answer, at } => Some((*handle, answer.clone(), *at)),
                _ => None,
            })
            .collect()
    }

    /// A client's own acquire (no wait), with the real rules: no barging past `waiting`.
    pub fn acquire(
        &mut self,
        key: &LockKey,
        owner: &str,
        mode: Mode,
        lease_ms: u64,
        waiting: bool,
    ) -> Result<Option<u64>, LockError> {
        let now = self.now;
        let lock = self.lock(key).cloned().unwrap_or_else(Lock::free);
        let queue = if waiting {
            Queue::Waiting
        } else {
            Queue::Empty
        };
        match hold::decide(
            &lock,
            owner.as_bytes(),
            mode,
            lease_ms,
            Reentry::Counted,
            queue,
            now,
        )? {
            Decision::Busy => Ok(None),
            Decision::Grant(g) => {
                self.last_token += 1;
                let token = g.token.unwrap_or(self.last_token);
                let new = hold::apply(&lock, owner.as_bytes(), mode, &g, self.last_token);
                self.keys.insert(key.clone(), new);
                Ok(Some(token))
            }
        }
    }
}

impl Port<u32> for FakePort {
    fn writes(&self) -> Writes {
        self.writes
    }

    fn read(&mut self, key: &LockKey, check_route: bool) -> Read {
        self.reads += 1;
        let lock = self.lock(key).cloned();
        match lock {
            None => match self.moved.get(key) {
                Some(redirect) if check_route => Read::Moved(redirect.clone()),
                _ => Read::Lock(None),
            },
            Some(lock) => Read::Lock(Some(StoredLock {
                expires_at: lock.last_lease_end(),
                lock,
                names: Default::default(),
            })),
        }
    }

    fn write(
        &mut self,
        key: &LockKey,
        old: Option<&StoredLock>,
        new: &Lock,
    ) -> Result<(), LockError> {
        assert_eq!(
            self.writes,
            Writes::Allowed,
            "a write while writes are not allowed"
        );
        assert_eq!(
            old.map(|o| &o.lock),
            self.keys.get(key),
            "a write of a lock that changed since it was read"
        );
        self.key_writes += 1;
        let before = old.map(|o| o.lock.holds.as_slice()).unwrap_or_default();
        // (Indexed: a run's keys hold up to 1,000 holds, and a test writes them many times.)
        let had: HashMap<(HoldKind, &[u8]), &Hold> = before
            .iter()
            .map(|h| ((h.kind, h.owner.as_slice()), h))
            .collect();
        let kept: HashSet<(HoldKind, &[u8])> = new
            .holds
            .iter()
            .map(|h| (h.kind, h.owner.as_slice()))
            .collect();
        for hold in &new.holds {
            if had.get(&(hold.kind, hold.owner.as_slice())) != Some(&hold) {
                self.effects.push(Effect::Wrote {
                    key: key.clone(),
                    owner: hold.owner.to_vec(),
                    token: hold.token.unwrap_or_default(),
                    expires_at: hold.expires_at.unwrap_or_default(),
                });
            }
        }
        for hold in before {
            if !kept.contains(&(hold.kind, hold.owner.as_slice())) {
                self.effects.push(Effect::Removed {
                    key: key.clone(),
                    token: hold.token.unwrap_or_default(),
                });
            }
        }
        if new.holds.is_empty() {
            self.keys.remove(key);
        } else {
            self.keys.insert(key.clone(), new.clone());
        }
        Ok(())
    }

    fn next_token(&mut self, _key: &LockKey, _now: UnixMs) -> Result<u64, LockError> {
        if self.tokens_exhausted {
            return Err(LockError::TokensExhausted);
        }
        self.last_token += 1;
        Ok(self.last_token)
    }

    fn reports_expiries(&self) -> bool {
        false
    }

    fn event(&mut self, _key: &LockKey, _event: Event) {}

    fn publish_unlock(&mut self, key: &LockKey) {
        self.effects.push(Effect::Published { key: key.clone() });
    }

    fn elected(&mut self, key: &LockKey, token: u64, owner: &[u8], value: Option<&[u8]>) {
        self.effects.push(Effect::Elected {
            key: key.clone(),
            token,
            owner: owner.to_vec(),
            value: value.map(<[u8]>::to_vec),
        });
    }

    fn lost(&mut self, key: &LockKey, lost: &Lost) {
        self.effects.push(Effect::Lost {
            key: key.clone(),
            lost: lost.clone(),
        });
    }

    fn answer(&mut self, handle: u32, answer: Answer) {
        let at = self.now;
        self.effects.push(Effect::Answered { handle, answer, at });
    }

    fn push_ticket(&mut self, ticket: &TicketName, value: &[u8], expires_at: UnixMs) {
        assert_eq!(
            self.writes,
            Writes::Allowed,
            "a ticket written while writes are not allowed"
        );
        // Redis replaces an expired key; one still there is written twice.
        self.expire_tickets();
        assert!(!self.tickets.contains_key(ticket), "a ticket written twice");
        self.tickets.insert(*ticket, (value.to_vec(), expires_at));
        self.effects.push(Effect::TicketWritten {
            ticket: *ticket,
            value: value.to_vec(),
            expires_at,
            at: self.now,
        });
    }

    fn take_ticket(&mut self, ticket: &TicketName) -> Option<Vec<u8>> {
        assert_eq!(
            self.writes,
            Writes::Allowed,
            "a ticket taken while writes are not allowed"
        );
        self.pop_ticket(ticket)
    }

    fn note(&mut self, note: Note) {
        self.effects.push(Effect::Noted(note));
    }
}

/// The adapter's side of the loop, for tests: queue a blocked exclusive acquire as the
/// command would.
pub fn wait(
    s: &mut Scheduler<u32>,
    port: &mut FakePort,
    handle: u32,
    key: &LockKey,
    owner: &str,
    lease_ms: u64,
    wait: Wait,
) -> Result<WaiterId, LockError> {
    wait_as(
        s,
        port,
        handle,
        key,
        owner,
        Mode::Exclusive,
        lease_ms,
        wait,
        None,
    )
}

/// As [`wait`], for any mode, optionally bound to a connection.
#[allow(clippy::too_many_arguments)]
pub fn wait_as(
    s: &mut Scheduler<u32>,
    port: &mut FakePort,
    handle: u32,
    key: &LockKey,
    owner: &str,
    mode: Mode,
    lease_ms: u64,
    wait: Wait,
    bind: Option<ClientId>,
) -> Result<WaiterId, LockError> {
    wait_multi(
        s,
        port,
        handle,
        std::slice::from_ref(key),
        owner,
        mode,
        lease_ms,
        wait,
        bind,
    )
}

/// As [`wait_as`], on several keys at once (`LOCK.MACQUIRE ... WAIT`).
#[allow(clippy::too_many_arguments)]
pub fn wait_multi(
    s: &mut Scheduler<u32>,
    port: &mut FakePort,
    handle: u32,
    keys: &[LockKey],
    owner: &str,
    mode: Mode,
    lease_ms: u64,
    wait: Wait,
    bind: Option<ClientId>,
) -> Result<WaiterId, LockError> {
    let handle = Handle::Blocked(handle);
    wait_with(s, port, handle, keys, owner, mode, lease_ms, wait, bind)
}

/// A ticketed wait (`... WAIT t TICKET`) on `keys` by connection `client`: its ticket.
#[allow(clippy::too_many_arguments)]
pub fn wait_ticket(
    s: &mut Scheduler<u32>,
    port: &mut FakePort,
    client: ClientId,
    keys: &[LockKey],
    owner: &str,
    mode: Mode,
    lease_ms: u64,
    wait: Wait,
    bind: Option<ClientId>,
) -> Result<Ticket, LockError> {
    let shape = if keys.len() > 1 {
        Shape::Many
    } else {
        Shape::One
    };
    let first = keys.first().ok_or(LockError::Internal)?;
    let ticket = s.new_ticket(first, shape, client);
    let handle = Handle::Ticket(ticket);
    wait_with(s, port, handle, keys, owner, mode, lease_ms, wait, bind)?;
    deliver(s, port);
    Ok(ticket)
}

/// Queues a blocked client or a ticket on `keys`, as the command would.
#[allow(clippy::too_many_arguments)]
pub fn wait_with(
    s: &mut Scheduler<u32>,
    port: &mut FakePort,
    handle: Handle<u32>,
    keys: &[LockKey],
    owner: &str,
    mode: Mode,
    lease_ms: u64,
    wait: Wait,
    bind: Option<ClientId>,
) -> Result<WaiterId, LockError> {
    let now = port.now;
    let keys: Vec<(LockKey, Seen)> = keys
        .iter()
        .map(|key| {
            // As the command sees it (`command::Live`): holds whose lease ended do not count.
            let mut lock = port.lock(key).cloned().unwrap_or_else(Lock::free);
            lock.take_ended(now);
            let seen = if lock.holds.is_empty() {
                Seen::Free
            } else {
                Seen::Held {
                    next_lease_end: lock.next_lease_end(),
                }
            };
            (key.clone(), seen)
        })
        .collect();
    s.enqueue(
        port,
        NewWait {
            handle,
            keys: &keys,
            owner: owner.as_bytes(),
            lease_ms,
            wait,
            mode,
            reentry: crate::kind::Reentry::Counted,
            bind,
            campaign: None,
        },
        100_000,
        now,
    )
}

/// A client's own multi-key acquire (no wait), all or nothing, with the real rules: no
/// barging past any key's waiters. The tokens, or None when any key is busy.
pub fn acquire_multi(
    port: &mut FakePort,
    keys: &[(LockKey, bool)],
    owner: &str,
    mode: Mode,
    lease_ms: u64,
) -> Result<Option<Vec<u64>>, LockError> {
    let now = port.now;
    let mut grants = Vec::new();
    for (key, waiting) in keys {
        let lock = port.lock(key).cloned().unwrap_or_else(Lock::free);
        let queue = if *waiting {
            Queue::Waiting
        } else {
            Queue::Empty
        };
        match hold::decide(
            &lock,
            owner.as_bytes(),
            mode,
            lease_ms,
            Reentry::Counted,
            queue,
            now,
        )? {
            Decision::Busy => return Ok(None),
            Decision::Grant(g) => grants.push((key.clone(), lock, g)),
        }
    }
    let mut tokens = Vec::new();
    for (key, lock, g) in grants {
        let token = match g.token {
            Some(token) => token,
            None => {
                port.last_token += 1;
                port.last_token
            }
        };
        let new = hold::apply(&lock, owner.as_bytes(), mode, &g, token);
        port.keys.insert(key, new);
        tokens.push(token);
    }
    Ok(Some(tokens))
}

/// Moves the clock to `to`, firing the one timer at each deadline on the way, as the
/// adapter's precise module timer does; after each turn the adapter writes ticket answers.
pub fn advance_to(s: &mut Scheduler<u32>, port: &mut FakePort, to: UnixMs) {
    deliver(s, port);
    while let Some(at) = s.next_deadline().filter(|at| *at <= to) {
        port.now = port.now.max(at);
        s.timer_fired(port, port.now);
        deliver(s, port);
    }
    port.now = port.now.max(to);
}

/// The adapter's end of a turn: up to `port.deliver_max` ticket answers written.
pub fn deliver(s: &mut Scheduler<u32>, port: &mut FakePort) -> Delivery {
    let now = port.now;
    let max = port.deliver_max;
    s.deliver_tickets(port, max, now)
}

/// A release of the whole key inside a command: delete, then hand off or publish.
pub fn release(s: &mut Scheduler<u32>, port: &mut FakePort, key: &LockKey) {
    port.keys.remove(key);
    let now = port.now;
    s.freed(port, key, Left::Nothing, now);
    deliver(s, port);
}

/// One owner's release inside a command, with the real rule (`hold::release`).
pub fn release_owner(s: &mut Scheduler<u32>, port: &mut FakePort, key: &LockKey, owner: &[u8]) {
    let Some(lock) = port.lock(key).cloned() else {
        return;
    };
    let Some((new, _)) = hold::release(&lock, owner, None) else {
        return;
    };
    let free = new.holds.is_empty();
    if free {
        port.keys.remove(key);
    } else {
        port.keys.insert(key.clone(), new);
    }
    let now = port.now;
    let left = if free {
        Left::Nothing
    } else {
        Left::OtherHolds
    };
    s.freed(port, key, left, now);
    deliver(s, port);
}

/// A client pops a ticket (`BLPOP`): its element, if it held one; the server's `del` event
/// tells the scheduler its key went, as the adapter hears it.
pub fn pop(s: &mut Scheduler<u32>, port: &mut FakePort, ticket: &TicketName) -> Option<Vec<u8>> {
    let popped = port.pop_ticket(ticket);
    if popped.is_some() {
        s.ticket_popped(*ticket);
    }
    popped
}

/// What a ticket's list holds now (None: nothing, popped or not written).
pub fn ticket_value(port: &FakePort, ticket: &Ticket) -> Option<TicketValue> {
    port.tickets
        .get(&ticket.name)
        .and_then(|(v, _)| TicketValue::decode(v))
}

/// Every ticket answer written so far, in order: (ticket, value, expiry, when).
pub fn tickets_written(port: &FakePort) -> Vec<(TicketName, TicketValue, UnixMs, UnixMs)> {
    port.effects
        .iter()
        .filter_map(|e| match e {
            Effect::TicketWritten {
                ticket,
                value,
                expires_at,
                at,
            } => Some((*ticket, TicketValue::decode(value)?, *expires_at, *at)),
            _ => None,
        })
        .collect()
}

/// The answers written into tickets, each ticket's first (its answer: a grant that lapsed
/// unpopped is later rewritten `expired`, see [`lapses_checked`]).
pub fn tickets_answered(port: &FakePort) -> HashMap<TicketName, (TicketValue, UnixMs)> {
    let mut answered = HashMap::new();
    for (name, value, _, at) in tickets_written(port) {
        answered.entry(name).or_insert((value, at));
    }
    answered
}

/// Whether `expired` was written into the ticket (its grant lapsed unpopped).
pub fn lapsed(port: &FakePort, name: &TicketName) -> bool {
    tickets_written(port)
        .iter()
        .any(|(n, value, _, _)| n == name && *value == TicketValue::Lapsed)
}

/// Every `expired` written into a ticket replaced a grant written there before, once, and no
/// earlier than that grant's expiry (its lease end).
pub fn lapses_checked(port: &FakePort) -> Result<(), String> {
    let mut granted: HashMap<TicketName, UnixMs> = HashMap::new();
    let mut lapsed = HashSet::new();
    for (name, value, expires_at, at) in tickets_written(port) {
        match value {
            TicketValue::Granted(_) => {
                granted.insert(name, expires_at);
            }
            TicketValue::Lapsed => {
                let Some(&lease_end) = granted.get(&name) else {
                    return Err(format!("{name:?} answered expired without a grant"));
                };
                if at <= lease_end {
                    return Err(format!(
                        "{name:?} answered expired at {at}, lease end {lease_end}"
                    ));
                }
                if !lapsed.insert(name) {
                    return Err(format!("{name:?} answered expired twice"));
                }
            }
            _ => {}
        }
    }
    Ok(())
}
