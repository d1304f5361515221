//! The scheduler's side of tickets (`... WAIT timeout-ms TICKET`, see [`crate::ticket`]).
//!
//! A ticket waits in the same queues as a blocked client, under the same rules (FIFO per key,
//! no barging, one grant per room made, the token minted at the grant, the hold written and
//! replicated before anyone is told). Only the answer travels another way: instead of
//! unblocking a client, the scheduler writes the answer into the ticket's list, where the
//! client pops it. Its life:
//!
//! 1. **queued** — in the wait queues, like a blocked client. [`Scheduler::cancel`] takes it
//!    out (`LOCK.CANCEL`, reply nil); so does the close of the connection that asked for it.
//! 2. **answered** — the answer is decided (a grant, the timeout, a redirect, an error) and
//!    waits in the outbox to be written: at most so many a turn of the event loop
//!    ([`Scheduler::deliver_tickets`]), so that a storm of grants does not keep the server from
//!    its other clients. A cancel takes a grant from here (the canceller now holds it); a close
//!    of the asking connection passes it on to the next waiter.
//! 3. **written** — the answer is in the list, with an expiry (a grant's is its lease end).
//!    Popping it is its delivery: the server deletes a list with its last element, so a ticket
//!    whose key is gone was popped, and a grant that was popped is never taken back. The server
//!    tells the module when the key goes (the generic `del` keyspace event, which every pop
//!    that empties a list raises: [`Scheduler::ticket_popped`]); a grant never popped expires
//!    with its lease, and the module writes `expired` in its place (a client still blocked on
//!    the ticket is answered). Until then a cancel takes it out of the list
//!    (the canceller holds it), and a close of the asking connection takes it out and passes
//!    it on — each finding the list gone if it was popped. An answer that is not a grant is
//!    forgotten once written (it expires after [`MARKER_TTL_MS`]).
//!
//! So a grant is delivered exactly once: popped, handed to a canceller, or passed on — never
//! two of these, since each takes it from the one place it is.
//!
//! [`MARKER_TTL_MS`]: crate::ticket::MARKER_TTL_MS

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

use super::*;
use crate::memory::{shrink_map, shrink_set};
use crate::slot::key_slot;
use crate::ticket::{Shape, Ticket, TicketIds, TicketName, TicketValue, MARKER_TTL_MS};

/// How many answers the adapter writes into tickets in one turn of the server's event loop
/// ([`Scheduler::deliver_tickets`]): each wakes the client blocked on its ticket, whom the
/// server serves right after the turn. The rest wait for the next turns.
pub const TICKETS_PER_TURN: usize = 500;

/// How many tickets of closed connections a turn ends at most (withdrawn from their queues, or
/// their grants passed on): a connection may own any number, and ending 200,000 in one turn
/// took the server over a second (release build). The rest are ended at the next turns,
/// `PAUSE_POLL_MS` apart: 2,000 a turn is a few milliseconds.
pub const TICKETS_ENDED_PER_TURN: usize = 2_000;

/// What became of a cancelled ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// It was still queued: it left the queue (reply nil).
    Left,
    /// It had been granted and not popped: the canceller holds the grant now (its tokens, in
    /// the order of the keys).
    Handed(Vec<u64>),
    /// Nothing to take: it was popped, answered without a grant, or is unknown here.
    Nothing,
}

/// What [`Scheduler::deliver_tickets`] left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Every decided answer is written.
    Done,
    /// More are waiting: call again at the next turn.
    More,
    /// Writes are paused: the scheduler looks again after the pause (its own timer).
    Deferred,
}

/// An answer decided and not yet written.
#[derive(Debug)]
struct Outgoing {
    client: ClientId,
    value: TicketValue,
    /// A grant's holds, to pass on if it is never delivered.
    grants: Vec<GrantRef>,
    /// A grant's lease end (the ticket's expiry).
    lease_end: UnixMs,
}

/// A grant written into its ticket and not yet seen popped.
#[derive(Debug)]
struct Pushed {
    client: ClientId,
    grants: Vec<GrantRef>,
    /// When it expires, unpopped, with its lease.
    expiry: DeadlineKey,
}

