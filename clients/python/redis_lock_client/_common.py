"""What the sync and asyncio halves share: reasons, errors, commands, replies, the hold status."""

from __future__ import annotations

import enum
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence, Union

#: The default lease (Redisson's 30 s), renewed by the watchdog every 10 s.
DEFAULT_LEASE = 30.0
#: How long an ordinary command (acquire without waiting, renew, release) may take.
DEFAULT_COMMAND_TIMEOUT = 2.0
#: How much longer than the server-side wait a waiting connection's read timeout is.
WAIT_MARGIN = 2.0
#: How many times an acquire is sent again after its connection broke or timed out. Safe because
#: every acquire carries ONCE.
RETRIES = 2


class LostReason(enum.Enum):
    """Why a hold ended without its owner releasing it.

    The first four are seen by the library itself; the rest are the server's own words, from the
    lost-hold signal (``lost_signal=True``), except ``FORKED``.
    """

    #: LOCK.RENEW answered 0 (or a re-entry found another holder): the server no longer has it.
    HOLD_GONE = "hold-gone"
    #: No renewal succeeded within the lease (from the last renewal's send time, minus 10 %).
    UNREACHABLE = "unreachable"
    #: A fixed lease (``fixed_lease=True``) ran out: nothing renews it.
    LEASE_ENDED = "lease-ended"
    #: The connection an EPHEMERAL hold is bound to failed or closed.
    CONNECTION_CLOSED = "connection-closed"
    #: This process is a fork of the one that took the hold: the hold is the parent's.
    FORKED = "forked"
    #: Signal ``forcereleased``: LOCK.FORCERELEASE removed the hold.
    FORCE_RELEASED = "forcereleased"
    #: Signal ``disconnected``: the server saw the EPHEMERAL hold's connection close.
    DISCONNECTED = "disconnected"
    #: Signal ``expired``: the lease ran out on the server.
    EXPIRED = "expired"
    #: Signal ``deleted``: DEL, UNLINK, RENAME or MOVE took the key away (Redis >= 7.2, Valkey).
    DELETED = "deleted"
    #: Signal ``overwritten``: a command (SET) replaced the value in place.
    OVERWRITTEN = "overwritten"
    #: Signal ``evicted``: maxmemory evicted the key.
    EVICTED = "evicted"
    #: Signal ``flushed <db>`` (FLUSHDB/FLUSHALL), after which ``LOCK.INFO key`` no longer showed
    #: this owner with this token: the flush took the hold.
    FLUSHED = "flushed"


_SIGNAL_WORDS = {
    b"forcereleased": LostReason.FORCE_RELEASED,
    b"disconnected": LostReason.DISCONNECTED,
    b"expired": LostReason.EXPIRED,
    b"deleted": LostReason.DELETED,
    b"overwritten": LostReason.OVERWRITTEN,
    b"evicted": LostReason.EVICTED,
}


class Release(enum.Enum):
    """What ``guard.release()`` did."""

    #: LOCK.RELEASE was sent and answered: the hold ended on the server.
    RELEASED = "released"
    #: Other guards of the same handle (re-entries) still hold the key; nothing was sent.
    STILL_HELD = "still-held"
    #: This guard was already released: nothing was sent.
    ALREADY_RELEASED = "already-released"


class Renewal(enum.Enum):
    """How a hold's lease is kept."""

    #: A watchdog renews the lease every lease / 3 while the hold lasts (the default).
    WATCHDOG = "watchdog"
    #: Nothing renews: the hold ends on the server one lease after the acquire, and is reported
    #: lost (``LEASE_ENDED``) then.
    FIXED = "fixed"


class Kind(enum.Enum):
    """The kind of hold a handle takes."""

    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    PERMIT = "permit"


class LockError(Exception):
    """Base of every error this library raises."""


class LockTimeout(LockError):
    """``acquire()`` waited its whole ``wait_timeout`` and the key is still someone else's."""

    def __init__(self, waited: float) -> None:
        super().__init__(f"the lock was not granted within {waited:g} s")
        self.waited = waited


class NotHeld(LockError):
    """The hold is not ours any more: lost before (``reason`` says why) or unknown to the server."""

    def __init__(self, reason: Optional[LostReason]) -> None:
        if reason is None:
            text = "the lock is not held (the server does not know this owner)"
        else:
            text = f"the lock is not held any more: {reason.value}"
        super().__init__(text)
        self.reason = reason


class LockServerError(LockError):
    """The server refused the command; the message is the server's own error line."""


class LockConnectionError(LockError):
    """The server could not be reached, the connection broke, or a reply came too late."""


class UnexpectedReply(LockError):
    """The server answered something LOCK.* never answers."""


