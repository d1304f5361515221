//! One hold's state as a machine with no I/O: events in (each with the local monotonic time it
//! was observed), a state and actions out. The shell (`hold.rs`, the keeper, the signal
//! listener, the acquire and release paths) only turns replies, messages and timers into events
//! and carries out what the machine asks.
//!
//! The rules, each tested below (and against a reference model in `model.rs`):
//! 1. *Held* only after `Granted` — and, when the wait took a third of the lease or more, after
//!    a confirmation the server answered (a renewal sent at once, or for a fixed lease a read of
//!    the lease left): the grant happened somewhere between the acquire's send and its reply,
//!    and the only safe bound on the lease's end is the send time plus the lease, which a long
//!    wait has nearly used up. That is no evidence of a loss; the confirmation's own send time
//!    gives a fresh bound. When grants must be acknowledged by replicas, every grant is
//!    confirmed (a renewal followed by `WAIT`), and one the replicas did not acknowledge is
//!    refused (and released): not safely acquired.
//! 2. The local deadline moves only on evidence from the server (a renewal answered, a re-entry,
//!    a read of the lease left), counted from that command's *send* time, minus a tenth of the
//!    lease for clock drift; it never moves back. When renewals must be acknowledged by
//!    replicas, only an acknowledged renewal moves it (a master that dies before replicating a
//!    renewal leaves the new master with the older lease end; a read or a re-entry on the
//!    master says nothing of the replicas).
//! 3. *Lost* only on evidence: a renewal answered 0 (or, bound to its connection, not at all), a
//!    check that no longer finds the hold, the `EPHEMERAL` connection closing, the handle's
//!    acquire answered with another token, or time passing the deadline (no confirmed renewal
//!    for a lease: the backstop). A message is never evidence: anyone allowed to publish on the
//!    channel can send one. A message that names this hold, or may concern it, asks for a check
//!    (a read of the server), and only the check's answer counts; a check with no answer changes
//!    nothing.
//! 4. After *Lost* or *Released* nothing renews, and nothing changes the state.
//! 5. A loss the server may not know of yet (the deadline passed with no renewal confirmed, or
//!    the master the hold was bound on was replaced) asks for the hold's release in the
//!    background (`abandon`): nobody else waits out a hold this side no longer believes in.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lost::{LostReason, Status};
use crate::message::LostSignal;

/// How a hold's lease is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The watchdog renews at a third of the lease.
    Watchdog,
    /// Nothing renews; the hold is reported lost at its lease end.
    Fixed,
}

/// What a hold is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    /// Nothing: a lease.
    Lease,
    /// A connection of its own (`EPHEMERAL`): when it fails, the hold is gone.
    Connection,
}

/// The keys of a hold and how its commands name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// One key (`LOCK.RENEW key ...`).
    One,
    /// Several held together (`LOCK.MRENEW numkeys key ...`): a lost hold still holds its
    /// other keys, so its release is sent all the same.
    Many,
}

/// Who a hold is: what a signal must name to be about it.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) db: i64,
    /// The keys, in the order given; never empty.
    pub(crate) keys: Arc<[Arc<[u8]>]>,
    pub(crate) owner: Arc<str>,
    /// A fencing token per key, in the keys' order.
    pub(crate) tokens: Arc<[u64]>,
}

impl Identity {
    /// Whether a one-hold message names exactly this hold.
    fn is_named_by(&self, db: i64, key: &[u8], owner: &[u8], token: u64) -> bool {
        db == self.db
            && owner == self.owner.as_bytes()
            && self
                .keys
                .iter()
                .zip(self.tokens.iter())
                .any(|(k, t)| **k == *key && *t == token)
    }

    /// Whether a message concerns one of this hold's keys.
    fn is_concerned_by(&self, signal: &LostSignal) -> bool {
        self.keys.iter().any(|k| signal.concerns(self.db, k))
    }
}

/// The terms of a hold, fixed when it is made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) lease: Duration,
    pub(crate) renewal: Renewal,
    pub(crate) binding: Binding,
    pub(crate) form: Form,
    /// Grants and renewals count only once replicas acknowledged them (`WAIT`/`WAITAOF` after
    /// each).
    pub(crate) acknowledged: bool,
}

