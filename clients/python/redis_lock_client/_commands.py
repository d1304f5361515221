"""The LOCK.* commands the library sends and what their replies mean (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Callable, NamedTuple, Optional, Sequence

from ._common import (
    Arg,
    Key,
    Kind,
    LockServerError,
    LostReason,
    NotSupported,
    UnexpectedReply,
    millis,
    to_bytes,
)
from ._connect import redirected

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

    def _head(self, command: str) -> list[Arg]:
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
    ) -> list[Arg]:
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

    def renew(self, owner: bytes, lease: float) -> list[Arg]:
        return self._head("RENEW") + [owner, millis(lease)]

    def renewed(self, reply: object) -> Optional[bool]:
        """True: every key renewed; False: the owner holds nothing on some key (the hold is
        lost); None: an answer LOCK.[M]RENEW never gives (the watchdog tries again)."""
        replies = reply if self.multi and isinstance(reply, list) else [reply]
        if len(replies) != len(self.keys) or any(r not in (0, 1) for r in replies):
            return None
        return all(r == 1 for r in replies)

    def release(self, owner: bytes) -> list[Arg]:
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
    opposed to LOADING, BUSY, MASTERDOWN, a pause, MOVED or ASK, which pass."""
    return (text.startswith("ERR ") and "paused" not in text) or text.startswith("WRONGTYPE")


def guard(key: bytes, owner: bytes, token: int, command: Sequence[Arg]) -> list[Arg]:
    """LOCK.GUARD key owner token command [arg ...]: the command runs only while ``owner``
    holds ``key`` under ``token``."""
    if not command:
        raise ValueError("a fenced command needs a command: execute(\"SET\", key, value)")
    return ["LOCK.GUARD", key, owner, token, *command]


def fence_refusal(line: str) -> Optional[LostReason]:
    """What a LOCK.GUARD refusal says of the hold: ``FENCED the hold is gone`` (the owner
    holds nothing on the key), ``FENCED the token is not current`` (it holds it under another
    token); None for any other error (the command's own, which is no loss)."""
    word, _, rest = line.partition(" ")
    if word != "FENCED":
        return None
    if rest.lstrip().startswith("the token is not current"):
        return LostReason.TOKEN_NOT_CURRENT
    return LostReason.HOLD_GONE


def says_not_ephemeral(error: str) -> bool:
    """The server's refusal of an EPHEMERAL re-entry of a hold bound to no connection (one
    taken without EPHEMERAL, or one a restart or failover left bound to nothing)."""
    return "the owner's hold is not EPHEMERAL" in error


def release_token(key: bytes, owner: bytes, token: int) -> list[Arg]:
    """LOCK.RELEASE key owner TOKEN token: releases only the owner's hold under ``token`` (nil
    when there is none: never a later hold of the owner)."""
    return ["LOCK.RELEASE", key, owner, "TOKEN", token]


#: Errors of a server that did not run the command and may in a moment (a failover, a slot
#: move): READONLY (still the old master's connection), LOADING, MASTERDOWN, TRYAGAIN,
#: CLUSTERDOWN, NOREPLICAS (a master with ``min-replicas-to-write`` refuses writes until its
#: replicas are back, as after a failover), BUSY (a script or function past
#: ``busy-reply-threshold``: the server runs nothing else until it ends or is killed).
NOT_YET = ("READONLY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS",
           "BUSY ")  # BUSY, not BUSYKEY or BUSYGROUP


def is_not_yet(line: str) -> bool:
    return line.startswith(NOT_YET)


def is_retry_later(line: str) -> bool:
    """TRYAGAIN: in a cluster, a multi-key command during a slot migration found some of its
    keys moved and others not; it did not run, and may be sent again in a moment."""
    return line.startswith("TRYAGAIN")