Key = Union[str, bytes]


def to_bytes(value: Key) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


#: The default of the server's ``lock.lost-channel-prefix``.
LOST_PREFIX = b"lock.lost"


def flush_channel() -> bytes:
    """The channel of the server's flush message, ``lock.lost:flush`` (no braces: the server
    sends it with classic PUBLISH, which in a cluster reaches every node)."""
    return LOST_PREFIX + b":flush"


def parse_flush(payload: bytes) -> Optional[Union[int, str]]:
    """``flushed <db>`` → the db number; ``flushed all`` → ``"all"``; anything else → None."""
    parts = payload.split(b" ")
    if len(parts) != 2 or parts[0] != b"flushed":
        return None
    if parts[1] == b"all":
        return "all"
    return int(parts[1]) if parts[1].isdigit() else None


def flush_covers(db: Union[int, str], client_db: int) -> bool:
    return db == "all" or db == client_db


def shows_hold(info: object, owner: bytes, token: int) -> bool:
    """Whether a RESP2 ``LOCK.INFO`` reply has a holder entry with this owner and token."""
    if not isinstance(info, list):
        return False
    fields = dict(zip(info[::2], info[1::2]))
    holders = fields.get(b"holders")
    if not isinstance(holders, list):
        return False
    for entry in holders:
        if isinstance(entry, list):
            holder = dict(zip(entry[::2], entry[1::2]))
            if holder.get(b"owner") == owner and holder.get(b"token") == token:
                return True
    return False


def _key_channel(prefix: bytes, key: Key) -> bytes:
    """``PREFIX:{KEY}``, or ``PREFIX:KEY`` when KEY already contains ``{`` (Redisson's naming,
    so that the channel hashes to the key's slot)."""
    k = to_bytes(key)
    return prefix + b":" + (k if b"{" in k else b"{" + k + b"}")


def lost_signal_channel(key: Key) -> bytes:
    """The channel of ``key``'s lost-hold messages: ``lock.lost:{KEY}``, or ``lock.lost:KEY``
    when KEY already contains ``{`` (Redisson's naming, so it hashes to the key's slot)."""
    return _key_channel(LOST_PREFIX, key)


#: The default of the server's ``lock.leader-channel-prefix``.
LEADER_PREFIX = b"lock.leader"


def leader_channel(key: Key) -> bytes:
    """The channel of election ``key``'s announcements: ``lock.leader:{KEY}``, or
    ``lock.leader:KEY`` when KEY already contains ``{`` (named as the lost-hold channel)."""
    return _key_channel(LEADER_PREFIX, key)


@dataclass(frozen=True)
class LostSignal:
    """One lost-hold message: ``<reason> <token> <owner>`` (the owner is the rest, spaces too)."""

    reason: LostReason
    token: int
    owner: bytes

    @staticmethod
    def parse(payload: bytes) -> Optional[LostSignal]:
        """None for anything else, an unknown reason word included."""
        parts = payload.split(b" ", 2)
        if len(parts) != 3 or not parts[2]:
            return None
        reason = _SIGNAL_WORDS.get(parts[0])
        if reason is None or not parts[1].isdigit():
            return None
        return LostSignal(reason, int(parts[1]), parts[2])


def millis(seconds: float) -> int:
    """Whole milliseconds, at least 1 (the server takes leases and timeouts in ms)."""
    return max(1, int(seconds * 1000))


#: The most keys one multi-key command takes (the server's limit).
MAX_KEYS = 64


def multi_keys(keys: Sequence[Key]) -> tuple[bytes, ...]:
    """The keys of a multi-key handle as bytes: 1 to 64 of them, distinct (ValueError else); a
    bare str or bytes is refused (TypeError), as it would be read as a sequence of characters."""
    if isinstance(keys, (str, bytes, bytearray)):
        raise TypeError("keys must be a sequence of keys, not one key")
    out = tuple(to_bytes(k) for k in keys)
    if not 1 <= len(out) <= MAX_KEYS:
        raise ValueError(f"a multi-key lock takes 1 to {MAX_KEYS} keys, not {len(out)}")
    if len(set(out)) != len(out):
        raise ValueError("the keys of a multi-key lock must be distinct")
    return out


