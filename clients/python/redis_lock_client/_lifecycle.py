"""A hold's life as a state machine with no I/O: every decision about what a guard believes.

The I/O around it (the acquire, the watchdog, the signal listener, the release) turns replies,
messages and the passing of time into events, each stamped with the local monotonic time it was
observed, and carries out what the machine asks: confirm the grant, renew at ``renew_at``,
report a loss. The rules:

1. *Held* only after the grant, and, when the acquire's reply came a renewal interval (lease / 3)
   or more after it was sent (a long wait), after the server confirmed the hold again: the
   server granted somewhere between the send and the reply, so the only local bound on the
   lease's end is the send time plus the lease, which a long wait used up. That is no evidence
   of a loss; a confirmation (a renewal, or for a fixed lease a read of the hold's ttl) gives a
   bound that counts from its own send time. The deadline moves only on a reply of the server
   that set or showed the lease, and counts from that command's send time. A replicated hold
   (``replicas=``) is confirmed after every grant, by a renewal that replicas acknowledged, and
   only renewals replicas acknowledged move its deadline.
2. *Lost* only on evidence: a renewal or a check refused by the ACL (``NOPERM``: this side
   cannot keep the hold, and says so at once), a renewal answered 0 (or a final error), a fenced command refused
   (``FENCED``), a check that no longer finds the hold, the EPHEMERAL connection closing, or the
   time passing the deadline (no confirmed renewal for 90 % of a lease: the backstop). A message
   is never evidence (anyone allowed to publish on the channel can send one): one that names
   this hold's database, key, owner and token, or may concern it, only asks for a check (a read
   of the server), and the check's answer counts.
3. After *lost* or *released* (or once a release is requested) nothing renews, and nothing
   changes the state any more.
4. A loss the server may not know of (the deadline passed with no renewal confirmed, a fixed
   lease at its local end, the master an EPHEMERAL hold was bound on replaced) asks for the
   hold's release in the background, by its token (``abandon``): nobody else waits out a hold
   this side no longer believes in.
"""

from __future__ import annotations

import enum
from typing import Mapping, Optional

from ._common import LostReason, NotHeld, Renewal
from ._messages import HoldEnded


class Phase(enum.Enum):
    #: Granted after a long wait: a confirmation must come before the guard is handed out.
    CONFIRMING = "confirming"
    HELD = "held"
    #: The owner asked for the release: nothing renews, nothing is reported.
    RELEASING = "releasing"
    LOST = "lost"
    RELEASED = "released"


class Confirm(enum.Enum):
    """What confirms a hold granted after a long wait."""

    #: A renewal (the watchdog's own command), sent at once.
    RENEWAL = "renewal"
    #: A read of the hold's ttl (``LOCK.INFO``): a fixed lease is never renewed.
    READ = "read"


#: Of the lease, what the library keeps for clock drift between it and the server.
DRIFT = 0.1
#: The longest the watchdog waits before it sends a renewal again after one got no answer.
RETRY = 0.1


def renewal_interval(lease: float) -> float:
    return max(lease / 3, 0.001)


