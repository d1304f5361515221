"""The watchdog: the sync client's looks after every hold on one thread per client, and sends
renewals on a few worker threads (against a real server, see conftest.py, and alone with
stand-in holds); the asyncio one's task per hold with the same looks; the timetable they share."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Optional

from conftest import Server, info, wait_until
from redis_lock_client import LockClient, Release
from redis_lock_client._async import _backend as async_backend
from redis_lock_client._sync import _backend as sync_backend
from redis_lock_client._watchdog import OVER, Look, Timetable

HOLDS = 200
LEASE = 3.0


def test_two_hundred_holds_are_renewed_past_their_lease_by_a_few_threads_not_one_each(
    server: Server, key: str
) -> None:
    client = LockClient.from_url(server.url)
    try:
        start = time.monotonic()
        # The first hold starts what a client runs once (its signal listener, its watchdog):
        # counted from there, only what each further hold adds shows.
        first = client.lock(f"{key}:0", lease=LEASE).try_acquire()
        assert first is not None
        before = threading.active_count()
        renewals_before = server.commandstat("lock.renew")
        guards = [first]
        for i in range(1, HOLDS):
            guard = client.lock(f"{key}:{i}", lease=LEASE).try_acquire()
            assert guard is not None
            guards.append(guard)
        last_taken = time.monotonic()
        peak = threading.active_count()
        # Past two leases of the first hold, and past the first lease of the last one.
        while time.monotonic() < start + 2 * LEASE + 0.2:
            peak = max(peak, threading.active_count())
            time.sleep(0.05)
        assert time.monotonic() - last_taken > LEASE
        renewals = server.commandstat("lock.renew") - renewals_before
        print(
            f"\n{HOLDS} holds: {before} threads with the first, {peak} at most with all of "
            f"them (+{peak - before}); {renewals} renewals in {2 * LEASE:.0f} s"
        )
        # Per hold, this grew by 199. A constant here: the watchdog's renewal workers (and a
        # thread or two of the library's own, started or ending meanwhile).
        assert peak - before <= 10
        # Each hold was renewed, and is still the server's: none got to its lease end.
        assert renewals >= HOLDS
        for i, guard in enumerate(guards):
            assert not guard.lost.is_set(), guard.lost_reason
            held = info(server, f"{key}:{i}")
            assert held is not None and held[b"owner"] == guard.owner
            assert held[b"token"] == guard.token
        for guard in guards:
            assert guard.release() is Release.RELEASED
        for i in range(HOLDS):
            assert info(server, f"{key}:{i}") is None
    finally:
        client.close()


def test_the_timetable_gives_the_soonest_look_first_and_a_sooner_plan_replaces_a_later_one() -> None:
    table: Timetable[str] = Timetable()
    assert table.soonest() is None and table.take_due(100.0) is None
    assert table.plan("a", 5.0)  # the soonest: a waiting thread must wake
    assert table.plan("b", 3.0)
    assert not table.plan("c", 4.0)
    assert not table.plan("a", 6.0)  # later than planned: 5.0 stands
    assert table.plan("a", 1.0)  # sooner: replaces 5.0
    assert len(table) == 3
    assert table.take_due(0.5) is None  # nothing due yet
    assert [table.take_due(10.0) for _ in range(4)] == ["a", "b", "c", None]  # 5.0 was stale
    table.plan("d", 2.0)
    table.drop("d")
    assert table.soonest() is None and len(table) == 0
    table.plan("d", 2.0)  # planned again at the same time: looked at once, not twice
    assert table.take_due(2.0) == "d" and table.take_due(2.0) is None


class StandIn:
    """A hold for the threaded watchdog: looked at every ``period``; renewed at each look when
    ``renews`` (none while one is under way), its renewal waiting for ``answer``."""

    def __init__(self, period: float, renews: bool = False, node: Optional[str] = None) -> None:
        self.period = period
        self.renews = renews
        self.node = node
        self.answer = threading.Event()
        self.stopped = False
        self.looks: list[float] = []
        self.said: list[str] = []
        self.unwatched_once = threading.Event()

    def look(self, now: float, renewing: bool) -> Look:
        if self.stopped:
            return OVER
        self.looks.append(now)
        return Look(renew=self.renews and not renewing, again=now + self.period)

    def renew_once(self) -> None:
        self.said.append("renewing")
        self.answer.wait()
        self.said.append("renewed")

    def unwatched(self) -> None:
        self.said.append("unwatched")
        self.unwatched_once.set()

    def where(self) -> Optional[str]:
        return self.node


def test_renewals_stuck_on_a_server_delay_no_other_holds_look_and_take_a_bounded_few_threads() -> None:
    watchdog = sync_backend.Watchdog()
    workers = sync_backend.RENEWAL_WORKERS
    stuck = [StandIn(period=0.01, renews=True) for _ in range(workers + 3)]
    watches = [watchdog.watch("stuck", hold) for hold in stuck]
    wait_until(lambda: sum(h.said == ["renewing"] for h in stuck) == workers, "workers busy")
    threads = threading.active_count()
    # Every worker waits on a server that does not answer: another hold's looks (its deadline)
    # still come every 20 ms.
    ticking = StandIn(period=0.02)
    ticking_watch = watchdog.watch("ticking", ticking)
    time.sleep(0.5)
    gaps = [b - a for a, b in zip(ticking.looks, ticking.looks[1:])]
    print(f"\n{len(ticking.looks)} looks in 0.5 s, every 20 ms asked; longest gap "
          f"{max(gaps) * 1000:.1f} ms; {threads} threads")
    assert len(ticking.looks) >= 5 and max(gaps) < 0.2  # 10x the period: a stall, not noise
    # The renewals beyond the workers wait their turn: no thread per renewal.
    assert sum(h.said == ["renewing"] for h in stuck) == workers
    assert threading.active_count() == threads
    for hold in stuck:
        hold.answer.set()  # the server answers
    wait_until(lambda: all(h.said.count("renewed") >= 2 for h in stuck), "every hold renewed")
    # Holds stopped with their renewal under way (or waiting for a worker): each is unwatched
    # once, after that renewal, never under it.
    for hold in stuck:
        hold.answer.clear()
    wait_until(lambda: sum(h.said[-1:] == ["renewing"] for h in stuck) == workers, "stuck again")
    for hold, watch in [*zip(stuck, watches), (ticking, ticking_watch)]:
        hold.stopped = True
        watch.wake()
    for hold in stuck:
        hold.answer.set()
    for hold in [*stuck, ticking]:
        assert hold.unwatched_once.wait(5.0)
        assert hold.said.count("unwatched") == 1 and hold.said[-1] == "unwatched"
        assert hold.said.count("renewing") == hold.said.count("renewed")


def test_renewals_stuck_on_one_node_never_hold_back_another_nodes() -> None:
    # Each node has its own workers: with every worker of node a waiting on it (and more of its
    # renewals queued), node b's holds are renewed at each look. With one set of workers for
    # the client, b's renewals queued behind a's until a answered, and past b's deadline.
    watchdog = sync_backend.Watchdog()
    workers = sync_backend.RENEWAL_WORKERS
    stuck = [StandIn(period=0.01, renews=True, node="a:1") for _ in range(workers + 3)]
    watches = [watchdog.watch("stuck", hold) for hold in stuck]
    wait_until(lambda: sum(h.said == ["renewing"] for h in stuck) == workers, "a's workers busy")
    others = [StandIn(period=0.02, renews=True, node="b:2") for _ in range(3)]
    for hold in others:
        hold.answer.set()  # b answers at once
    other_watches = [watchdog.watch("answering", hold) for hold in others]
    wait_until(lambda: all(h.said.count("renewed") >= 5 for h in others), "b's holds renewed")
    assert sum(h.said == ["renewing"] for h in stuck) == workers  # a's still waiting
    for hold, watch in [*zip(stuck, watches), *zip(others, other_watches)]:
        hold.stopped = True
        hold.answer.set()
        watch.wake()
    for hold in [*stuck, *others]:
        assert hold.unwatched_once.wait(5.0)


def test_the_asyncio_watch_looks_on_while_its_renewal_waits_on_the_server() -> None:
    class AsyncStandIn(StandIn):
        async def renew_once(self) -> None:  # type: ignore[override]
            self.said.append("renewing")
            while not self.answer.is_set():
                await asyncio.sleep(0.005)
            self.said.append("renewed")

        async def unwatched(self) -> None:  # type: ignore[override]
            StandIn.unwatched(self)

    async def run() -> None:
        hold = AsyncStandIn(period=0.02, renews=True)
        watch = async_backend.Watchdog().watch("stuck", hold)
        await asyncio.sleep(0.3)
        assert hold.said == ["renewing"]  # one renewal at a time
        assert len(hold.looks) >= 3  # every 20 ms asked: 15 in 0.3 s
        hold.stopped = True
        watch.wake()
        hold.answer.set()
        for _ in range(200):
            if hold.unwatched_once.is_set():
                break
            await asyncio.sleep(0.01)
        assert hold.said == ["renewing", "renewed", "unwatched"]  # after the renewal, not under it

    asyncio.run(run())