/// Every ticket the scheduler has not finished with.
#[derive(Debug, Default)]
pub(super) struct TicketBook {
    /// Where the tickets' ids come from (see `TicketIds`).
    ids: TicketIds,
    /// Answers decided and not yet written, in the order decided (a cancelled one is skipped).
    outbox: VecDeque<TicketName>,
    outgoing: HashMap<TicketName, Outgoing>,
    pushed: HashMap<TicketName, Pushed>,
    /// Each connection's tickets not yet done: queued, answered and not written, or a grant
    /// written and not seen popped.
    clients: HashMap<ClientId, HashSet<TicketName>>,
    open: usize,
}

impl TicketBook {
    fn track(&mut self, ticket: Ticket) {
        if self
            .clients
            .entry(ticket.client)
            .or_default()
            .insert(ticket.name)
        {
            self.open += 1;
        }
    }

    /// The ticket is done: nothing more will be written into it or taken from it.
    fn close(&mut self, name: &TicketName, client: ClientId) {
        if let Some(names) = self.clients.get_mut(&client) {
            if names.remove(name) {
                self.open -= 1;
            }
            if names.is_empty() {
                self.clients.remove(&client);
            } else {
                shrink_set(names);
            }
        }
        shrink_map(&mut self.clients);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.open == 0 && self.outbox.is_empty() && self.pushed.is_empty()
    }
}

/// A ticket's answer as written, and the holds a grant gave.
fn written(answer: Answer) -> (TicketValue, Vec<GrantRef>) {
    match answer {
        Answer::Granted {
            token, key, kind, ..
        } => (
            TicketValue::Granted(vec![token]),
            vec![GrantRef { key, kind, token }],
        ),
        Answer::GrantedAll { holds, kind, .. } => {
            let tokens = holds.iter().map(|(_, token)| *token).collect();
            let grants = holds
                .into_iter()
                .map(|(key, token)| GrantRef { key, kind, token })
                .collect();
            (TicketValue::Granted(tokens), grants)
        }
        Answer::TimedOut => (TicketValue::TimedOut, Vec::new()),
        Answer::Refused(reply) => (TicketValue::Refused(reply), Vec::new()),
    }
}

impl<H: Copy + Eq + Hash> Scheduler<H> {
    /// A new ticket for a wait on `key` (and, for a multi-key wait, the other keys of its
    /// slot), belonging to `client`. It is queued by [`Scheduler::enqueue`].
    pub fn new_ticket(&mut self, key: &LockKey, shape: Shape, client: ClientId) -> Ticket {
        let id = self.tickets.ids.next_id();
        Ticket {
            name: TicketName {
                id,
                db: key.db,
                slot: key_slot(&key.name),
                shape,
            },
            client,
        }
    }

    /// A queued ticket now belongs to its connection.
    pub(super) fn track_ticket(&mut self, handle: Handle<H>) {
        if let Handle::Ticket(ticket) = handle {
            self.tickets.track(ticket);
        }
    }

    /// Answers a waiter: a blocked client through the port at once, a ticket through the
    /// outbox (written by [`Scheduler::deliver_tickets`]). `lease_ms`: the waiter's lease, which
    /// a grant's ticket keeps the answer for.
    pub(super) fn answer(
        &mut self,
        port: &mut impl Port<H>,
        handle: Handle<H>,
        lease_ms: u64,
        answer: Answer,
        now: UnixMs,
    ) {
        match handle {
            Handle::Blocked(blocked) => port.answer(blocked, answer),
            Handle::Ticket(ticket) => {
                let (value, grants) = written(answer);
                self.tickets.outbox.push_back(ticket.name);
                self.tickets.outgoing.insert(
                    ticket.name,
                    Outgoing {
                        client: ticket.client,
                        value,
                        grants,
                        lease_end: now.saturating_add(lease_ms),
                    },
                );
            }
        }
    }

    /// Whether answers wait to be written into their tickets.
    pub fn tickets_to_deliver(&self) -> bool {
        !self.tickets.outbox.is_empty()
    }

    /// How many decided answers wait to be written.
    pub(super) fn tickets_unwritten(&self) -> usize {
        self.tickets.outgoing.len()
    }

