//! Multi-key waiters (`LOCK.MACQUIRE ... WAIT`): one request queued on several keys in one
//! step, granted every key at one instant once it heads every one of those queues and every key
//! has room for it.
//!
//! Why no mix of requests can deadlock (among requests that hold none of the keys they wait
//! for; a waiter that holds a key another waiter needs is the classic hold-and-wait, see
//! docs/multi-key.md): a request enters all its queues at once, at their
//! tails, and keeps its place (ids only grow), so every queue lists its waiters in the order
//! they arrived. Of all waiting requests, the one that arrived first heads every queue it
//! stands in; nobody is granted a key past it, so the holds in its way only end (by release,
//! lease end or disconnect) and it is granted then. No cycle of requests each waiting behind
//! the next can form, whatever order callers list their keys in.

use std::hash::Hash;

use super::{Answer, Cause, Due, Event, Note, Origin, Port, Read, Scheduler};
use crate::hold::{Decision, Granted, Hold, How, Run, StoredLock};
use crate::key::ClientId;
use crate::kind::Mode;
use crate::queue::{LockKey, WaiterId};
use crate::LockError;
use crate::UnixMs;

/// One key of a multi-key request, as read for its decision.
struct KeyState {
    key: LockKey,
    stored: Option<StoredLock>,
    run: Run,
    ended: Vec<Hold>,
    /// The grant on this key if it has room (None: busy).
    grant: Option<Granted>,
    /// Something that is not a lock holds the key until this expiry (None: no expiry).
    not_a_lock: Option<Option<UnixMs>>,
}

impl<H: Copy + Eq + Hash> Scheduler<H> {
    /// The multi-key waiter `id` heads every queue it stands in: read every key once, and grant
    /// them all if each has room (written together, answered with a token per key); else write
    /// only what lease ends removed and watch each busy key's lease end. Returns whether it was
    /// granted.
    pub(super) fn pump_multi(
        &mut self,
        port: &mut impl Port<H>,
        id: WaiterId,
        trigger: &LockKey,
        now: UnixMs,
        cause: Cause,
        origin: Origin,
    ) -> bool {
        let Some(waiter) = self.queues.get(id) else {
            return false;
        };
        let keys: Vec<LockKey> = waiter.keys().cloned().collect();
        let (owner, mode, lease_ms, reentry, bind) = (
            waiter.owner.clone(),
            waiter.mode,
            waiter.lease_ms,
            waiter.reentry,
            waiter.bind,
        );
        let reads = port.read_many(&keys, origin == Origin::Background);
        let mut states = Vec::with_capacity(keys.len());
        for (key, read) in keys.into_iter().zip(reads) {
            let stored = match read {
                Read::Lock(stored) => stored,
                Read::NotALock { expires_at } => {
                    states.push(KeyState {
                        key,
                        stored: None,
                        run: Run::new(crate::hold::Lock::free()),
                        ended: Vec::new(),
                        grant: None,
                        not_a_lock: Some(expires_at),
                    });
                    continue;
                }
                Read::Moved(redirect) => {
                    // Every key of the request is in one slot: they all left with it.
                    self.refuse_all(port, &key, &redirect, Note::Redirected, now);
                    return false;
                }
            };
            let mut lock = stored
                .as_ref()
                .map_or_else(crate::hold::Lock::free, |s| s.lock.clone());
            let ended = lock.take_ended(now);
            let run = Run::new(lock);
            let grant = match run.decide(&owner, mode, lease_ms, reentry, now) {
                Ok(Decision::Grant(grant)) => {
                    // A key the owner holds already is re-entered only as it is held: an
                    // EPHEMERAL hold with EPHEMERAL, a plain one without (as a command's
                    // re-entry; see command::acquire).
                    if let Some(error) = self.binding_mismatch(&key, &grant, bind) {
                        self.refuse_multi(port, id, &error.reply(), Note::Mismatched, now);
                        return false;
                    }
                    Some(grant)
                }
                Ok(Decision::Busy) => None,
                Err(error) => {
                    // The request does not fit what this key is (a semaphore, say).
                    self.refuse_multi(port, id, &error.reply(), Note::Mismatched, now);
                    return false;
                }
            };
            states.push(KeyState {
                key,
                stored,
                run,
                ended,
                grant,
                not_a_lock: None,
            });
        }
        if states.iter().all(|s| s.grant.is_some()) {
            if let Some(tokens) = self.take_tokens(port, id, &mut states, &owner, mode, now) {
                let lease_ended = (cause == Cause::LeaseEnded).then_some(trigger);
                return self.grant_multi(port, id, states, tokens, now, lease_ended);
            }
            return false;
        }
        // Busy somewhere: nothing is granted. Holds whose lease ended are removed as a
        // one-key handoff would, and each key's lease end is watched.
        for state in &states {
            self.write_ended(port, state);
        }
        for state in states {
            let next = match state.not_a_lock {
                Some(expires_at) => expires_at,
                None => state.run.lock().next_lease_end(),
            };
            self.schedule_lease_check(&state.key, next, now);
        }
        false
    }