@dataclass(frozen=True)
class KeySet:
    """The keys a handle holds and the commands that hold them: one key with ``LOCK.ACQUIRE``,
    ``LOCK.RENEW``, ``LOCK.RELEASE`` (``multi`` False), or 1 to 64 keys with ``LOCK.MACQUIRE``,
    ``LOCK.MRENEW``, ``LOCK.MRELEASE`` (``multi`` True; all or nothing, a token per key in the
    order of ``keys``). In a cluster every key is in one slot (else the server answers
    CROSSSLOT), so the first key routes them all."""

    keys: tuple[bytes, ...]
    multi: bool

    @property
    def route(self) -> bytes:
        """The key whose slot the commands are sent to."""
        return self.keys[0]

    def _head(self, command: str) -> list[Union[bytes, int, str]]:
        if self.multi:
            return [f"LOCK.M{command}", len(self.keys), *self.keys]
        return [f"LOCK.{command}", self.keys[0]]

    def acquire(
        self,
        owner: bytes,
        lease: float,
        kind: Kind,
        limit: int,
        ephemeral: bool,
        wait: Optional[float],
        waits: bool,
    ) -> list[Union[bytes, int, str]]:
        """LOCK.[M]ACQUIRE keys owner lease [SHARED | LIMIT n] [EPHEMERAL] ONCE [WAIT ms].

        ``waits`` False: one attempt. Else ``wait`` None waits forever (WAIT 0).
        """
        args = self._head("ACQUIRE") + [owner, millis(lease)]
        if kind is Kind.SHARED:
            args.append("SHARED")
        elif kind is Kind.PERMIT:
            args += ["LIMIT", limit]
        if ephemeral:
            args.append("EPHEMERAL")
        args.append("ONCE")
        if waits:
            args += ["WAIT", 0 if wait is None else millis(wait)]
        return args

    def tokens(self, reply: object) -> Optional[tuple[int, ...]]:
        """The acquire's reply: None when not granted, else a token per key."""
        if reply is None:
            return None
        if not self.multi:
            return (_token(reply, reply),)
        if not isinstance(reply, list) or len(reply) != len(self.keys):
            raise UnexpectedReply(f"LOCK.MACQUIRE answered {reply!r}")
        return tuple(_token(t, reply) for t in reply)

    def renew(self, owner: bytes, lease: float) -> list[Union[bytes, int, str]]:
        return self._head("RENEW") + [owner, millis(lease)]

    def renewed(self, reply: object) -> Optional[bool]:
        """True: every key renewed; False: the owner holds nothing on some key (the hold is
        lost); None: an answer LOCK.[M]RENEW never gives (the watchdog tries again)."""
        replies = reply if self.multi and isinstance(reply, list) else [reply]
        if len(replies) != len(self.keys) or any(r not in (0, 1) for r in replies):
            return None
        return all(r == 1 for r in replies)

    def release(self, owner: bytes) -> list[Union[bytes, int, str]]:
        return self._head("RELEASE") + [owner]

    def released(self, reply: object) -> bool:
        """True: every key released (or counted down); False: the owner held nothing on some
        key (the others are released all the same)."""
        replies = reply if self.multi and isinstance(reply, list) else [reply]
        if len(replies) != len(self.keys) or not all(
            r is None or (isinstance(r, int) and not isinstance(r, bool)) for r in replies
        ):
            raise UnexpectedReply(f"{self._head('RELEASE')[0]!s} answered {reply!r}")
        return all(r is not None for r in replies)