    /// Writes up to `max` decided answers into their tickets, in the order decided. Each is a
    /// write (the adapter replicates it): nothing is written while writes are paused, and a
    /// replica writes nothing (its master's effects arrive by replication).
    pub fn deliver_tickets(
        &mut self,
        port: &mut impl Port<H>,
        max: usize,
        now: UnixMs,
    ) -> Delivery {
        if self.tickets.outbox.is_empty() {
            return Delivery::Done;
        }
        match port.writes() {
            Writes::Allowed => {}
            Writes::Paused => {
                if self.pause_check.is_none() {
                    self.arm_pause_check(now);
                }
                return Delivery::Deferred;
            }
            Writes::Replica => {
                while let Some(name) = self.tickets.outbox.pop_front() {
                    if let Some(out) = self.tickets.outgoing.remove(&name) {
                        self.tickets.close(&name, out.client);
                    }
                }
                self.tickets.outgoing = HashMap::new();
                return Delivery::Done;
            }
        }
        let mut written = 0;
        while written < max {
            let Some(name) = self.tickets.outbox.pop_front() else {
                break;
            };
            // Cancelled, or passed on with its connection, since it was decided.
            let Some(out) = self.tickets.outgoing.remove(&name) else {
                continue;
            };
            let expires_at = out.value.expires_at(out.lease_end, now);
            port.push_ticket(&name, &out.value.encode(), expires_at);
            written += 1;
            if out.grants.is_empty() {
                self.tickets.close(&name, out.client);
                continue;
            }
            // The server removes a key once its expiry is in the past (`now > at`).
            let expiry = self
                .deadlines
                .insert(expires_at.saturating_add(1), Due::GrantLapsed(name));
            self.tickets.pushed.insert(
                name,
                Pushed {
                    client: out.client,
                    grants: out.grants,
                    expiry,
                },
            );
        }
        shrink_map(&mut self.tickets.outgoing);
        if self.tickets.outbox.is_empty() {
            self.tickets.outbox = VecDeque::new();
            Delivery::Done
        } else {
            Delivery::More
        }
    }

    /// A ticket's key went (the server's `del` event: a pop took its last element, or a client
    /// deleted it): a grant written there was delivered, and nothing is left to take back.
    pub fn ticket_popped(&mut self, name: TicketName) {
        if let Some(pushed) = self.tickets.pushed.remove(&name) {
            self.deadlines.remove(pushed.expiry);
            self.tickets.close(&name, pushed.client);
            shrink_map(&mut self.tickets.pushed);
        }
    }

    /// A ticket key holding a grant nobody popped was taken away (`DEL`, `UNLINK`, `RENAME`,
    /// overwritten or evicted: the server reports the key still holding its element): the grant
    /// was not delivered. It is looked at as a grant that reached its lease end, at once
    /// ([`Scheduler::grant_lapsed`]): while its holds live it is written into the ticket again
    /// (the client popping it gets it), else the ticket is answered `expired` and the key goes
    /// to the next waiter. Never a hold nobody gets.
    pub fn ticket_taken_away(&mut self, name: TicketName, now: UnixMs) {
        if let Some(pushed) = self.tickets.pushed.get_mut(&name) {
            self.deadlines.remove(pushed.expiry);
            pushed.expiry = self.deadlines.insert(now, Due::GrantLapsed(name));
        }
    }

    /// `FLUSHDB` (Some) or `FLUSHALL` (None): the grants written into tickets there are gone
    /// with their holds (no `del` event tells of each key). Each is looked at as a grant that
    /// reached its lease end, at once ([`Scheduler::grant_lapsed`]): its ticket is answered
    /// `expired`, so that a client popping it later is told.
    pub(super) fn tickets_flushed(&mut self, db: Option<i32>, now: UnixMs) {
        let gone: Vec<TicketName> = self
            .tickets
            .pushed
            .keys()
            .filter(|name| db.is_none_or(|db| name.db == db))
            .copied()
            .collect();
        for name in gone {
            if let Some(pushed) = self.tickets.pushed.get_mut(&name) {
                self.deadlines.remove(pushed.expiry);
                pushed.expiry = self.deadlines.insert(now, Due::GrantLapsed(name));
            }
        }
    }