@dataclass(frozen=True)
class Replication:
    """What a grant and each renewal wait for before they count: ``replicas`` replicas
    acknowledging (``WAIT replicas timeout``), or with ``aof`` the local AOF and ``replicas``
    replicas' AOF fsynced (``WAITAOF 1 replicas timeout``, Redis 7.2 and newer)."""

    replicas: int
    timeout: float
    aof: bool

    @property
    def on(self) -> bool:
        return self.replicas > 0 or self.aof

    def command(self) -> list[Arg]:
        if self.aof:
            return ["WAITAOF", 1, self.replicas, millis(self.timeout)]
        return ["WAIT", self.replicas, millis(self.timeout)]

    def acknowledged(self, reply: object) -> Optional[int]:
        """How many replicas acknowledged, or None when too few did (or the local fsync of
        WAITAOF did not happen)."""
        if self.aof:
            if not (isinstance(reply, list) and len(reply) == 2):
                raise UnexpectedReply(f"WAITAOF answered {reply!r}")
            local, replicas = reply
            if not isinstance(local, int) or not isinstance(replicas, int):
                raise UnexpectedReply(f"WAITAOF answered {reply!r}")
            return replicas if local >= 1 and replicas >= self.replicas else None
        if not isinstance(reply, int) or isinstance(reply, bool):
            raise UnexpectedReply(f"WAIT answered {reply!r}")
        return reply if reply >= self.replicas else None

    def count(self, reply: object) -> int:
        """How many replicas acknowledged (for the error message)."""
        if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], int):
            return reply[1]
        return reply if isinstance(reply, int) else 0

    def shortfall(self, reply: object) -> str:
        """What was missing, in words (the same as the Rust library's): ``0 of 1 replicas
        acknowledged within 200 ms (WAIT)``."""
        ms = millis(self.timeout)
        if self.aof:
            local, replicas = reply if isinstance(reply, list) and len(reply) == 2 else (0, 0)
            return (
                f"fsynced locally {local} of 1, by replicas {replicas} of {self.replicas} "
                f"within {ms} ms (WAITAOF)"
            )
        return f"{self.count(reply)} of {self.replicas} replicas acknowledged within {ms} ms (WAIT)"


def explained_by_role(why: str, wanted: int, role: object) -> str:
    """A shortfall said first by what the master's ``ROLE`` shows: with fewer connected
    replicas than wanted, no wait could have been acknowledged (a failover that left too few
    replicas: ``replicas=N`` needs N + 1 to survive one). Unchanged when ``ROLE`` says nothing
    (refused by an ACL, not a master) or enough are connected."""
    if (
        isinstance(role, list)
        and len(role) == 3
        and role[0] in (b"master", "master")
        and isinstance(role[2], list)
        and len(role[2]) < wanted
    ):
        return f"the master has {len(role[2])} connected replicas, {wanted} needed: {why}"
    return why


NO_REPLICATION = Replication(0, 0.0, False)


def info(key: bytes) -> list[Arg]:
    return ["LOCK.INFO", key]


def check(key: bytes, owner: bytes, token: int) -> list[Arg]:
    """LOCK.CHECK key owner token: 1 while ``owner`` holds ``key`` under ``token``, else 0."""
    return ["LOCK.CHECK", key, owner, token]


def holder_ttl(reply: object, owner: bytes, token: int) -> Optional[int]:
    """From a RESP2 ``LOCK.INFO`` reply: the milliseconds left on the lease of the hold of this
    owner with this token (-1: no lease), or None when the server does not show that hold."""
    if not isinstance(reply, list):
        return None
    fields = dict(zip(reply[::2], reply[1::2]))
    holders = fields.get(b"holders")
    if not isinstance(holders, list):
        return None
    for entry in holders:
        if isinstance(entry, list):
            holder = dict(zip(entry[::2], entry[1::2]))
            ttl = holder.get(b"ttl")
            if holder.get(b"owner") == owner and holder.get(b"token") == token:
                return ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else -1
    return None


class Leader(NamedTuple):
    """Who leads an election key: the candidate, its epoch (the fencing token of its hold) and
    the value it proclaimed in that epoch (None if none yet)."""

    candidate: bytes
    epoch: int
    value: Optional[bytes]


def leader(key: bytes) -> list[Arg]:
    return ["LOCK.LEADER", key]


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