def _token(value: object, reply: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise UnexpectedReply(f"LOCK.ACQUIRE answered {reply!r}")


def is_final(text: str) -> bool:
    """Server errors after which the hold cannot be there any more (WRONGTYPE, "not a lock"), as
    opposed to LOADING, BUSY, MASTERDOWN or a pause, which pass."""
    return (text.startswith("ERR ") and "paused" not in text) or text.startswith("WRONGTYPE")


def local_lease(lease: float) -> float:
    """How long after a send the client still trusts the hold without hearing from the server."""
    return lease - lease / 10


def new_client_id() -> str:
    return uuid.uuid4().hex


LostCallback = Callable[[LostReason], None]


class HoldStatus:
    """Where one hold stands: active, then released or lost, once. Thread-safe.

    ``on_change`` runs (outside the lock) when the hold is lost, with the reason.
    """

    def __init__(self, on_lost: Callable[[LostReason], None]) -> None:
        self._lock = threading.Lock()
        self._released = False
        self.reason: Optional[LostReason] = None
        self._on_lost = on_lost

    def is_active(self) -> bool:
        return not self._released and self.reason is None

    def mark_lost(self, reason: LostReason, notify: bool = True) -> bool:
        with self._lock:
            if self._released or self.reason is not None:
                return False
            self.reason = reason
        if notify:
            self._on_lost(reason)
        return True

    def mark_released(self) -> Optional[NotHeld]:
        """None on success; the error to raise if it was lost or released before."""
        with self._lock:
            if self.reason is not None:
                return NotHeld(self.reason)
            if self._released:
                return NotHeld(None)
            self._released = True
            return None

    def after_fork(self) -> None:
        """In a forked child: the lock may have been held by a thread that does not exist here."""
        self._lock = threading.Lock()


class Deadline:
    """The local lease end: the send time of the last command that set the lease, plus the
    lease minus a drift margin."""

    def __init__(self, lease: float, sent: float) -> None:
        self._lease = local_lease(lease)
        self.at = sent + self._lease

    def extend(self, sent: float) -> None:
        self.at = max(self.at, sent + self._lease)

    def left(self) -> float:
        return self.at - time.monotonic()


def pid() -> int:
    return os.getpid()


class Leader(NamedTuple):
    """Who leads an election key: the candidate, its epoch (the fencing token of its hold) and
    the value it proclaimed in that epoch (None if none yet)."""

    candidate: bytes
    epoch: int
    value: Optional[bytes]


def parse_leader(reply: object) -> Optional[Leader]:
    """A ``LOCK.LEADER`` reply: ``[leader, epoch, value|nil]``, or nil when nobody leads."""
    if reply is None:
        return None
    if (
        isinstance(reply, list)
        and len(reply) == 3
        and isinstance(reply[0], bytes)
        and isinstance(reply[1], int)
        and not isinstance(reply[1], bool)
        and reply[1] > 0
        and (reply[2] is None or isinstance(reply[2], bytes))
    ):
        return Leader(reply[0], reply[1], reply[2])
    raise UnexpectedReply(f"LOCK.LEADER answered {reply!r}")


def campaign_args(
    key: bytes,
    candidate: bytes,
    lease: float,
    ephemeral: bool,
    wait: Optional[float],
    waits: bool,
    value: Optional[bytes],
) -> list[Union[bytes, int, str]]:
    """LOCK.CAMPAIGN key candidate lease [EPHEMERAL] [WAIT ms] [VALUE value] (ONCE is implied:
    a campaign never counts a re-entry, so it is safe to send again). ``waits`` False: one
    attempt; else ``wait`` None waits forever (WAIT 0)."""
    args: list[Union[bytes, int, str]] = ["LOCK.CAMPAIGN", key, candidate, millis(lease)]
    if ephemeral:
        args.append("EPHEMERAL")
    if waits:
        args += ["WAIT", 0 if wait is None else millis(wait)]
    if value is not None:
        args += ["VALUE", value]
    return args


def proclaimed(reply: object) -> bool:
    """A ``LOCK.PROCLAIM`` reply: True (1) when the value was published, False (0) when the
    candidate does not lead in that epoch."""
    if reply in (0, 1) and not isinstance(reply, bool):
        return reply == 1
    raise UnexpectedReply(f"LOCK.PROCLAIM answered {reply!r}")


class LeaderFeed:
    """What an observer yields, from the leader read and the messages of the leader channel
    (shared by the sync and asyncio observers).

    The observer subscribes first, then reads ``LOCK.LEADER`` (``read``), then hands every
    message to ``message``. Each returns the leader to yield, or None. Epochs only rise, so
    nothing of an epoch below the last one yielded is yielded again; within one epoch a
    proclamation is yielded when its value differs from the last yielded (a message published
    before the read may thus repeat, right after a (re)connection, a value of the current epoch
    that the read already superseded: the last one yielded is the current one). ``message``
    sets ``stale`` when the message cannot be placed (a proclamation of an epoch whose
    election was missed): the observer then reads ``LOCK.LEADER`` again.
    """

    def __init__(self) -> None:
        self.last: Optional[Leader] = None
        self.stale = False

    def _offer(self, leader: Leader) -> Optional[Leader]:
        last = self.last
        if last is not None and (
            leader.epoch < last.epoch or (leader.epoch == last.epoch and leader == last)
        ):
            return None
        if last is not None and leader.epoch == last.epoch and leader.value is None:
            return None  # an election message of the epoch already seen (its value is known)
        self.last = leader
        return leader

    def read(self, leader: Optional[Leader]) -> Optional[Leader]:
        self.stale = False
        return None if leader is None else self._offer(leader)

    def message(self, payload: bytes) -> Optional[Leader]:
        word, _, rest = payload.partition(b" ")
        epoch_text, _, tail = rest.partition(b" ")
        if not epoch_text.isdigit():
            return None
        epoch = int(epoch_text)
        if word == b"elected" and tail:
            return self._offer(Leader(tail, epoch, None))
        if word == b"proclaimed":
            last = self.last
            if last is None or epoch > last.epoch:
                self.stale = True  # whose value is it? LOCK.LEADER says
                return None
            if epoch < last.epoch:
                return None
            return self._offer(Leader(last.candidate, epoch, tail))
        return None