impl Terms {
    /// How often the watchdog renews: a third of the lease (at least 1 ms).
    pub(crate) fn interval(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(1))
    }

    /// How soon a renewal that got no answer is sent again.
    fn retry(&self) -> Duration {
        self.interval().min(Duration::from_millis(100))
    }

    /// The local bound a command sent at `sent` gives, when the server answered that the hold
    /// lasts `left` from when it ran (no earlier than `sent`): minus a tenth of the lease for
    /// clock drift. A hold with no lease on the server ([`NO_LEASE`]) has none.
    fn bound(&self, sent: Instant, left: Duration) -> Instant {
        sent + left.saturating_sub(self.lease / 10).min(NEVER)
    }

    /// How many confirmations an acquire sends before it gives up on a server that answers none.
    const CONFIRMATIONS: u32 = 3;
}

/// Where a hold stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// The acquire is on its way.
    Acquiring,
    /// Granted after a long wait; the confirmation is on its way (`attempts` sent so far). The
    /// guard has not reached the application.
    Confirming {
        attempts: u32,
    },
    /// Held until at least `deadline`; the watchdog renews at `next` (unless `renewing`: one
    /// renewal at a time).
    Held {
        deadline: Instant,
        next: Instant,
        renewing: bool,
    },
    /// The release is on its way.
    Releasing,
    Released,
    Lost(LostReason),
    /// Granted, but the confirmation found the hold gone or got no answer: the guard never
    /// reached the application.
    Refused,
}

/// A read whose answer is an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// `LOCK.RENEW`/`LOCK.MRENEW`: the watchdog's, or an acquire's confirmation.
    Renewal,
    /// A fixed lease's confirmation: the lease this hold has left (`LOCK.INFO`).
    LeaseLeft,
    /// Whether the hold is still there after a message that may concern it (`LOCK.CHECK`), or
    /// after its connection closed; `LostReason` is what to report if not.
    Check(LostReason),
}

/// How long a hold lasts that has no lease on the server (`LOCK.INFO` shows `ttl` `-1`):
/// nothing ends it but a release, so this side never reports it lost for time alone.
pub(crate) const NO_LEASE: Duration = Duration::MAX;

/// A deadline as good as never, that an [`Instant`] can still hold (about 30 years on).
pub(crate) const NEVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// What the server answered to a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The hold is there, and lasts at least this long from when the read ran, if known
    /// ([`NO_LEASE`]: the server has no lease on it).
    Holds(Option<Duration>),
    /// The hold is there, but fewer replicas acknowledged the renewal than asked: no evidence
    /// that a promoted replica would have it.
    Unacknowledged,
    /// The hold is not there.
    Gone,
    /// The server's ACL refused the read (`NOPERM`): this side cannot keep the hold (a renewal
    /// refused never renews it; a check refused never confirms its token).
    Refused,
    /// No answer (the connection broke or timed out), or one that says nothing.
    Nothing,
}

/// Something observed about the hold.
#[derive(Debug, Clone)]
pub(crate) enum Event<'a> {
    /// The acquire's reply: the server granted between `sent` and `replied`.
    Granted { sent: Instant, replied: Instant },
    /// An acquire through the same handle answered this hold's tokens (a re-entry, which sets
    /// the lease again).
    Reentered { sent: Instant },
    /// An acquire through the same handle answered another token, or none: this hold is gone.
    Replaced,
    /// A read sent at `sent` was answered at `replied`.
    Answered {
        read: Read,
        sent: Instant,
        replied: Instant,
        answer: Answer,
    },
    /// A message of the lost-hold signal (about this hold or not): a hint that asks for a
    /// check, never evidence. While a grant is confirmed, the confirmation is the read that
    /// tells.
    Signal(&'a LostSignal),
    /// The connection the hold is bound to closed or failed (the server ends the hold when it
    /// sees that: it is reported once a read finds it gone).
    ConnectionLost,
    /// The master the hold is bound to was replaced (a failover, through Sentinel): the new
    /// master has the hold bound to nothing until its lease ends, nobody can renew it there as
    /// an EPHEMERAL hold, and the old master no longer counts: the binding the hold was taken
    /// for is gone, which is reported at once.
    MasterReplaced,
    /// The hold is bound to nothing any more, but lives on: in a cluster its key moved to
    /// another node with its slot (the node it was bound on no longer has it; the new one has
    /// it, bound to nothing, until its lease ends). From here it is a plain lease.
    Unbound,
    /// The server refused a command fenced with this hold's token (`LOCK.GUARD` answered
    /// `FENCED`): it no longer holds it under this token, for `reason`.
    Fenced(LostReason),
    /// The application released the hold (its last guard).
    ReleaseRequested,
    /// The release was answered (or could not be sent).
    ReleaseReplied,
    /// Time passed.
    Tick { now: Instant },
}

