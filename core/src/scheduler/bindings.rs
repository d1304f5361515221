//! The scheduler's side of `EPHEMERAL` holds: binding grants to connections, ending a closed
//! connection's holds (grouped by key: one read and one write per key), following keys across
//! databases, and the sweep that forgets bindings of holds that ended unseen. What is bound is
//! kept by `crate::binding`; this is what the scheduler does with it.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use super::*;

/// The holds (kind, token) that exist now on the keys read so far, for pruning bindings.
#[derive(Default)]
struct LiveHolds {
    keys: HashMap<LockKey, HashSet<(HoldKind, u64)>>,
    /// Holds read so far.
    holds_read: usize,
}

impl LiveHolds {
    /// Reads each key of `grants` not read yet (once).
    fn read_keys_of<H>(&mut self, grants: &[GrantRef], port: &mut impl Port<H>, now: UnixMs) {
        for grant in grants {
            if self.keys.contains_key(&grant.key) {
                continue;
            }
            let holds: HashSet<(HoldKind, u64)> = match port.read(&grant.key, false) {
                Read::Lock(Some(stored)) => stored
                    .lock
                    .holds
                    .iter()
                    .filter(|h| h.expires_at.is_none_or(|at| now <= at))
                    .filter_map(|h| h.token.map(|t| (h.kind, t)))
                    .collect(),
                _ => HashSet::new(),
            };
            self.holds_read += holds.len();
            self.keys.insert(grant.key.clone(), holds);
        }
    }

    fn has(&self, grant: &GrantRef) -> bool {
        self.keys
            .get(&grant.key)
            .is_some_and(|holds| holds.contains(&(grant.kind, grant.token)))
    }
}

impl<H: Copy + Eq + Hash> Scheduler<H> {
    /// A grant (by a command or to a waiter) of an `EPHEMERAL` hold to `client`: it ends when
    /// that connection closes. When the connection's list has grown, first checks which of its
    /// holds still exist (holds also end by DEL, lease ends, FORCERELEASE); keeps the sweep armed.
    pub fn bind(
        &mut self,
        port: &mut impl Port<H>,
        client: ClientId,
        key: &LockKey,
        kind: HoldKind,
        token: u64,
        now: UnixMs,
    ) {
        if self.bindings.bind(client, key, kind, token) {
            self.prune_bindings(port, client, now);
        }
        if self.binding_sweep.is_none() {
            self.binding_sweep = Some(
                self.deadlines
                    .insert(now.saturating_add(BINDING_SWEEP_MS), Due::BindingSweep),
            );
        }
    }

    /// Forgets the bindings of `client`'s holds that no longer exist: each key it holds is read
    /// once, however many of its holds are there.
    pub(super) fn prune_bindings(
        &mut self,
        port: &mut impl Port<H>,
        client: ClientId,
        now: UnixMs,
    ) {
        let mut live = LiveHolds::default();
        live.read_keys_of(&self.bindings.grants_of(client), port, now);
        self.prune_with(client, &live);
    }

    fn prune_with(&mut self, client: ClientId, live: &LiveHolds) {
        self.bindings.prune(client, |grant| live.has(grant));
        self.stop_idle_sweep();
    }

    /// Checks the bound holds of the next connections (round robin) and forgets those whose hold
    /// ended unseen. Each key is read once per sweep however many connections hold it, within
    /// [`BINDING_SWEEP_BINDINGS`] and [`BINDING_SWEEP_HOLDS_READ`].
    pub(super) fn sweep_bindings(&mut self, port: &mut impl Port<H>, now: UnixMs) {
        #[cfg(test)]
        {
            self.sweeps_run += 1;
        }
        let (clients, _) = self
            .bindings
            .clients_after(self.sweep_after, BINDING_SWEEP_BINDINGS);
        let mut live = LiveHolds::default();
        let mut swept = Vec::new();
        let mut checked = 0;
        for client in clients {
            let grants = self.bindings.grants_of(client);
            let needs_read = grants.iter().any(|g| !live.keys.contains_key(&g.key));
            let full = checked + grants.len() > BINDING_SWEEP_BINDINGS
                || (needs_read && live.holds_read >= BINDING_SWEEP_HOLDS_READ);
            if full && !swept.is_empty() {
                break;
            }
            live.read_keys_of(&grants, port, now);
            checked += grants.len();
            swept.push(client);
        }
        for &client in &swept {
            self.prune_with(client, &live);
        }
        self.sweep_after = swept.last().copied().unwrap_or(0);
        self.binding_sweep = (!self.bindings.is_empty()).then(|| {
            self.deadlines
                .insert(now.saturating_add(BINDING_SWEEP_MS), Due::BindingSweep)
        });
    }

    /// The owner ended a hold itself (its last release, a FORCERELEASE): forget its binding.
    pub fn unbind(&mut self, key: &LockKey, token: u64) {
        if !self.bindings.is_empty() {
            self.bindings.unbind(key, token);
            self.stop_idle_sweep();
        }
    }

    /// Once no hold is bound, the sweep stops (an idle module keeps no timer: MODULE UNLOAD).
    pub(super) fn stop_idle_sweep(&mut self) {
        if self.bindings.is_empty() {
            if let Some(sweep) = self.binding_sweep.take() {
                self.deadlines.remove(sweep);
            }
        }
    }

    /// The connection a hold (named by its key and token) is bound to, if any.
    pub fn bound_client(&self, key: &LockKey, token: u64) -> Option<ClientId> {
        if self.bindings.is_empty() {
            return None;
        }
        self.bindings.client_of(key, token)
    }