    /// A grant never seen popped reached its lease end: the ticket expired with it. If the hold
    /// lives on under the grant's tokens (its owner's name renewed it: `LOCK.RENEW` is by owner),
    /// the grant stands: it is written back, to expire with the new lease end, and looked at
    /// again then. Otherwise the hold is gone and, so that a client still blocked on the ticket
    /// is answered rather than left waiting, the ticket says so ([`TicketValue::Lapsed`]); any
    /// hold of a multi-key grant left on another key is ended (nobody received it). Writing is a
    /// write: while writes are paused it waits for the pause to end.
    pub(super) fn grant_lapsed(&mut self, port: &mut impl Port<H>, name: TicketName, now: UnixMs) {
        let Some(pushed) = self.tickets.pushed.remove(&name) else {
            return;
        };
        match port.writes() {
            Writes::Paused => {
                let expiry = self
                    .deadlines
                    .insert(now.saturating_add(PAUSE_POLL_MS), Due::GrantLapsed(name));
                self.tickets
                    .pushed
                    .insert(name, Pushed { expiry, ..pushed });
                return;
            }
            // Its master writes the answer; the replica gets it by replication.
            Writes::Replica => {}
            Writes::Allowed => {
                if let Some(lease_end) = self.grant_held_until(port, &pushed.grants, now) {
                    let tokens = pushed.grants.iter().map(|g| g.token).collect();
                    port.push_ticket(&name, &TicketValue::Granted(tokens).encode(), lease_end);
                    let expiry = self
                        .deadlines
                        .insert(lease_end.saturating_add(1), Due::GrantLapsed(name));
                    self.tickets
                        .pushed
                        .insert(name, Pushed { expiry, ..pushed });
                    return;
                }
                port.note(Note::GrantLapsed);
                let lapsed = TicketValue::Lapsed;
                port.push_ticket(&name, &lapsed.encode(), lapsed.expires_at(now, now));
                for grant in &pushed.grants {
                    self.abandon(port, grant, now);
                }
            }
        }
        self.tickets.close(&name, pushed.client);
        shrink_map(&mut self.tickets.pushed);
    }

    /// Until when every hold of a grant lives on (the earliest lease end), None once one is
    /// gone. A hold with no lease (made outside the module) counts as lasting a marker's time.
    fn grant_held_until(
        &mut self,
        port: &mut impl Port<H>,
        grants: &[GrantRef],
        now: UnixMs,
    ) -> Option<UnixMs> {
        let mut until = UnixMs::MAX;
        for grant in grants {
            let Read::Lock(Some(stored)) = port.read(&grant.key, false) else {
                return None;
            };
            let hold =
                stored.lock.holds.iter().find(|h| {
                    h.kind == grant.kind && h.token == Some(grant.token) && !h.ended(now)
                })?;
            let end = hold
                .expires_at
                .unwrap_or_else(|| now.saturating_add(MARKER_TTL_MS));
            until = until.min(end);
        }
        Some(until)
    }

    /// `LOCK.CANCEL`: takes a ticket out of the queue, or takes its grant if it was not popped
    /// (the canceller holds it then). A grant that was popped stays with whoever popped it. The
    /// adapter refuses this on a replica and while writes are paused (it may write).
    pub fn cancel(&mut self, port: &mut impl Port<H>, name: TicketName, now: UnixMs) -> Cancelled {
        self.turn = Turn::default();
        let probe = Handle::Ticket(Ticket { name, client: 0 });
        if let Some(id) = self.queues.id_of(probe) {
            if let Some(waiter) = self.remove_waiter(id, now) {
                port.note(Note::Cancelled);
                if let Handle::Ticket(ticket) = waiter.handle {
                    self.tickets.close(&name, ticket.client);
                }
                return Cancelled::Left;
            }
        }
        if let Some(out) = self.tickets.outgoing.remove(&name) {
            self.tickets.close(&name, out.client);
            return match out.value {
                TicketValue::Granted(tokens) => {
                    port.note(Note::TicketTaken);
                    Cancelled::Handed(tokens)
                }
                _ => Cancelled::Nothing,
            };
        }
        let taken = port.take_ticket(&name);
        // A grant this process wrote is handed over as it was written, while its holds live,
        // whatever the ticket holds now (a client may write into it): never a token of
        // nobody's hold.
        if let Some(pushed) = self.tickets.pushed.remove(&name) {
            self.deadlines.remove(pushed.expiry);
            self.tickets.close(&name, pushed.client);
            if self.grant_held_until(port, &pushed.grants, now).is_some() {
                port.note(Note::TicketTaken);
                return Cancelled::Handed(pushed.grants.iter().map(|g| g.token).collect());
            }
            self.pass_on(port, &pushed.grants, now);
            return Cancelled::Nothing;
        }
        // One this process did not write (a restart, a failover): what the ticket holds, in
        // the ticket's own shape (one token, or one a key).
        match taken.and_then(|v| TicketValue::decode(&v)) {
            Some(TicketValue::Granted(tokens)) if name.shape != Shape::One || tokens.len() == 1 => {
                port.note(Note::TicketTaken);
                Cancelled::Handed(tokens)
            }
            _ => Cancelled::Nothing,
        }
    }