/// When the shell should tick the machine next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    At(Instant),
    Never,
}

/// What the machine asks the shell to do after an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Actions {
    /// Hand the guard to the application (the acquire returns it).
    pub(crate) deliver: bool,
    /// The acquire fails (the guard is not handed out).
    pub(crate) refuse: Option<Refusal>,
    /// Send a renewal now; answer with `Read::Renewal`.
    pub(crate) renew: bool,
    /// Read the lease this hold has left; answer with `Read::LeaseLeft`.
    pub(crate) read_lease: bool,
    /// Check that the hold is still there (every key); answer with `Read::Check(reason)`.
    /// `moved`: the key changed nodes — read where it is now, and move the subscription there.
    pub(crate) check: Option<Check>,
    /// Send the release.
    pub(crate) release: bool,
    /// The hold is lost to this side, but the server may still have it (no renewal confirmed
    /// for a lease, a fixed lease at its local end, or the master it was bound on replaced):
    /// release it in the background by its token, wherever the master is now, so that nobody
    /// waits it out.
    pub(crate) abandon: bool,
    /// The status the application sees changed.
    pub(crate) notify: bool,
    /// Tick the machine then (instead of any earlier wake-up).
    pub(crate) wake: Option<Wake>,
}

/// Why an acquire's grant is not handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The confirmation found the hold gone.
    Gone(LostReason),
    /// The server answered no confirmation: the hold is released in the background
    /// ([`Actions::abandon`]).
    Unanswered,
    /// Fewer replicas acknowledged the grant than asked: the hold is released
    /// ([`Actions::release`]: by the acquire, by its token, before it returns the error).
    Unacknowledged,
    /// The server's ACL refused the confirmation: the hold may be on the server, and is
    /// released as an unacknowledged one is ([`Actions::release`]).
    Denied,
}

/// A check the machine asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Check {
    pub(crate) reason: LostReason,
    pub(crate) moved: bool,
    /// The connection an `EPHEMERAL` hold is bound to closed: the server ends the hold as soon
    /// as it sees the close, which may be after this side saw it (a kill is seen by both at
    /// once; a close of this side's is seen by the server a moment later). Read again, a few
    /// milliseconds apart, until the hold is gone (or the machine ends it otherwise), so that
    /// the loss is reported as soon as the server no longer holds it, and not before.
    pub(crate) until_gone: bool,
}

/// One hold's state machine.
#[derive(Debug)]
pub(crate) struct Machine {
    identity: Identity,
    /// The terms, but for `binding`, which an [`Event::Unbound`] changes.
    terms: Terms,
    state: State,
    wake: Wake,
    /// A close of the bound connection is being confirmed (a read until the hold is gone was
    /// asked for once: see `Check::until_gone`).
    closing: bool,
    /// The last renewal was answered by the master but not acknowledged by the replicas it
    /// must reach: a deadline reached so is [`LostReason::Unreplicated`], not unreachable.
    unacknowledged: bool,
    /// The reason of a message that named exactly this hold, while the read it asked for has
    /// not found the hold there. Should the server say the hold is gone another way first (a
    /// renewal answered 0 before the check, a re-entry answered another token), the message's
    /// reason is the one reported: the loss is the server's word, the message says why (as
    /// when the check finds it gone).
    hint: Option<LostReason>,
}

