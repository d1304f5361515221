"""What an election observer yields: what its reads of LOCK.LEADER answer, read again on each
message of the leader channel about its key (no I/O; shared by the sync and asyncio
observers)."""

from __future__ import annotations

from typing import Optional

from ._commands import Leader
from ._messages import LeaderMessage


class LeaderFeed:
    """The observer subscribes first, then reads ``LOCK.LEADER`` (``read``), then hands every
    message of its channel to ``message``.

    A message is a hint, never evidence: anyone allowed to publish on the channel can send one,
    with any epoch. ``message`` says whether it asks for a read: it does when it names the
    observer's database and key (``a`` and ``{a}``, and one key name in several databases,
    share a channel). What a message claims is never yielded and never kept. ``read`` returns
    the leader to yield, or None: among the reads, epochs only rise (a read of an epoch below
    the last one yielded, from a server behind the others, is not yielded), and the same
    leader is not yielded twice in a row.
    """

    def __init__(self, db: int, key: bytes) -> None:
        self.db = db
        self.key = key
        self.last: Optional[Leader] = None

    def read(self, leader: Optional[Leader]) -> Optional[Leader]:
        last = self.last
        if leader is None or (last is not None and (leader.epoch < last.epoch or leader == last)):
            return None
        self.last = leader
        return leader

    def message(self, message: Optional[LeaderMessage]) -> bool:
        return message is not None and message.db == self.db and message.key == self.key