def campaign(
    key: bytes,
    candidate: bytes,
    lease: float,
    ephemeral: bool,
    wait: Optional[float],
    waits: bool,
    value: Optional[bytes],
) -> list[Arg]:
    """LOCK.CAMPAIGN key candidate lease [EPHEMERAL] [WAIT ms] [VALUE value] (ONCE is implied:
    a campaign never counts a re-entry, so it is safe to send again). ``waits`` False: one
    attempt; else ``wait`` None waits forever (WAIT 0)."""
    args: list[Arg] = ["LOCK.CAMPAIGN", key, candidate, millis(lease)]
    if ephemeral:
        args.append("EPHEMERAL")
    if waits:
        args += ["WAIT", 0 if wait is None else millis(wait)]
    if value is not None:
        args += ["VALUE", value]
    return args


def proclaim(key: bytes, candidate: bytes, epoch: int, value: bytes) -> list[Arg]:
    return ["LOCK.PROCLAIM", key, candidate, epoch, value]


def proclaimed(reply: object) -> bool:
    """A ``LOCK.PROCLAIM`` reply: True (1) when the value was published, False (0) when the
    candidate does not lead in that epoch."""
    if reply in (0, 1) and not isinstance(reply, bool):
        return reply == 1
    raise UnexpectedReply(f"LOCK.PROCLAIM answered {reply!r}")


#: The prefix of every ticket name the module replies (``__lock_fence__ticket{tag}hex``,
#: ``__lock_fence__mticket{tag}hex``).
TICKET_PREFIX = b"__lock_fence__"


#: What a ticket holds once a grant written into it was not popped within its lease: the hold is
#: gone, nothing was granted.
EXPIRED = b"expired"


class TicketExpired(Exception):
    """A ticket popped ``expired``: not granted (the wait asks again while it lasts)."""


def ticket_of(reply: object) -> Optional[bytes]:
    """The ticket an acquire ``... WAIT ms TICKET`` replied when it has to wait (the module: a
    bulk string; the ``redislock`` library: the name and within how many ms to ask again), or
    None when it replied what the acquire replies without TICKET (a token, tokens, nil)."""
    if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], int):
        reply = reply[0]
    if isinstance(reply, bytes) and reply.startswith(TICKET_PREFIX):
        return reply
    return None


def ask_again_of(reply: object) -> Optional[float]:
    """Within how many seconds the ``redislock`` library wants a ticketed acquire asked again
    (no timer runs in a function: asking again keeps the waiter's place in the line, and hands
    over a key whose lease ended); None for the module's ticket (the server keeps time)."""
    if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], int):
        if not isinstance(reply[1], bool) and reply[1] >= 0:
            return float(reply[1]) / 1000
    return None


def ticket_answer(value: bytes, multi: bool) -> object:
    """What was popped from a ticket, as the acquire without TICKET would have replied: digits
    are the token (a list of tokens, in the order of the keys, for ``LOCK.MACQUIRE``), ``timeout``
    is nil; ``-<error>`` is that error, raised (``-ASK``/``-MOVED`` as ``Redirected``)."""
    if value.startswith(b"-"):
        line = value[1:].decode("utf-8", "replace")
        raise redirected(line) or LockServerError(line)
    if value == b"timeout":
        return None
    try:
        tokens = [int(part) for part in value.split(b" ")]
    except ValueError:
        raise UnexpectedReply(f"a ticket held {value!r}") from None
    if multi:
        return tokens
    if len(tokens) != 1:
        raise UnexpectedReply(f"a ticket held {value!r}")
    return tokens[0]


# -- the redislock Functions library: the same commands as FCALLs ------------------------------

#: The version of the ``redislock`` library (``FCALL_RO lock_version 0``) this library speaks:
#: a server with an older one, or none, gets the copy shipped with this package loaded when the
#: client was made with ``load_functions=True``.
FUNCTIONS_VERSION = 2


def library_source() -> str:
    """The ``redislock`` library shipped with this package (``functions/redislock.lua``)."""
    return resources.files(__package__).joinpath("redislock.lua").read_text(encoding="utf-8")


#: Each ``LOCK.*`` command the library has a function for: how it is called.
_FUNCTIONS = {
    "LOCK.ACQUIRE": ("FCALL", "lock_acquire"),
    "LOCK.RELEASE": ("FCALL", "lock_release"),
    "LOCK.RENEW": ("FCALL", "lock_renew"),
    "LOCK.FORCERELEASE": ("FCALL", "lock_forcerelease"),
    "LOCK.INFO": ("FCALL_RO", "lock_info"),
    "LOCK.CANCEL": ("FCALL", "lock_cancel"),
}