    /// Connections closed: their queued tickets leave the queues, and every grant of theirs
    /// that was not delivered (decided and not written, or written and not popped) is passed
    /// on, as a grant whose blocked client vanished is. Taking a written grant back is a write:
    /// while writes are paused that part waits for the pause to end (the connections are
    /// returned to be looked at again then).
    pub(super) fn end_tickets(
        &mut self,
        port: &mut impl Port<H>,
        clients: &[ClientId],
        now: UnixMs,
    ) -> Vec<ClientId> {
        let mut later = Vec::new();
        let writes = port.writes();
        for &client in clients {
            // At most TICKETS_ENDED_PER_TURN a turn: one connection may own any number of
            // tickets, and the rest are ended at the next turns (the client comes back in
            // `later`; its bindings wait until its tickets are done).
            let room = TICKETS_ENDED_PER_TURN.saturating_sub(self.turn.tickets_ended);
            let Some(all) = self.tickets.clients.get_mut(&client) else {
                continue;
            };
            let names: Vec<TicketName> = all.iter().take(room).copied().collect();
            for name in &names {
                all.remove(name);
            }
            if all.is_empty() {
                self.tickets.clients.remove(&client);
            } else {
                later.push(client);
            }
            self.turn.tickets_ended += names.len();
            let mut kept = HashSet::new();
            for name in names {
                self.tickets.open -= 1;
                let probe = Handle::Ticket(Ticket { name, client });
                if let Some(id) = self.queues.id_of(probe) {
                    if self.remove_waiter(id, now).is_some() {
                        port.note(Note::Cancelled);
                    }
                    continue;
                }
                // An answer that is not a grant is dropped unwritten: nobody is left to ask.
                if self
                    .tickets
                    .outgoing
                    .get(&name)
                    .is_some_and(|out| out.grants.is_empty())
                {
                    self.tickets.outgoing.remove(&name);
                    continue;
                }
                match writes {
                    Writes::Paused => {
                        kept.insert(name);
                        continue;
                    }
                    Writes::Replica => {
                        self.tickets.outgoing.remove(&name);
                        if let Some(pushed) = self.tickets.pushed.remove(&name) {
                            self.deadlines.remove(pushed.expiry);
                        }
                        continue;
                    }
                    Writes::Allowed => {}
                }
                if let Some(out) = self.tickets.outgoing.remove(&name) {
                    self.pass_on(port, &out.grants, now);
                } else if let Some(pushed) = self.tickets.pushed.remove(&name) {
                    self.deadlines.remove(pushed.expiry);
                    if port.take_ticket(&name).is_some() {
                        self.pass_on(port, &pushed.grants, now);
                    }
                }
            }
            if !kept.is_empty() {
                self.tickets.open += kept.len();
                self.tickets.clients.entry(client).or_default().extend(kept);
                if later.last() != Some(&client) {
                    later.push(client);
                }
            }
        }
        shrink_map(&mut self.tickets.clients);
        shrink_map(&mut self.tickets.outgoing);
        shrink_map(&mut self.tickets.pushed);
        later
    }

    /// A grant nobody received: each of its holds ends if it is still exactly that grant, and
    /// its key goes to the next waiter (or is published free).
    pub(super) fn pass_on(&mut self, port: &mut impl Port<H>, grants: &[GrantRef], now: UnixMs) {
        if grants.is_empty() {
            return;
        }
        port.note(Note::AbandonedGrant);
        for grant in grants {
            self.abandon(port, grant, now);
        }
    }

    /// Tickets not yet done: queued, answered and not written, or a grant not seen popped.
    pub fn open_tickets(&self) -> usize {
        self.tickets.open
    }

    /// Whether any connection has a ticket not yet done (its close must be looked at).
    pub fn any_tickets(&self) -> bool {
        !self.tickets.clients.is_empty()
    }

    /// Answers decided and not yet written (for the model tests).
    #[cfg(test)]
    pub(super) fn decided_tickets(&self) -> Vec<(TicketName, TicketValue)> {
        self.tickets
            .outgoing
            .iter()
            .map(|(name, out)| (*name, out.value.clone()))
            .collect()
    }
}