class HoldMachine:
    """One hold: its identity (database, owner, a token per key), its phase, its deadline."""

    def __init__(
        self,
        *,
        db: int,
        owner: bytes,
        tokens: Mapping[bytes, int],
        lease: float,
        renewal: Renewal,
        sent_at: float,
        replied_at: float,
        replicated: bool = False,
    ) -> None:
        self.db = db
        self.owner = owner
        self.tokens = dict(tokens)
        self.lease = lease
        self.fixed = renewal is Renewal.FIXED
        self.interval = renewal_interval(lease)
        self._trusted = lease - lease * DRIFT
        self.reason: Optional[LostReason] = None
        #: The reason a message naming this hold gave, until a read confirms or denies it.
        self.hint: Optional[LostReason] = None
        #: Past this (local monotonic time) without a confirmed renewal, the hold may be gone.
        self.deadline = sent_at + self._trusted
        #: When the watchdog sends its next renewal.
        self.renew_at = sent_at + self.interval
        #: Replicated (``replicas=``): every grant is confirmed by a renewal that replicas
        #: acknowledged, and only acknowledged renewals move the deadline.
        self.replicated = replicated
        long_wait = replied_at - sent_at >= self.interval
        self.phase = Phase.CONFIRMING if long_wait or replicated else Phase.HELD
        #: The last renewal was answered by the master but not acknowledged by the replicas: a
        #: deadline reached so is ``UNREPLICATED``, not ``UNREACHABLE``.
        self.unacknowledged = False
        #: Set by a loss the server may not know of: the shell releases the hold by its token
        #: in the background (``take_abandon``).
        self.abandon = False

    # -- what the machine tells ------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Granted, and neither lost nor released (nor being released)."""
        return self.phase in (Phase.CONFIRMING, Phase.HELD)

    @property
    def confirmation(self) -> Optional[Confirm]:
        """What must confirm the grant before the guard is handed out (None: nothing)."""
        if self.phase is not Phase.CONFIRMING:
            return None
        return Confirm.READ if self.fixed and not self.replicated else Confirm.RENEWAL

    def next_wake(self, renewing: bool = False) -> Optional[float]:
        """When the watchdog must act next (renew, or see the deadline pass); None: never.
        ``renewing``: a renewal is under way, whose answer sets the next renewal time: until
        it comes, only the deadline."""
        if self.phase is not Phase.HELD:
            return None
        if self.fixed or renewing:
            return self.deadline
        return min(self.renew_at, self.deadline)

    def renewal_due(self, now: float) -> bool:
        return self.phase is Phase.HELD and not self.fixed and now >= self.renew_at

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

    # -- events ------------------------------------------------------------------------------

    def _lose(self, reason: LostReason, abandon: bool = False) -> Optional[LostReason]:
        """Lost for ``reason``; ``abandon``: the server may still have it (it was not the one
        that said so), so its release is asked for."""
        if not self.active:
            return None
        self.phase, self.reason = Phase.LOST, reason
        self.abandon = abandon
        return reason

    def take_abandon(self) -> bool:
        """Whether the last loss asked for the hold's release in the background (once)."""
        abandon, self.abandon = self.abandon, False
        return abandon

    def confirmed(self, sent_at: float, ttl: Optional[float] = None) -> None:
        """The server confirmed the hold: a renewal sent at ``sent_at`` answered 1, or (a fixed
        lease) a read sent then showed it with ``ttl`` seconds left (None: a renewal)."""
        if not self.active:
            return
        if ttl is None:
            self.unacknowledged = False
            self.deadline = max(self.deadline, sent_at + self._trusted)
            self.renew_at = sent_at + self.interval
        elif ttl < 0:  # no lease on the server: nothing ends it
            self.deadline = float("inf")
        else:
            read = sent_at + ttl - self.lease * DRIFT
            # Confirming a grant, the read is the server's word on the lease now, taken alone
            # (as the Rust machine does): the grant's bound holds only while nothing shortened
            # the lease since (a PEXPIRE of the key, a renewal with a shorter lease).
            confirming = self.phase is Phase.CONFIRMING
            self.deadline = read if confirming else max(self.deadline, read)
        self.phase = Phase.HELD

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` answered 1 (every key)."""
        if self.phase is Phase.HELD:
            self.unacknowledged = False
            self.deadline = max(self.deadline, sent_at + self._trusted)
            self.renew_at = sent_at + self.interval

    def reentered(self, sent_at: float) -> None:
        """An acquire sent at ``sent_at`` answered this hold's tokens: the server reset the
        lease (ONCE: a re-entry is not counted there). Replicated, that reset was not
        acknowledged: the deadline stays."""
        if self.phase is Phase.HELD and not self.replicated:
            self.deadline = max(self.deadline, sent_at + self._trusted)

    def unanswered(self, now: float, unacknowledged: bool = False) -> None:
        """A renewal got no answer (connection error, timeout, a passing server error), or
        (``unacknowledged``) the master answered it but too few replicas acknowledged it."""
        if self.phase is Phase.HELD:
            self.unacknowledged = unacknowledged
            self.renew_at = now + min(self.interval, RETRY)

    def hinted(self, reason: LostReason) -> None:
        """A message named this hold with ``reason``: a hint, checked by a read. Should the
        server say the hold is gone some other way first (a renewal answered 0 before the
        check did), the message's reason is the one given: the server confirmed the loss, and
        the message says why."""
        if self.active:
            self.hint = reason

    def refused(self) -> Optional[LostReason]:
        """The server says the owner no longer holds it (a renewal or a proclamation answered 0,
        a final error)."""
        return self._lose(self.hint or LostReason.HOLD_GONE)

    def fenced(self, reason: LostReason) -> Optional[LostReason]:
        """A fenced command (LOCK.GUARD) was refused: the server does not hold this owner with
        this token (``HOLD_GONE``, ``TOKEN_NOT_CURRENT``)."""
        return self._lose(reason)

    def checked(self, present: bool, reason: LostReason) -> Optional[LostReason]:
        """A read after a message naming this hold, or about its key (or a flush, or a move),
        found the hold (``present``: a message's hint is void) or not; ``reason`` is the
        message's."""
        if present:
            self.hint = None
            return None
        return self._lose(reason)

    def denied(self) -> Optional[LostReason]:
        """The server's ACL refused a renewal or a check (``NOPERM``): this side cannot keep
        the hold (never renewed, or its token never confirmed). It ends at once, and is
        released in the background (the server may still have it): never left for the deadline
        to report ``UNREACHABLE``."""
        return self._lose(LostReason.NO_PERMISSION, abandon=True)

    def connection_lost(self) -> Optional[LostReason]:
        """The connection an EPHEMERAL hold is bound to closed: the server ends the hold."""
        return self._lose(LostReason.CONNECTION_CLOSED)

    def master_replaced(self) -> Optional[LostReason]:
        """The master an EPHEMERAL hold's connection reached is no longer the master (a
        failover): the new one has the hold bound to nothing until its lease ends, so it is
        lost, and released there."""
        return self._lose(LostReason.CONNECTION_CLOSED, abandon=True)

    def tick(self, now: float) -> Optional[LostReason]:
        """Time passes. Past the deadline of a held hold, the backstop reports it lost
        (``UNREPLICATED`` when the master answered the last renewal but the replicas did not
        acknowledge it), and asks for its release: the server may still have it."""
        if self.phase is not Phase.HELD or now < self.deadline:
            return None
        if self.fixed:
            reason = LostReason.LEASE_ENDED
        elif self.unacknowledged:
            reason = LostReason.UNREPLICATED
        else:
            reason = LostReason.UNREACHABLE
        return self._lose(reason, abandon=True)

    def forked(self) -> None:
        """In a forked child: the hold is the parent's (reported to nobody)."""
        self._lose(LostReason.FORKED)

    def release_requested(self) -> Optional[NotHeld]:
        """The owner releases: None, or the error to raise when it was lost or released."""
        if self.active:
            self.phase = Phase.RELEASING
            return None
        return NotHeld(self.reason)

    def release_replied(self) -> None:
        if self.phase is Phase.RELEASING:
            self.phase = Phase.RELEASED
