"""What an election observer yields, from its reads of LOCK.LEADER and the leader channel's
messages (no I/O; shared by the sync and asyncio observers)."""

from __future__ import annotations

from typing import Optional

from ._commands import Leader
from ._messages import LeaderMessage


class LeaderFeed:
    """The observer subscribes first, then reads ``LOCK.LEADER`` (``read``), then hands every
    message of its channel to ``message``. Each returns the leader to yield, or None.

    A message counts only when it names the observer's database and key (``a`` and ``{a}``, and
    one key name in several databases, share a channel). Among those, epochs only rise, so
    nothing of an epoch below the last one yielded is yielded again; within one epoch a
    proclamation is yielded when its value differs from the last yielded (a message published
    before the read may thus repeat, right after a (re)connection, a value of the current epoch
    that the read already superseded: the last one yielded is the current one). ``message``
    sets ``stale`` when the message cannot be placed (a proclamation of an epoch whose election
    was missed): the observer then reads ``LOCK.LEADER`` again.
    """

    def __init__(self, db: int, key: bytes) -> None:
        self.db = db
        self.key = key
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

    def message(self, message: Optional[LeaderMessage]) -> Optional[Leader]:
        if message is None or message.db != self.db or message.key != self.key:
            return None
        if message.elected:
            return self._offer(Leader(message.data, message.epoch, None))
        last = self.last
        if last is None or message.epoch > last.epoch:
            self.stale = True  # whose value is it? LOCK.LEADER says
            return None
        if message.epoch < last.epoch:
            return None
        return self._offer(Leader(last.candidate, message.epoch, message.data))