    /// The server became a replica: no connection of it binds a hold any more (its master's
    /// effects end the holds), and a later promotion must not revive the bindings.
    pub fn forget_bindings(&mut self) {
        self.bindings.clear();
        self.gone_later.clear();
        self.stop_idle_sweep();
    }

    /// `SWAPDB a b`: bound holds follow their keys.
    pub fn swap_databases(&mut self, a: i32, b: i32) {
        self.bindings.swap_databases(a, b);
    }

    /// `MOVE`/`RENAME` took `from` (holding these tokens) to `to`: bound holds follow it.
    pub fn key_moved(&mut self, from: &LockKey, to: &LockKey, tokens: &[u64]) {
        if !self.bindings.is_empty() {
            self.bindings.moved(from, to, tokens);
        }
    }

    /// `FLUSHDB` (Some) or `FLUSHALL` (None): the holds there are gone, with their bindings,
    /// and so are the tickets written there.
    pub fn flushed(&mut self, db: Option<i32>, now: UnixMs) {
        if !self.bindings.is_empty() {
            self.bindings.flushed(db);
            self.stop_idle_sweep();
        }
        self.tickets_flushed(db, now);
    }

    /// Holds bound to connections (INFO).
    pub fn bound_holds(&self) -> usize {
        self.bindings.len()
    }

    /// Connections closed: their tickets go (see [`Scheduler::end_tickets`]), every hold bound
    /// to them ends now (all re-entries), and each key goes to its waiters as after a release. Each key is read and written once, however many of
    /// its holds end. While writes are paused this happens after the pause.
    pub fn clients_gone(&mut self, port: &mut impl Port<H>, clients: Vec<ClientId>, now: UnixMs) {
        self.turn = Default::default();
        self.end_connections(port, clients, now);
    }

    /// [`Scheduler::clients_gone`], inside a turn already begun.
    pub(super) fn end_connections(
        &mut self,
        port: &mut impl Port<H>,
        clients: Vec<ClientId>,
        now: UnixMs,
    ) {
        // Their tickets first: a grant of theirs nobody popped ends as undelivered, before
        // its binding (if EPHEMERAL) would end it as disconnected.
        // A connection whose tickets are not all ended (writes paused, or more than a turn
        // ends) comes back at the pause check, its holds then.
        let later = self.end_tickets(port, &clients, now);
        let mut clients = clients;
        clients.retain(|c| self.bindings.holds_of(*c) > 0 && !later.contains(c));
        if !later.is_empty() {
            self.gone_later.extend(later);
            if self.pause_check.is_none() {
                self.arm_pause_check(now);
            }
        }
        if clients.is_empty() {
            return;
        }
        match port.writes() {
            Writes::Allowed => {}
            // A replica's holds end with its master's effects; nothing is bound here anyway.
            Writes::Replica => {
                for client in clients {
                    self.bindings.take_client(client);
                }
                self.stop_idle_sweep();
                return;
            }
            Writes::Paused => {
                self.gone_later.extend(clients);
                if self.pause_check.is_none() {
                    self.arm_pause_check(now);
                }
                return;
            }
        }
        let mut keys: Vec<(LockKey, HashSet<(HoldKind, u64)>)> = Vec::new();
        let mut at: HashMap<LockKey, usize> = HashMap::new();
        let grants: Vec<GrantRef> = clients
            .into_iter()
            .flat_map(|client| self.bindings.take_client(client))
            .collect();
        self.stop_idle_sweep();
        for grant in grants {
            {
                let i = *at.entry(grant.key.clone()).or_insert_with(|| {
                    keys.push((grant.key.clone(), HashSet::new()));
                    keys.len() - 1
                });
                if let Some((_, ending)) = keys.get_mut(i) {
                    ending.insert((grant.kind, grant.token));
                }
            }
        }
        for (key, ending) in keys {
            let Some((removed, left)) =
                self.end_holds(port, &key, &ending, Ending::ConnectionClosed, now)
            else {
                continue;
            };
            for _ in 0..removed {
                port.event(&key, Event::Disconnected);
                port.note(Note::Disconnected { key: key.clone() });
            }
            self.room_made(port, &key, left, now, Origin::Background);
        }
    }

    /// Ends the named holds of one key in one read and one write. Returns how many ended and
    /// what is left of the key; None when none of them was there any more.
    pub(super) fn end_holds(
        &mut self,
        port: &mut impl Port<H>,
        key: &LockKey,
        ending: &HashSet<(HoldKind, u64)>,
        why: Ending,
        now: UnixMs,
    ) -> Option<(usize, Left)> {
        let Read::Lock(Some(stored)) = port.read(key, false) else {
            return None;
        };
        let mut lock = stored.lock.clone();
        let ended = lock.take_ended(now);
        let removed = hold::remove_holds(&mut lock, ending, why == Ending::ConnectionClosed);
        if removed.is_empty() {
            return None;
        }
        port.write(key, Some(&stored), &lock).ok()?;
        // Their holders lost them: the lease-ended ones this write removed, and the named ones
        // whose connection closed (an undelivered grant's holder never knew it held it).
        for hold in &ended {
            port.lost(key, &Lost::of(hold, LostReason::Expired));
        }
        if why == Ending::ConnectionClosed {
            for hold in &removed {
                port.lost(key, &Lost::of(hold, LostReason::Disconnected));
            }
        }
        let removed = removed.len();
        let left = if lock.holds.is_empty() {
            Left::Nothing
        } else {
            Left::OtherHolds
        };
        Some((removed, left))
    }
}