impl Machine {
    pub(crate) fn new(identity: Identity, terms: Terms) -> Machine {
        Machine {
            identity,
            terms,
            state: State::Acquiring,
            wake: Wake::Never,
            closing: false,
            unacknowledged: false,
            hint: None,
        }
    }

    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// What the hold is bound to now.
    pub(crate) fn binding(&self) -> Binding {
        self.terms.binding
    }

    /// What the application sees.
    pub(crate) fn status(&self) -> Status {
        match self.state {
            State::Acquiring | State::Confirming { .. } | State::Held { .. } => Status::Active,
            State::Releasing | State::Released | State::Refused => Status::Released,
            State::Lost(reason) => Status::Lost(reason),
        }
    }

    /// The local deadline while held.
    #[cfg(test)]
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.state {
            State::Held { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    /// Takes one event; returns what to do.
    pub(crate) fn step(&mut self, event: Event<'_>) -> Actions {
        let before = self.status();
        let mut out = Actions::default();
        self.note_hint(&event);
        self.state = match (self.state, event) {
            (State::Acquiring, Event::Granted { sent, replied }) => {
                let long = replied.saturating_duration_since(sent) >= self.terms.interval();
                if long || self.terms.acknowledged {
                    self.confirm(&mut out);
                    State::Confirming { attempts: 1 }
                } else {
                    out.deliver = true;
                    self.held(sent, self.terms.lease)
                }
            }
            (
                State::Confirming { attempts },
                Event::Answered {
                    read, sent, answer, ..
                },
            ) => match (read, answer) {
                (Read::Renewal | Read::LeaseLeft, Answer::Holds(left)) => {
                    out.deliver = true;
                    self.held(sent, left.unwrap_or(self.terms.lease))
                }
                (Read::Renewal | Read::LeaseLeft, Answer::Gone) => {
                    out.refuse = Some(Refusal::Gone(self.gone_reason()));
                    State::Refused
                }
                // The master answered: the hold may be there, and is released before the
                // refusal is returned.
                (Read::Renewal | Read::LeaseLeft, Answer::Refused) => {
                    out.refuse = Some(Refusal::Denied);
                    out.release = true;
                    State::Refused
                }
                (Read::Renewal | Read::LeaseLeft, Answer::Unacknowledged) => {
                    out.refuse = Some(Refusal::Unacknowledged);
                    out.release = true;
                    State::Refused
                }
                // No answer (also on the connection an EPHEMERAL hold is bound to: an error, a
                // timeout, a server not ready yet, and the connection may be alive; its failure
                // is `ConnectionLost`): sent again; after the last, the server may have the
                // hold, which is released in the background.
                (Read::Renewal | Read::LeaseLeft, Answer::Nothing) => {
                    if attempts < Terms::CONFIRMATIONS {
                        self.confirm(&mut out);
                        State::Confirming {
                            attempts: attempts + 1,
                        }
                    } else {
                        out.refuse = Some(Refusal::Unanswered);
                        out.abandon = true;
                        State::Refused
                    }
                }
                (Read::Check(_), _) => State::Confirming { attempts },
            },
            // The master ends the hold with its connection, but a replica it reached has it
            // bound to nothing (and a failover's new master has it so): released in the
            // background, so that nobody waits it out.
            (State::Confirming { .. }, Event::ConnectionLost | Event::MasterReplaced)
                if self.terms.binding == Binding::Connection =>
            {
                out.refuse = Some(Refusal::Gone(LostReason::ConnectionClosed));
                out.abandon = true;
                State::Refused
            }
            (State::Held { .. }, Event::Unbound) => {
                self.terms.binding = Binding::Lease;
                self.state
            }
            (State::Held { .. }, event) => self.step_held(event, &mut out),
            (State::Releasing, Event::ReleaseReplied) => State::Released,
            (State::Lost(reason), Event::ReleaseRequested) => {
                // A lost multi-key hold still holds its other keys: free them now.
                out.release = self.terms.form == Form::Many;
                State::Lost(reason)
            }
            (state, _) => state,
        };
        out.notify = self.status() != before;
        let wake = self.wake_at();
        if wake != self.wake {
            self.wake = wake;
            out.wake = Some(wake);
        }
        out
    }

    fn step_held(&mut self, event: Event<'_>, out: &mut Actions) -> State {
        let State::Held {
            deadline,
            next,
            renewing,
        } = self.state
        else {
            return self.state;
        };
        let terms = self.terms;
        match event {
            Event::Tick { now } if now >= deadline => {
                out.abandon = true;
                State::Lost(match terms.renewal {
                    Renewal::Watchdog if self.unacknowledged => LostReason::Unreplicated,
                    Renewal::Watchdog => LostReason::Unreachable,
                    Renewal::Fixed => LostReason::LeaseEnded,
                })
            }
            Event::Tick { now } => {
                let due = terms.renewal == Renewal::Watchdog && !renewing && now >= next;
                out.renew = due;
                State::Held {
                    deadline,
                    next,
                    renewing: renewing || due,
                }
            }
            Event::Answered {
                read: Read::Renewal,
                sent,
                replied,
                answer,
            } => match answer {
                Answer::Holds(left) => {
                    self.unacknowledged = false;
                    State::Held {
                        deadline: deadline.max(terms.bound(sent, left.unwrap_or(terms.lease))),
                        next: sent + terms.interval(),
                        renewing: false,
                    }
                }
                Answer::Gone => State::Lost(self.gone_reason()),
                // The library cannot keep the hold (never renewed, or its token never
                // confirmed): it ends here, and is released so that nobody waits it out.
                Answer::Refused => {
                    out.abandon = true;
                    State::Lost(LostReason::NoPermission)
                }
                // Renewed on the master, not acknowledged, or no answer: the deadline stays;
                // again soon. No answer on the connection an EPHEMERAL hold is bound to (an
                // error, a timeout: the connection may be alive) is no loss either: a read on
                // another connection says whether the server still holds it.
                Answer::Nothing | Answer::Unacknowledged => {
                    self.unacknowledged = answer == Answer::Unacknowledged;
                    let bound = terms.binding == Binding::Connection;
                    if answer == Answer::Nothing && bound && !self.closing {
                        out.check = Some(Check {
                            reason: LostReason::ConnectionClosed,
                            moved: false,
                            until_gone: false,
                        });
                    }
                    State::Held {
                        deadline,
                        next: replied + terms.retry(),
                        renewing: false,
                    }
                }
            },
            Event::Answered {
                read: Read::Check(reason),
                sent,
                answer,
                ..
            } => match answer {
                // A read of the master: no evidence that a promoted replica would have the
                // hold as long, where replicas must acknowledge what moves the deadline.
                Answer::Holds(Some(left)) if !terms.acknowledged => State::Held {
                    deadline: deadline.max(terms.bound(sent, left)),
                    next,
                    renewing,
                },
                Answer::Gone => State::Lost(reason),
                Answer::Refused => {
                    out.abandon = true;
                    State::Lost(LostReason::NoPermission)
                }
                Answer::Holds(_) | Answer::Nothing | Answer::Unacknowledged => self.state,
            },
            Event::Answered {
                read: Read::LeaseLeft,
                ..
            } => self.state,
            // A re-entry sets the lease again; unacknowledged, it is no evidence for a replica.
            Event::Reentered { sent } if !terms.acknowledged => State::Held {
                deadline: deadline.max(terms.bound(sent, terms.lease)),
                next,
                renewing,
            },
            Event::Reentered { .. } => self.state,
            // The server says the hold is gone: a message's reason not yet checked says why.
            Event::Replaced => State::Lost(self.gone_reason()),
            // A hint, not evidence: the check the message asks for tells.
            Event::Signal(signal) => {
                out.check = self.check_after(signal);
                self.state
            }
            // The server ends an EPHEMERAL hold with its connection: reported once a read on
            // another connection finds it gone (see `Check::until_gone`).
            Event::ConnectionLost if terms.binding == Binding::Connection => {
                if !self.closing {
                    self.closing = true;
                    out.check = Some(Check {
                        reason: LostReason::ConnectionClosed,
                        moved: false,
                        until_gone: true,
                    });
                }
                self.state
            }
            Event::MasterReplaced if terms.binding == Binding::Connection => {
                // The new master has the hold, bound to nothing, until its lease ends.
                out.abandon = true;
                State::Lost(LostReason::ConnectionClosed)
            }
            Event::Fenced(reason) => State::Lost(reason),
            Event::ReleaseRequested => {
                out.release = true;
                State::Releasing
            }
            Event::ConnectionLost
            | Event::MasterReplaced
            | Event::Unbound
            | Event::Granted { .. }
            | Event::ReleaseReplied => self.state,
        }
    }

    /// Keeps the reason of a message naming exactly this hold while it is granted (see
    /// `hint`), and forgets it once a check finds the hold there.
    fn note_hint(&mut self, event: &Event<'_>) {
        if !matches!(self.state, State::Confirming { .. } | State::Held { .. }) {
            return;
        }
        match event {
            Event::Signal(LostSignal::Hold {
                reason,
                db,
                token,
                key,
                owner,
            }) if self.identity.is_named_by(*db, key, owner, *token) => self.hint = Some(*reason),
            Event::Answered {
                read: Read::Check(_),
                answer: Answer::Holds(_),
                ..
            } => self.hint = None,
            _ => {}
        }
    }

    /// Why the hold is gone when a renewal (or a read of its lease) found it so: a message's
    /// reason not yet checked (see `hint`), else [`LostReason::HoldGone`].
    fn gone_reason(&self) -> LostReason {
        self.hint.unwrap_or(LostReason::HoldGone)
    }

    /// The check a message asks for. A message is a hint: anyone allowed to publish on the
    /// channel can send one, so none is evidence by itself. One that names exactly this hold
    /// (database, key, owner, token), or concerns a key of it without naming a hold (the whole
    /// key, a move, a flush), is checked with a read before anything is reported; the reason
    /// reported, if the read finds the hold gone, is the message's.
    fn check_after(&self, signal: &LostSignal) -> Option<Check> {
        let (reason, moved) = match signal {
            LostSignal::Hold {
                reason,
                db,
                token,
                key,
                owner,
            } if self.identity.is_named_by(*db, key, owner, *token) => (*reason, false),
            LostSignal::Hold { .. } => return None,
            _ if !self.identity.is_concerned_by(signal) => return None,
            LostSignal::Key { reason, .. } => (*reason, false),
            LostSignal::Moved { .. } => (LostReason::HoldGone, true),
            LostSignal::Flushed { .. } => (LostReason::Flushed, false),
        };
        Some(Check {
            reason,
            moved,
            until_gone: false,
        })
    }

    fn confirm(&self, out: &mut Actions) {
        // An acknowledged grant is confirmed by a renewal (a write the replicas acknowledge),
        // also for a fixed lease: it sets the lease again from the confirmation.
        match (self.terms.renewal, self.terms.acknowledged) {
            (Renewal::Watchdog, _) | (Renewal::Fixed, true) => out.renew = true,
            (Renewal::Fixed, false) => out.read_lease = true,
        }
    }

    /// Held on evidence from a command sent at `sent`, the hold lasting `left` from then.
    fn held(&self, sent: Instant, left: Duration) -> State {
        State::Held {
            deadline: self.terms.bound(sent, left),
            next: sent + self.terms.interval(),
            renewing: false,
        }
    }

    /// When the machine must be ticked next: the next renewal or the deadline, whichever is
    /// first, while held.
    fn wake_at(&self) -> Wake {
        match self.state {
            State::Held {
                deadline,
                next,
                renewing,
            } => match self.terms.renewal {
                Renewal::Watchdog if !renewing => Wake::At(next.min(deadline)),
                _ => Wake::At(deadline),
            },
            _ => Wake::Never,
        }
    }
}

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;
