"""A hold's life as a state machine with no I/O and no clock: events in (each stamped with the
local monotonic time it was observed), a phase and actions out (``HoldMachine.step``). The
shell (``_async/_hold.py``) only turns replies, messages and the passing of time into events,
and carries out what the machine asks. The Rust library's machine (``clients/rust/src/machine``)
has the same events and actions, and both run the shared scenarios of
``clients/vectors/hold-machine.tsv``. The rules:

1. *Held* only after the grant, and, when the acquire's reply came a renewal interval (lease / 3)
   or more after it was sent (a long wait), after the server confirmed the hold again: the
   server granted somewhere between the send and the reply, so the only local bound on the
   lease's end is the send time plus the lease, which a long wait used up. That is no evidence
   of a loss; a confirmation (a renewal, or for a fixed lease a read of the lease left) gives a
   bound that counts from its own send time. A confirmation with no answer is sent again, up to
   ``CONFIRMATIONS`` in all; then the grant is refused (an EPHEMERAL one as soon as its
   connection fails). A replicated hold (``replicas=``) is confirmed after every grant,
   by a renewal that replicas acknowledged; one they did not acknowledge is refused (and
   released).
2. The deadline moves only on a reply of the server that set or showed the lease, counted from
   that command's send time, minus a tenth of the lease for clock drift; it never moves back.
   Replicated, only an acknowledged renewal moves it (a read of the master, or a re-entry, is
   no evidence a promoted replica would have the hold).
3. *Lost* only on evidence: a renewal or a check refused by the ACL (``NOPERM``: this side
   cannot keep the hold, and says so at once), a renewal answered 0 (or a final error), a
   fenced command refused (``FENCED``), a check that no longer finds the hold, the EPHEMERAL
   connection closing and a read then finding the hold gone, the handle's acquire answered with
   another token, or the time passing the deadline (no confirmed renewal for 90 % of a lease:
   the backstop). A message is never evidence (anyone allowed to publish on the channel can
   send one): one that names this hold's database, key, owner and token, or may concern it,
   only asks for a check (a read of the server), and the check's answer counts.
4. After *lost*, *refused* or *released* (or once a release is requested) nothing renews, and
   nothing changes the state any more.
5. A loss the server may not know of (the deadline passed with no renewal confirmed, a fixed
   lease at its local end, the master an EPHEMERAL hold was bound on replaced, a renewal or
   check refused by the ACL) asks for the hold's release in the background, by its token
   (``abandon``): nobody else waits out a hold this side no longer believes in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, Optional, Union

from ._common import LostReason, Renewal
from ._messages import Flushed, HoldEnded, KeyEnded, LostMessage

#: Of the lease, what the library keeps for clock drift between it and the server.
DRIFT = 0.1
#: The longest the watchdog waits before it sends a renewal again after one got no answer.
RETRY = 0.1
#: How many confirmations of a grant are sent before the acquire gives up on a server that
#: answers none.
CONFIRMATIONS = 3


def renewal_interval(lease: float) -> float:
    return max(lease / 3, 0.001)


class Phase(enum.Enum):
    #: The acquire is on its way.
    ACQUIRING = "acquiring"
    #: Granted after a long wait (or replicated): a confirmation must come before the guard is
    #: handed out.
    CONFIRMING = "confirming"
    HELD = "held"
    #: The owner asked for the release: nothing renews, nothing is reported.
    RELEASING = "releasing"
    RELEASED = "released"
    LOST = "lost"
    #: Granted, but its confirmation did not confirm it: the guard was never handed out.
    REFUSED = "refused"


# -- what the server answered to a read --------------------------------------------------------


class Read(enum.Enum):
    """A read whose answer is an event (``Answered``); a check is ``CheckRead``."""

    #: ``LOCK.RENEW``/``LOCK.MRENEW`` (and the ``LOCK.CHECK`` of its tokens): the watchdog's,
    #: or a grant's confirmation.
    RENEWAL = "renewal"
    #: A fixed lease's confirmation: the lease the hold has left (``LOCK.INFO``).
    LEASE_LEFT = "lease-left"


@dataclass(frozen=True)
class CheckRead:
    """Whether the hold is still there, after a message that may concern it or after its
    connection closed (``Check``); ``reason``: what to report if not."""

    reason: LostReason


@dataclass(frozen=True)
class Holds:
    """The hold is there, and lasts at least ``left`` seconds from when the read ran (None:
    unknown, or a renewal's: the lease; ``inf``: the server has no lease on it)."""

    left: Optional[float] = None


class Answer(enum.Enum):
    #: The hold is there, but fewer replicas acknowledged the renewal than asked.
    UNACKNOWLEDGED = "unacknowledged"
    #: The hold is not there (answered 0, not shown, or a final error).
    GONE = "gone"
    #: The server's ACL refused the read (``NOPERM``): this side cannot keep the hold.
    REFUSED = "refused"
    #: No answer (the connection broke or timed out, a passing error), or one that says nothing.
    NOTHING = "nothing"


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Granted:
    """The acquire's reply: the server granted between ``sent`` and ``replied``."""

    sent: float
    replied: float


@dataclass(frozen=True)
class Reentered:
    """An acquire through the same handle, sent at ``sent``, answered this hold's tokens (a
    re-entry, which sets the lease again)."""

    sent: float


@dataclass(frozen=True)
class Replaced:
    """An acquire through the same handle answered another token or none, or a proclamation
    answered 0: the server no longer has this hold."""


@dataclass(frozen=True)
class Answered:
    """A read sent at ``sent`` was answered at ``replied``."""

    read: Union[Read, CheckRead]
    sent: float
    replied: float
    answer: Union[Holds, Answer]


@dataclass(frozen=True)
class Signal:
    """A lost-hold message (about this hold or not): a hint that asks for a check, never
    evidence. While a grant is confirmed, the confirmation is the read that tells."""

    message: LostMessage


@dataclass(frozen=True)
class ConnectionLost:
    """The connection an EPHEMERAL hold is bound to closed or failed: the server ends the hold
    when it sees that, which a read then tells."""


@dataclass(frozen=True)
class MasterReplaced:
    """The master an EPHEMERAL hold is bound on was replaced (a failover): the new master has
    it bound to nothing until its lease ends, and nobody can renew it there as an EPHEMERAL
    hold: the binding it was taken for is gone, which is reported at once."""


@dataclass(frozen=True)
class Unbound:
    """The hold is bound to nothing any more, but lives on (in a cluster its key moved with its
    slot): from here it is a plain lease."""


@dataclass(frozen=True)
class Fenced:
    """A command fenced with this hold's token was refused (``FENCED``): the server no longer
    holds it under this token, for ``reason``."""

    reason: LostReason


@dataclass(frozen=True)
class ReleaseRequested:
    """The application released the hold (its last guard)."""


@dataclass(frozen=True)
class ReleaseReplied:
    """The release was answered (or could not be sent)."""


@dataclass(frozen=True)
class Tick:
    """Time passed."""

    now: float


@dataclass(frozen=True)
class Forked:
    """In a forked child: the hold is the parent's."""


Event = Union[
    Granted,
    Reentered,
    Replaced,
    Answered,
    Signal,
    ConnectionLost,
    MasterReplaced,
    Unbound,
    Fenced,
    ReleaseRequested,
    ReleaseReplied,
    Tick,
    Forked,
]


# -- actions -------------------------------------------------------------------------------------


class Refusal(enum.Enum):
    """Why a grant is not handed out (the machine's ``reason`` says more)."""

    #: The confirmation found the hold gone (its reason: a message's not yet checked, else
    #: ``HOLD_GONE``), or an EPHEMERAL hold's connection failed (``CONNECTION_CLOSED``).
    GONE = "gone"
    #: The server answered no confirmation (``UNREACHABLE``): released in the background
    #: (``abandon``).
    UNANSWERED = "unanswered"
    #: Too few replicas acknowledged the grant (``UNREPLICATED``): released by its token
    #: before the error is raised (``release``).
    UNACKNOWLEDGED = "unacknowledged"
    #: The server's ACL refused the confirmation (``NO_PERMISSION``): released as an
    #: unacknowledged one is (``release``).
    DENIED = "denied"


@dataclass(frozen=True)
class Check:
    """A read the machine asks for: is the hold (every key, or ``key``) still there? Answer with
    ``Answered(CheckRead(reason), ...)``."""

    reason: LostReason
    #: The key changed nodes: read where it is now, and listen there.
    moved: bool = False
    #: The connection an EPHEMERAL hold is bound to closed: the server ends the hold as soon as
    #: it sees the close, which may be after this side saw it. Read again, a few milliseconds
    #: apart, until the hold is gone (or the machine ends it otherwise).
    until_gone: bool = False
    #: The key a message named (None: every key of the hold).
    key: Optional[bytes] = None
    #: The message named this very hold: ``LOCK.CHECK`` of its token is the read.
    named: bool = False


@dataclass
class Actions:
    """What the shell is to do after an event."""

    #: Hand the guard to the application (the acquire returns it).
    deliver: bool = False
    #: The acquire fails: the guard is not handed out.
    refuse: Optional[Refusal] = None
    #: Send a renewal now; answer with ``Answered(Read.RENEWAL, ...)``.
    renew: bool = False
    #: Read the lease the hold has left; answer with ``Answered(Read.LEASE_LEFT, ...)``.
    read_lease: bool = False
    #: Read whether the hold is still there.
    check: Optional[Check] = None
    #: Send the release.
    release: bool = False
    #: The hold is lost to this side, but the server may still have it: release it in the
    #: background by its token, so that nobody waits it out.
    abandon: bool = False
    #: The hold was just lost, for this reason: report it (``lost``, the callback).
    lost: Optional[LostReason] = None
    #: When to tick the machine next (local monotonic time; None: never).
    wake: Optional[float] = None


class HoldMachine:
    """One hold: its identity (database, owner, a token per key), its terms, its phase."""

    def __init__(
        self,
        *,
        db: int,
        owner: bytes,
        tokens: Mapping[bytes, int],
        lease: float,
        renewal: Renewal,
        replicated: bool = False,
        ephemeral: bool = False,
        multi: bool = False,
    ) -> None:
        self.db = db
        self.owner = owner
        self.tokens = dict(tokens)
        self.lease = lease
        self.fixed = renewal is Renewal.FIXED
        #: Replicated (``replicas=``): every grant is confirmed by a renewal that replicas
        #: acknowledged, and only acknowledged renewals move the deadline.
        self.replicated = replicated
        #: Bound to a connection of its own (until ``Unbound``).
        self.ephemeral = ephemeral
        #: Several keys held together: a lost hold still holds its other keys.
        self.multi = multi
        self.interval = renewal_interval(lease)
        self.phase = Phase.ACQUIRING
        #: Why it was lost (or refused).
        self.reason: Optional[LostReason] = None
        #: Confirmations sent so far (while confirming).
        self.attempts = 0
        #: Past this (local monotonic time) without a confirmed renewal, the hold may be gone.
        self.deadline = float("inf")
        #: When the watchdog sends its next renewal.
        self.renew_at = float("inf")
        #: A renewal is under way (one at a time): its answer sets the next renewal time.
        self.renewing = False
        #: A close of the bound connection is being confirmed (a read until the hold is gone
        #: was asked for once).
        self.closing = False
        #: The last renewal was answered by the master but not acknowledged by the replicas: a
        #: deadline reached so is ``UNREPLICATED``, not ``UNREACHABLE``.
        self.unacknowledged = False
        #: The reason of a message that named exactly this hold, while the read it asked for has
        #: not found the hold there. Should the server say the hold is gone another way first (a
        #: renewal answered 0 before the check), the message's reason is the one reported.
        self.hint: Optional[LostReason] = None

    # -- what the machine tells ------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Granted, and neither lost nor released (nor being released)."""
        return self.phase in (Phase.CONFIRMING, Phase.HELD)

    def names(self, message: HoldEnded) -> bool:
        """Whether a one-hold message is about this very hold."""
        return (
            message.db == self.db
            and message.owner == self.owner
            and self.tokens.get(message.key) == message.token
        )

    def concerns(self, db: Optional[int], key: Optional[bytes]) -> bool:
        """Whether a message about a key (``key`` None: every key) in a database (``db`` None:
        every database) may be about this hold, which a check then tells."""
        return (db is None or db == self.db) and (key is None or key in self.tokens)

    def _bound(self, sent: float, left: float) -> float:
        """The local bound a command sent at ``sent`` gives, when the server answered that the
        hold lasts ``left`` from when it ran: minus a tenth of the lease for clock drift."""
        return sent + max(left - self.lease * DRIFT, 0.0)

    def _wake(self) -> Optional[float]:
        """The next renewal or the deadline, whichever is first, while held."""
        if self.phase is not Phase.HELD:
            return None
        if self.fixed or self.renewing:
            return self.deadline
        return min(self.renew_at, self.deadline)

    # -- the step ----------------------------------------------------------------------------

    def step(self, event: Event) -> Actions:
        """Takes one event; returns what to do."""
        was_lost = self.phase is Phase.LOST
        out = Actions()
        self._note_hint(event)
        phase = self.phase
        if phase is Phase.ACQUIRING and isinstance(event, Granted):
            if event.replied - event.sent >= self.interval or self.replicated:
                self.phase, self.attempts = Phase.CONFIRMING, 1
                self._confirm(out)
            else:
                out.deliver = True
                self._held(event.sent, self.lease)
        elif phase is Phase.CONFIRMING:
            self._step_confirming(event, out)
        elif phase is Phase.HELD:
            self._step_held(event, out)
        elif phase is Phase.RELEASING and isinstance(event, ReleaseReplied):
            self.phase = Phase.RELEASED
        elif phase is Phase.LOST and isinstance(event, ReleaseRequested):
            # A lost multi-key hold still holds its other keys: free them now.
            out.release = self.multi
        if self.phase is Phase.LOST and not was_lost:
            out.lost = self.reason
        out.wake = self._wake()
        return out

    def _step_confirming(self, event: Event, out: Actions) -> None:
        if isinstance(event, Answered) and isinstance(event.read, Read):
            answer = event.answer
            if isinstance(answer, Holds):
                out.deliver = True
                # The server's word on the lease now, taken alone: the grant's bound holds only
                # while nothing shortened the lease since.
                self._held(event.sent, self.lease if answer.left is None else answer.left)
            elif answer is Answer.GONE:
                self._refuse(out, Refusal.GONE, self._gone_reason())
            elif answer is Answer.REFUSED or answer is Answer.UNACKNOWLEDGED:
                # The master answered: the hold may be there, and is released before the
                # refusal is raised.
                if answer is Answer.REFUSED:
                    self._refuse(out, Refusal.DENIED, LostReason.NO_PERMISSION)
                else:
                    self._refuse(out, Refusal.UNACKNOWLEDGED, LostReason.UNREPLICATED)
                out.release = True
            elif self.attempts < CONFIRMATIONS:
                # No answer (also on the connection an EPHEMERAL hold is bound to: an error, a
                # timeout, a server not ready yet, and the connection may be alive; its
                # failure is ``ConnectionLost``): sent again.
                self.attempts += 1
                self._confirm(out)
            else:
                # The server may have it: released in the background.
                self._refuse(out, Refusal.UNANSWERED, LostReason.UNREACHABLE)
                out.abandon = True
        elif isinstance(event, (ConnectionLost, MasterReplaced)) and self.ephemeral:
            # The master ends the hold with its connection, but a replica it reached has it
            # bound to nothing (and a failover's new master has it so): released there.
            self._refuse(out, Refusal.GONE, LostReason.CONNECTION_CLOSED)
            out.abandon = True
        elif isinstance(event, Forked):
            self._lose(LostReason.FORKED)
        # Else (a check's answer, a message, time): the confirmation is the read that tells.

    def _step_held(self, event: Event, out: Actions) -> None:
        if isinstance(event, Tick):
            if event.now >= self.deadline:
                if self.fixed:
                    reason = LostReason.LEASE_ENDED
                elif self.unacknowledged:
                    reason = LostReason.UNREPLICATED
                else:
                    reason = LostReason.UNREACHABLE
                self._lose(reason)
                out.abandon = True
            elif not self.fixed and not self.renewing and event.now >= self.renew_at:
                out.renew = self.renewing = True
        elif isinstance(event, Answered):
            self._answered_held(event, out)
        elif isinstance(event, Reentered):
            # A re-entry sets the lease again; unacknowledged, it is no evidence for a replica.
            if not self.replicated:
                self.deadline = max(self.deadline, self._bound(event.sent, self.lease))
        elif isinstance(event, Replaced):
            self._lose(self._gone_reason())
        elif isinstance(event, Signal):
            # A hint, not evidence: the check the message asks for tells.
            out.check = self._check_after(event.message)
        elif isinstance(event, ConnectionLost) and self.ephemeral:
            if not self.closing:
                self.closing = True
                out.check = Check(LostReason.CONNECTION_CLOSED, until_gone=True)
        elif isinstance(event, MasterReplaced) and self.ephemeral:
            self._lose(LostReason.CONNECTION_CLOSED)
            out.abandon = True
        elif isinstance(event, Unbound):
            self.ephemeral = False
        elif isinstance(event, Fenced):
            self._lose(event.reason)
        elif isinstance(event, ReleaseRequested):
            self.phase = Phase.RELEASING
            out.release = True
        elif isinstance(event, Forked):
            self._lose(LostReason.FORKED)

    def _answered_held(self, event: Answered, out: Actions) -> None:
        answer = event.answer
        if isinstance(event.read, CheckRead):
            if isinstance(answer, Holds):
                # A read of the master moves the deadline only where no replica must agree.
                if answer.left is not None and not self.replicated:
                    self.deadline = max(self.deadline, self._bound(event.sent, answer.left))
            elif answer is Answer.GONE:
                self._lose(event.read.reason)
            elif answer is Answer.REFUSED:
                self._lose(LostReason.NO_PERMISSION)
                out.abandon = True
            return
        if event.read is not Read.RENEWAL:
            return
        if isinstance(answer, Holds):
            self.unacknowledged = False
            left = self.lease if answer.left is None else answer.left
            self.deadline = max(self.deadline, self._bound(event.sent, left))
            self.renew_at = event.sent + self.interval
            self.renewing = False
        elif answer is Answer.GONE:
            self._lose(self._gone_reason())
        elif answer is Answer.REFUSED:
            # The library cannot keep the hold (never renewed, or its token never confirmed):
            # it ends here, and is released so that nobody waits it out.
            self._lose(LostReason.NO_PERMISSION)
            out.abandon = True
        else:
            # Renewed on the master but not acknowledged, or no answer: the deadline stays;
            # again soon. No answer on the connection an EPHEMERAL hold is bound to (an error,
            # a timeout: the connection may be alive) is no loss either: a read on another
            # connection says whether the server still holds it.
            self.unacknowledged = answer is Answer.UNACKNOWLEDGED
            if answer is Answer.NOTHING and self.ephemeral and not self.closing:
                out.check = Check(LostReason.CONNECTION_CLOSED)
            self.renew_at = event.replied + min(self.interval, RETRY)
            self.renewing = False

    # -- helpers -------------------------------------------------------------------------------

    def _note_hint(self, event: Event) -> None:
        """Keeps the reason of a message naming exactly this hold while it is granted, and
        forgets it once a check finds the hold there."""
        if not self.active:
            return
        if isinstance(event, Signal):
            message = event.message
            if isinstance(message, HoldEnded) and self.names(message):
                self.hint = message.reason
        elif (
            isinstance(event, Answered)
            and isinstance(event.read, CheckRead)
            and isinstance(event.answer, Holds)
        ):
            self.hint = None

    def _gone_reason(self) -> LostReason:
        """Why the hold is gone when the server said so without naming why: a message's reason
        not yet checked, else ``HOLD_GONE``."""
        return self.hint or LostReason.HOLD_GONE

    def _check_after(self, message: LostMessage) -> Optional[Check]:
        """The check a message asks for: one that names exactly this hold (database, key, owner,
        token), or concerns a key of it without naming a hold (the whole key, a move, a flush);
        the reason reported, if the read finds the hold gone, is the message's."""
        if isinstance(message, HoldEnded):
            if not self.names(message):
                return None
            return Check(message.reason, key=message.key, named=True)
        if isinstance(message, Flushed):
            return Check(LostReason.FLUSHED) if self.concerns(message.db, None) else None
        if not self.concerns(message.db, message.key):
            return None
        if isinstance(message, KeyEnded):
            return Check(message.reason, key=message.key)
        return Check(LostReason.HOLD_GONE, moved=True, key=message.key)

    def _confirm(self, out: Actions) -> None:
        # A replicated grant is confirmed by a renewal (a write the replicas acknowledge), also
        # for a fixed lease: it sets the lease again from the confirmation.
        if self.fixed and not self.replicated:
            out.read_lease = True
        else:
            out.renew = True

    def _held(self, sent: float, left: float) -> None:
        """Held on evidence from a command sent at ``sent``, the hold lasting ``left`` then."""
        self.phase = Phase.HELD
        self.deadline = self._bound(sent, left)
        self.renew_at = sent + self.interval
        self.renewing = False

    def _lose(self, reason: LostReason) -> None:
        self.phase, self.reason = Phase.LOST, reason

    def _refuse(self, out: Actions, refusal: Refusal, reason: LostReason) -> None:
        self.phase, self.reason = Phase.REFUSED, reason
        out.refuse = refusal
