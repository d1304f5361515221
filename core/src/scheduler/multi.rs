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

use super::{Answer, Note, Port, Scheduler};
use crate::hold::{Granted, How};
use crate::key::ClientId;
use crate::queue::{LockKey, WaiterId};
use crate::LockError;
use crate::UnixMs;

impl<H: Copy + Eq + Hash> Scheduler<H> {
    /// Why a grant that re-enters a hold the owner has on `key` must be refused: it would
    /// change whether the hold is bound to a connection (as a command's re-entry is refused).
    pub(super) fn binding_mismatch(
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

    /// Answers a multi-key waiter with an error; whoever stands behind it is looked at again.
    pub(super) fn refuse_multi(
        &mut self,
        port: &mut impl Port<H>,
        id: WaiterId,
        reply: &str,
        note: Note,
        now: UnixMs,
    ) {
        if let Some(waiter) = self.remove_waiter(id, now) {
            port.note(note);
            let answer = Answer::Refused(reply.to_string());
            self.answer(port, waiter.handle, waiter.lease_ms, answer, now);
        }
    }
}