    /// Why a grant that re-enters a hold the owner has on `key` must be refused: it would
    /// change whether the hold is bound to a connection (as a command's re-entry is refused).
    fn binding_mismatch(
        &self,
        key: &LockKey,
        grant: &Granted,
        bind: Option<ClientId>,
    ) -> Option<LockError> {
        if grant.how != How::Reentered {
            return None;
        }
        let bound = grant.token.and_then(|t| self.bound_client(key, t));
        match (bound, bind) {
            (Some(_), None) => Some(LockError::HoldIsEphemeral),
            (None, Some(_)) => Some(LockError::HoldIsNotEphemeral),
            _ => None,
        }
    }

    /// A token for every key that needs a new one, each applied to its key's run. None (the
    /// request refused) when a key's tokens are exhausted.
    fn take_tokens(
        &mut self,
        port: &mut impl Port<H>,
        id: WaiterId,
        states: &mut [KeyState],
        owner: &[u8],
        mode: Mode,
        now: UnixMs,
    ) -> Option<Vec<u64>> {
        let mut tokens = Vec::with_capacity(states.len());
        for state in states.iter() {
            let Some(grant) = &state.grant else {
                return None;
            };
            let token = match grant.token {
                Some(token) => token,
                None => match port.next_token(&state.key, now) {
                    Ok(token) => token,
                    Err(error) => {
                        self.refuse_multi(port, id, &error.reply(), Note::Refused, now);
                        return None;
                    }
                },
            };
            tokens.push(token);
        }
        for (state, &token) in states.iter_mut().zip(&tokens) {
            if let Some(grant) = &state.grant {
                state.run.apply(owner, mode, grant, token);
            }
        }
        Some(tokens)
    }

    /// Writes every key (the server carries one command's or one timer's writes to replicas
    /// and the AOF as one MULTI/EXEC), then announces, binds and answers. `lease_ended`: the
    /// key whose holder's lease end let the request in.
    fn grant_multi(
        &mut self,
        port: &mut impl Port<H>,
        id: WaiterId,
        states: Vec<KeyState>,
        tokens: Vec<u64>,
        now: UnixMs,
        lease_ended: Option<&LockKey>,
    ) -> bool {
        for state in &states {
            if let Err(error) = port.write(&state.key, state.stored.as_ref(), state.run.lock()) {
                self.refuse_multi(port, id, &error.reply(), Note::Refused, now);
                return false;
            }
        }
        let Some(removed) = self.queues.remove(id) else {
            return false;
        };
        let waiter = self.forget(removed);
        let kind = waiter.mode.kind();
        let mut holds = Vec::with_capacity(states.len());
        for (state, token) in states.into_iter().zip(tokens) {
            self.announce_ended(port, &state.key, &state.ended);
            if lease_ended == Some(&state.key) {
                // Where the server reports every key expiry, a lease end that freed the whole
                // key was announced then.
                if state.ended.is_empty() && !port.reports_expiries() {
                    port.event(&state.key, Event::Expired);
                }
                port.note(Note::ExpiredWithWaiters {
                    key: state.key.clone(),
                });
            }
            port.event(&state.key, Event::Handoff);
            if let Some(client) = waiter.bind {
                self.bind(port, client, &state.key, kind, token, now);
            }
            // Behind it, on each key, somebody may fit too (shared after shared).
            if self.queues.has_waiters(&state.key) {
                self.deadlines.insert(now, Due::Recheck(state.key.clone()));
            }
            holds.push((state.key, token));
        }
        if let Some((key, _)) = holds.first() {
            port.note(Note::HandedOff {
                key: key.clone(),
                waited_ms: now.saturating_sub(waiter.enqueued_at),
            });
        }
        port.answer(
            waiter.handle,
            Answer::GrantedAll {
                holds,
                owner: Box::from(&*waiter.owner),
                kind,
            },
        );
        true
    }

    /// Removes holds whose lease ended from a key the request could not have yet.
    fn write_ended(&mut self, port: &mut impl Port<H>, state: &KeyState) {
        if state.ended.is_empty() {
            return;
        }
        if port
            .write(&state.key, state.stored.as_ref(), state.run.lock())
            .is_ok()
        {
            self.announce_ended(port, &state.key, &state.ended);
        }
    }

    /// Answers a multi-key waiter with an error; whoever stands behind it is looked at again.
    fn refuse_multi(
        &mut self,
        port: &mut impl Port<H>,
        id: WaiterId,
        reply: &str,
        note: Note,
        now: UnixMs,
    ) {
        if let Some(waiter) = self.remove_waiter(id, now) {
            port.note(note);
            port.answer(waiter.handle, Answer::Refused(reply.to_string()));
        }
    }
}
