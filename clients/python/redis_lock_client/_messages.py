"""The server's pub/sub messages: their channels and what each payload says (no I/O).

Lost-hold messages, on ``lock.lost:{<key>}`` (``lock.lost:<key>`` when the key already contains
``{``), fields separated by one space, ``<key>`` exactly ``<keylen>`` bytes (spaces allowed),
``<owner>`` the rest of the message:

- one hold ended: ``<reason> <db> <token> <keylen> <key> <owner>``;
- the whole key was removed or replaced from outside: ``<reason> <db> * <keylen> <key>``;
- the key left this node with its slot (a cluster reshard): ``moved <db> * <keylen> <key>``;
- a flush, on ``lock.lost:flush``: ``flushed <db>`` or ``flushed all``.

Leader messages, on ``lock.leader:{<key>}``: ``elected <db> <epoch> <keylen> <key> <candidate>``
and ``proclaimed <db> <epoch> <keylen> <key> <value>``.

Keys ``a`` and ``{a}``, and one key name in several databases, share a channel: a message is
about the database and key it names, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ._common import Key, LostReason, to_bytes

#: The default of the server's ``lock.lost-channel-prefix``.
LOST_PREFIX = b"lock.lost"
#: The default of the server's ``lock.unlock-channel-prefix`` (Redisson's), fixed in the
#: ``redislock`` Functions library.
UNLOCK_PREFIX = b"redisson_lock__channel"
#: The default of the server's ``lock.leader-channel-prefix``.
LEADER_PREFIX = b"lock.leader"

_ONE_HOLD = {
    b"forcereleased": LostReason.FORCE_RELEASED,
    b"disconnected": LostReason.DISCONNECTED,
    b"expired": LostReason.EXPIRED,
    b"deleted": LostReason.DELETED,
    b"overwritten": LostReason.OVERWRITTEN,
    b"evicted": LostReason.EVICTED,
}
_WHOLE_KEY = {
    b"deleted": LostReason.DELETED,
    b"expired": LostReason.EXPIRED,
    b"overwritten": LostReason.OVERWRITTEN,
    b"evicted": LostReason.EVICTED,
}


def _key_channel(prefix: bytes, key: Key) -> bytes:
    """``PREFIX:{KEY}``, or ``PREFIX:KEY`` when KEY already contains ``{`` (Redisson's naming,
    so that the channel hashes to the key's slot)."""
    k = to_bytes(key)
    return prefix + b":" + (k if b"{" in k else b"{" + k + b"}")


def lost_signal_channel(key: Key) -> bytes:
    """The channel of ``key``'s lost-hold messages: ``lock.lost:{KEY}``, or ``lock.lost:KEY``
    when KEY already contains ``{`` (Redisson's naming, so it hashes to the key's slot)."""
    return _key_channel(LOST_PREFIX, key)


def unlock_channel(key: Key) -> bytes:
    """The channel a release that frees ``key`` publishes on (the unlock message, Redisson's):
    ``redisson_lock__channel:{KEY}``, or ``redisson_lock__channel:KEY`` when KEY already
    contains ``{``."""
    return _key_channel(UNLOCK_PREFIX, key)


def leader_channel(key: Key) -> bytes:
    """The channel of election ``key``'s announcements: ``lock.leader:{KEY}``, or
    ``lock.leader:KEY`` when KEY already contains ``{`` (named as the lost-hold channel)."""
    return _key_channel(LEADER_PREFIX, key)


def flush_channel() -> bytes:
    """The channel of the server's flush message, ``lock.lost:flush`` (no braces: the server
    sends it with classic PUBLISH, which in a cluster reaches every node)."""
    return LOST_PREFIX + b":flush"


@dataclass(frozen=True)
class HoldEnded:
    """One hold ended: exactly the hold (db, key, owner, token)."""

    reason: LostReason
    db: int
    token: int
    key: bytes
    owner: bytes


@dataclass(frozen=True)
class KeyEnded:
    """The key was removed or replaced from outside: every hold it had then is gone (a hold
    granted after the message was published is not concerned: check before reporting)."""

    reason: LostReason
    db: int
    key: bytes


@dataclass(frozen=True)
class KeyMoved:
    """The key left this node with its slot: not a loss; the hold is normally alive on the
    node that now serves the slot."""

    db: int
    key: bytes


@dataclass(frozen=True)
class Flushed:
    """FLUSHDB of ``db``, or FLUSHALL (``db`` None): check every hold in it."""

    db: Optional[int]

    def covers(self, db: int) -> bool:
        return self.db is None or self.db == db


KeyMessage = Union[HoldEnded, KeyEnded, KeyMoved]
LostMessage = Union[HoldEnded, KeyEnded, KeyMoved, Flushed]


#: Tokens and epochs are 64-bit unsigned on the server.
_MAX_NUMBER = 2**64 - 1


def _number(field: bytes) -> Optional[int]:
    """A number as the server writes it: decimal digits, no sign, no leading zero (but ``0``
    itself), at most 64 bits; None for anything else."""
    if not field.isdigit() or (len(field) > 1 and field.startswith(b"0")):
        return None
    value = int(field)
    return value if value <= _MAX_NUMBER else None


def _db_and_key(db_field: bytes, keylen_field: bytes, rest: bytes) -> Optional[tuple[int, bytes, bytes]]:
    """``<db>``, ``<keylen>`` and what follows: the db, the key and the bytes after the key."""
    db, keylen = _number(db_field), _number(keylen_field)
    if db is None or keylen is None or len(rest) < keylen:
        return None
    return db, rest[:keylen], rest[keylen:]


def parse_lost(payload: bytes) -> Optional[KeyMessage]:
    """A lost-hold message of a key's channel; None for anything else."""
    parts = payload.split(b" ", 4)
    if len(parts) != 5:
        return None
    word, db_field, token_field, keylen_field, rest = parts
    found = _db_and_key(db_field, keylen_field, rest)
    if found is None:
        return None
    db, key, tail = found
    if token_field == b"*":
        if tail:
            return None
        if word == b"moved":
            return KeyMoved(db, key)
        reason = _WHOLE_KEY.get(word)
        return None if reason is None else KeyEnded(reason, db, key)
    one = _ONE_HOLD.get(word)
    token = _number(token_field)
    if one is None or token is None or len(tail) < 2 or not tail.startswith(b" "):
        return None  # the owner is never empty
    return HoldEnded(one, db, token, key, tail[1:])


def parse_flush(payload: bytes) -> Optional[Flushed]:
    """``flushed <db>`` → that db; ``flushed all`` → every db; anything else → None."""
    parts = payload.split(b" ")
    if len(parts) != 2 or parts[0] != b"flushed":
        return None
    if parts[1] == b"all":
        return Flushed(None)
    db = _number(parts[1])
    return None if db is None else Flushed(db)


@dataclass(frozen=True)
class LeaderMessage:
    """``elected`` (``data`` is the candidate) or ``proclaimed`` (``data`` is the value)."""

    elected: bool
    db: int
    epoch: int
    key: bytes
    data: bytes


def parse_leader_message(payload: bytes) -> Optional[LeaderMessage]:
    """A message of an election key's leader channel; None for anything else."""
    parts = payload.split(b" ", 4)
    if len(parts) != 5 or parts[0] not in (b"elected", b"proclaimed"):
        return None
    word, db_field, epoch_field, keylen_field, rest = parts
    epoch = _number(epoch_field)
    found = _db_and_key(db_field, keylen_field, rest)
    if epoch is None or epoch == 0 or found is None:
        return None
    db, key, tail = found
    if not tail.startswith(b" "):
        return None
    data = tail[1:]
    elected = word == b"elected"
    if elected and not data:
        return None
    return LeaderMessage(elected, db, epoch, key, data)