#: What each ``LOCK.*`` command the library has no function for does, in a refusal's words.
_NO_FUNCTION = {
    "LOCK.MACQUIRE": "multi-key locks",
    "LOCK.MRELEASE": "multi-key locks",
    "LOCK.MRENEW": "multi-key locks",
    "LOCK.GUARD": "fenced commands (guard.execute)",
    "LOCK.CAMPAIGN": "elections",
    "LOCK.PROCLAIM": "elections",
    "LOCK.LEADER": "elections",
}

#: The acquire options the library refuses, in a refusal's words.
_NO_OPTION = {"SHARED": "shared (read) holds", "LIMIT": "semaphores", "EPHEMERAL": "EPHEMERAL holds"}


def refusal(what: str) -> NotSupported:
    """The error for ``what`` (plural: "semaphores") asked of the redislock library."""
    return NotSupported(
        f"{what} need the LOCK.* module: this server has the redislock Functions library only"
    )


def as_is(reply: object) -> object:
    """A reply that needs no change."""
    return reply


class Call(NamedTuple):
    """A command as sent to a server, and what makes its reply the ``LOCK.*`` command's."""

    args: list[Arg]
    answer: Callable[[object], object]


def on_functions(args: Sequence[Arg]) -> Call:
    """``args`` for a server with the ``redislock`` library instead of the module: a ``LOCK.*``
    command as the ``FCALL`` of its function (the same arguments after the key, the same
    replies), ``LOCK.CHECK key owner token`` as a ``lock_info`` read of the holder (answered 1
    or 0, as the module's); any other command as it is. Raises ``NotSupported`` for what the
    library cannot do (a ``LOCK.*`` command without a function, ``SHARED``, ``LIMIT``,
    ``EPHEMERAL``, ``WAIT`` without ``TICKET``: a function cannot block)."""
    name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
    name = name.upper()
    if not name.startswith("LOCK."):
        return Call(list(args), as_is)
    if name == "LOCK.CHECK":
        key, owner, token = args[1], args[2], args[3]

        def held(reply: object) -> object:
            named = owner if isinstance(owner, bytes) else str(owner).encode()
            return int(holder_ttl(reply, named, int(token)) is not None)

        return Call(["FCALL_RO", "lock_info", 1, key], held)
    if name in _NO_FUNCTION:
        raise refusal(_NO_FUNCTION[name])
    how = _FUNCTIONS.get(name)
    if how is None:
        raise refusal(name)
    if name == "LOCK.ACQUIRE":
        options = [
            (w.decode("utf-8", "replace") if isinstance(w, bytes) else str(w)).upper()
            for w in args[4:]
        ]
        for option in options:
            if option in _NO_OPTION:
                raise refusal(_NO_OPTION[option])
        if "WAIT" in options and "TICKET" not in options:
            raise refusal("waits that block the connection (WAIT without TICKET)")
    return Call([how[0], how[1], 1, *args[1:]], as_is)


def version_of(reply: object) -> Optional[int]:
    """``FCALL_RO lock_version 0``'s reply as an integer (None: not one)."""
    if isinstance(reply, int) and not isinstance(reply, bool):
        return reply
    return None


def says_backend_gone(line: str) -> bool:
    """Whether a server's error says the backend a command was built for is not there (any
    more): the module's commands unknown, or the library's function not found (a ``FUNCTION
    FLUSH``, a ``FUNCTION DELETE``, a failover to a server without them)."""
    unknown = line.startswith(("ERR unknown command 'LOCK.", "ERR unknown command `LOCK."))
    return unknown or "Function not found" in line


def lease_left(reply: object) -> Optional[int]:
    """From a RESP2 ``LOCK.INFO`` reply: the milliseconds left on the lock's lease (-1: none),
    or None when the lock is free."""
    if not isinstance(reply, list):
        return None
    ttl = dict(zip(reply[::2], reply[1::2])).get(b"ttl")
    return ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else -1
