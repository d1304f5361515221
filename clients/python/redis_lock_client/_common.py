"""The library's vocabulary: its defaults, why a hold was lost, what a release did, its errors."""

from __future__ import annotations

import enum
import uuid
from typing import Callable, Optional, Union

__version__ = "0.2.0"

#: The default lease (Redisson's 30 s), renewed by the watchdog every lease / 3 (10 s).
DEFAULT_LEASE = 30.0
#: How long a grant or a renewal waits for replicas to acknowledge it (``replicas=``).
DEFAULT_REPLICAS_TIMEOUT = 1.0
#: Under Sentinel: how long an acquire whose connection broke is sent again while no master
#: answers (a failover takes Sentinel's down-after-milliseconds plus its election).
DEFAULT_FAILOVER_TIMEOUT = 30.0
#: How long an ordinary command (acquire without waiting, renew, release) may take.
DEFAULT_COMMAND_TIMEOUT = 2.0
#: How much longer than the server-side wait a waiting connection's read timeout is.
WAIT_MARGIN = 2.0
#: How many times a command is sent again after its connection broke or timed out, or after a
#: MOVED/ASK. Safe for an acquire because every acquire carries ONCE.
RETRIES = 2
#: How many redirections (MOVED, ASK) in a row a wait follows: a reshard sends a blocked waiter
#: to where its key went, and may move it again before it is granted.
WAIT_REDIRECTS = 16
#: Through Sentinel, a command whose master failed is sent again after FAILOVER_PAUSE, doubled
#: each time up to FAILOVER_PAUSE_MAX, until the client's failover timeout passes. The cap is
#: how late a retry can come after the Sentinels name the new master: at 1 s the failover test
#: saw every kind of hold granted up to 1 s after the switch; 4 attempts a second while no
#: master answers cost next to nothing.
FAILOVER_PAUSE = 0.05
FAILOVER_PAUSE_MAX = 0.25
#: The pauses before a command answered TRYAGAIN (a cluster slot move caught between its keys;
#: nothing ran) is sent again.
TRYAGAIN_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8)
#: The name the library's connections carry (CLIENT SETNAME) unless the application named its
#: own; a connection bound to one owner (a wait, an EPHEMERAL hold) adds ``:<owner>``.
CLIENT_NAME = "redis-lock-client"


class LostReason(enum.Enum):
    """Why a hold ended without its owner releasing it.

    The first six are seen by the library itself; the rest are the server's own words, from the
    lost-hold signal (the client option ``lost_signal=True``, the default).
    """

    #: LOCK.RENEW answered 0, a re-entry found another holder, a check found the hold gone, or a
    #: fenced command (``guard.execute``) was refused ``FENCED the hold is gone``: the server no
    #: longer has it.
    HOLD_GONE = "hold-gone"
    #: No renewal was confirmed within 90 % of the lease, counted from the last confirmed
    #: renewal's send time.
    UNREACHABLE = "unreachable"
    #: A fixed lease (``renewal=Renewal.FIXED``) ran out: nothing renews it.
    LEASE_ENDED = "lease-ended"
    #: With ``replicas=N``: the master kept answering the renewals, but the replicas did not
    #: acknowledge them within 90 % of the lease (a failover could lose the hold). The library
    #: releases it.
    UNREPLICATED = "unreplicated"
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
    #: The server's ACL refused a command the library needs to keep the hold (its renewal, or
    #: the check of its token, LOCK.CHECK): the library cannot keep it, ends it on this side and
    #: releases it in the background. The guard's calls raise ``NoPermission``, naming the
    #: command and the rule to add. Not a loss the server made: fix the user's ACL.
    NO_PERMISSION = "no-permission"
    #: A fenced command (``guard.execute``) was refused ``FENCED the token is not current``:
    #: the owner holds the key under another fencing token now (a later hold under the same
    #: owner name), so this hold is over. The command did not run.
    TOKEN_NOT_CURRENT = "token-not-current"


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
    #: Nothing renews: the hold ends on the server one lease after the grant, and is reported
    #: lost (``LEASE_ENDED``) then.
    FIXED = "fixed"


class Backend(enum.Enum):
    """What serves the locks on a server (``await client.backend()``), found once per server
    (in a cluster: per master) at its first command."""

    #: The ``LOCK.*`` module: everything this library does.
    MODULE = "module"
    #: No module, the ``redislock`` Functions library (``FCALL``; a managed Redis): exclusive
    #: locks only, without EPHEMERAL holds, fenced commands or the lost-hold signal; a wait
    #: listens to the unlock message and asks again (see the README, *Without the module*).
    FUNCTIONS = "functions"

    @property
    def supports_ephemeral(self) -> bool:
        """Whether a hold can be EPHEMERAL (bound to its connection) here."""
        return self is Backend.MODULE


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


