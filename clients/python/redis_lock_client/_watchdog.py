"""What a watchdog and the holds it watches say to each other, in both flavours: a look at a hold
answers whether to renew it now and when to look again (``Look``). The threaded watchdog
(``_sync/_backend.py``) keeps the next look of every hold of a client in one ``Timetable``; the
asyncio one (``_async/_backend.py``) runs a task per hold."""

from __future__ import annotations

import heapq
import itertools
from typing import Generic, Hashable, NamedTuple, Optional, TypeVar


class Look(NamedTuple):
    """What a look at a hold found for the watchdog to do."""

    #: Send a renewal now (a round trip: the watchdog runs it apart from its looks).
    renew: bool
    #: When to look again (local monotonic time); None: never, the watch is over.
    again: Optional[float]


#: The look that ends a watch.
OVER = Look(renew=False, again=None)

W = TypeVar("W", bound=Hashable)


class Timetable(Generic[W]):
    """When each watched item is looked at next, the soonest first (a heap). An item has one
    next look: planned again, the sooner time stands; the later entry stays in the heap,
    recognised as stale by its order number when it comes up (a heap cannot remove from its
    middle). No clock and no thread: the caller says what time it is, and locks."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, W]] = []
        #: Each planned item's entry in the heap (its order number); the others there are stale.
        self._planned: dict[W, tuple[float, int]] = {}
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._planned)

    def plan(self, item: W, at: float) -> bool:
        """``item``'s next look at ``at``, unless one is planned sooner already. Whether it is
        now the soonest look of all (a thread waiting for the soonest must wake)."""
        planned = self._planned.get(item)
        if planned is not None and planned[0] <= at:
            return False
        entry = (at, next(self._order))
        self._planned[item] = entry
        heapq.heappush(self._heap, (*entry, item))
        return self.soonest() == at

    def drop(self, item: W) -> None:
        """No more looks at ``item``."""
        self._planned.pop(item, None)

    def soonest(self) -> Optional[float]:
        """When the soonest look is (None: none planned)."""
        while self._heap:
            at, order, item = self._heap[0]
            if self._planned.get(item) == (at, order):
                return at
            heapq.heappop(self._heap)  # stale: planned sooner since, or dropped
        return None

    def take_due(self, now: float) -> Optional[W]:
        """The item whose look is due at ``now`` (the soonest), no longer planned; None: none
        is due."""
        at = self.soonest()
        if at is None or at > now:
            return None
        _, _, item = heapq.heappop(self._heap)
        del self._planned[item]
        return item