class Fenced(NotHeld):
    """The server refused a fenced command (``LOCK.GUARD``) because the hold is not there any
    more: the command did not run, and the hold is reported lost. ``reason`` is
    ``LostReason.HOLD_GONE`` (``FENCED the hold is gone``) or ``LostReason.TOKEN_NOT_CURRENT``
    (``FENCED the token is not current``); ``line`` is the server's error line."""

    def __init__(self, reason: LostReason, line: str) -> None:
        super().__init__(reason)
        self.args = (f"the command did not run: {line}",)
        self.line = line


class NotSafelyAcquired(LockError):
    """The server granted the hold, but fewer replicas than asked (``replicas=``) acknowledged
    the grant within ``replicas_timeout`` (``WAIT``, or ``WAITAOF`` with ``aof=True``): a
    failover now could hand the key to another owner. The hold was released (best effort:
    its lease ends it otherwise) and nothing was handed out. ``tokens`` are the tokens the
    server granted (one per key), ``acknowledged`` how many replicas acknowledged,
    ``wanted`` how many were asked for, ``why`` what was missing in words (``0 of 1 replicas
    acknowledged within 200 ms (WAIT)``; first ``the master has 0 connected replicas, 1
    needed: ...`` when the master's ``ROLE`` lists too few replicas for any wait to succeed)."""

    def __init__(self, tokens: tuple[int, ...], acknowledged: int, wanted: int, why: str) -> None:
        super().__init__(f"not safely acquired (token {list(tokens)}, released): {why}")
        self.tokens = tokens
        self.token = tokens[0]
        self.acknowledged = acknowledged
        self.wanted = wanted
        self.why = why


class LockServerError(LockError):
    """The server refused the command; the message is the server's own error line."""


class NoPermission(LockServerError):
    """The server's ACL refused a command the library sent (``NOPERM``): the user the client
    connected as lacks a rule. ``command`` is the command refused (``LOCK.CHECK``,
    ``CLIENT|SETNAME``), ``line`` the server's error line, ``rule`` what to add
    (``+lock.check``; a key pattern or a channel when the server refused one). A renewal or a
    check refused so ends the hold on this side (``LostReason.NO_PERMISSION``, released in the
    background): the guard's calls raise this error then. ``channel``: the channel refused, for
    a subscription (``SUBSCRIBE``/``SSUBSCRIBE`` of a lost-hold channel: the acquire that needed
    it raises this error, its grant released); ``rule`` is then ``&<channel>``."""

    def __init__(self, line: str, command: str = "", channel: Optional[bytes] = None) -> None:
        self.line = line
        self.command = refused_command(line) or command.upper()
        self.channel = None if channel is None else channel.decode(errors="backslashreplace")
        self.rule = (
            missing_rule(self.command, line) if self.channel is None else f"&{self.channel}"
        )
        what = self.command if self.channel is None else f"{self.command} {self.channel}"
        # The server's line first, as every LockServerError's.
        super().__init__(f"{line} (the ACL refused {what}: the user needs {self.rule})")


def refused_command(line: str) -> str:
    """The command a ``NOPERM`` line names (``... to run the 'lock.check' command``), upper
    case; "" when it names none (a key or a channel was refused)."""
    _, found, rest = line.partition("to run the '")
    name, quoted, _ = rest.partition("'")
    return name.upper() if found and quoted else ""


def missing_rule(command: str, line: str) -> str:
    """The rule a ``NOPERM`` line says is missing: the command's (``+lock.check``,
    ``+client|setname``), or a key pattern or a channel."""
    lower = line.lower()
    if "given to lock.guard" in lower:
        return "the fenced command's own rules (+command, ~keys, &channels)"
    if "key" in lower:
        return f"a key pattern (~...) covering the keys of {command}"
    if "channel" in lower:
        return f"the channel (&...) {command} names"
    return f"+{command.lower()}"


class NotSupported(LockError):
    """What was asked cannot be done on this server's backend (the ``redislock`` Functions
    library: shared holds, semaphores, multi-key locks, EPHEMERAL holds, fenced commands,
    elections, the lost-hold signal), or the server has neither backend. Raised before anything
    is sent for the call; the message says what to use instead."""


class LockConnectionError(LockError):
    """The server could not be reached, the connection broke, or a reply came too late."""


class UnexpectedReply(LockError):
    """The server answered something LOCK.* never answers."""


Key = Union[str, bytes]
#: An argument of a command: bytes, str (sent UTF-8 encoded) or int.
Arg = Union[bytes, str, int, float]

#: ``on_lost``: called once with the reason when a hold is lost, on the library's thread (sync)
#: or in the event loop (asyncio) that saw it.
LostCallback = Callable[[LostReason], None]


def to_bytes(value: Key) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def millis(seconds: float) -> int:
    """Whole milliseconds, at least 1 (the server takes leases and timeouts in ms)."""
    return max(1, int(seconds * 1000))


def new_client_id() -> str:
    return uuid.uuid4().hex
