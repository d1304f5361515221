"""Waiting with tickets (the clients' ``wait_with_tickets``, on by default): an acquire that has
to wait gets a ticket from the server and every wait of a client on a server is popped by one
``BLPOP`` on one waiting connection per 100 waits (sync and asyncio; a lock, a multi-key lock, a
campaign)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

import pytest
import redis

from conftest import Server, info, wait_until
from redis_lock_client._async._tickets import TicketDesk as AsyncDesk
from redis_lock_client._sync._tickets import TicketDesk as SyncDesk
from redis_lock_client._async._tickets import HEALTH_PERIOD, TICKETS_PER_CONNECTION
from conftest import waiting as waiters
from redis_lock_client import (
    AsyncLockClient,
    LockClient,
    LockConnectionError,
    LockTimeout,
    Release,
)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def connections(server: Server) -> list[dict[str, str]]:
    out = []
    for line in server.client().execute_command("CLIENT", "LIST").decode().splitlines():
        out.append(dict(f.split("=", 1) for f in line.split(" ") if "=" in f))
    return out


def named(server: Server, suffix: str) -> list[dict[str, str]]:
    return [c for c in connections(server) if c.get("name", "").endswith(suffix)]


def in_blpop(server: Server) -> list[dict[str, str]]:
    return [c for c in connections(server) if c.get("cmd") == "blpop"]


def hold_elsewhere(server: Server, key: str, owner: str = "other") -> Callable[[], None]:
    """Another owner holds `key`; the returned function releases it."""
    raw = server.client()
    assert raw.execute_command("LOCK.ACQUIRE", key, owner, 60000) > 0
    return lambda: raw.execute_command("LOCK.RELEASE", key, owner)


class Waiter(threading.Thread):
    """acquire() in a thread of its own: its guard, or what it raised."""

    def __init__(self, acquire: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._acquire = acquire
        self.guard: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.guard = self._acquire()
        except BaseException as e:  # noqa: BLE001 - the test reads it
            self.error = e

    def result(self, bound: float = 10.0) -> Any:
        self.join(bound)
        assert not self.is_alive(), "the acquire hangs"
        if self.error is not None:
            raise self.error
        return self.guard


def assert_held(server: Server, key: str, guard: Any) -> None:
    found = info(server, key)
    assert found is not None and found[b"owner"] == guard.owner and found[b"token"] == guard.token


@pytest.mark.scenario("tickets-wait")
def test_a_wait_is_a_ticket_popped_by_blpop_not_a_blocked_acquire(server, client, key):
    release = hold_elsewhere(server, key)
    waiter = Waiter(lambda: client.lock(key, wait_timeout=10).acquire())
    waiter.start()
    wait_until(lambda: waiters(server, key) == 1, "the acquire waits in the server")
    assert server.blocked_clients("lock.acquire") == []
    wait_until(lambda: len(in_blpop(server)) == 1, "the waiting connection pops the ticket")
    release()
    guard = waiter.result()
    assert_held(server, key, guard)
    assert guard.release() is Release.RELEASED
    assert client._single.tickets.issued == 1  # type: ignore[union-attr]


@pytest.mark.scenario("tickets-wait")
def test_wait_with_tickets_false_blocks_on_a_connection_of_its_own(server, key):
    with LockClient.from_url(server.url, wait_with_tickets=False) as client:
        release = hold_elsewhere(server, key)
        waiter = Waiter(lambda: client.lock(key, wait_timeout=10).acquire())
        waiter.start()
        wait_until(lambda: len(server.blocked_clients("lock.acquire")) == 1, "a blocked acquire")
        assert named(server, ":tickets-wait") == []
        release()
        waiter.result().release()


@pytest.mark.scenario("tickets-wait")
def test_ticket_waits_are_granted_in_arrival_order(server, client, key):
    release = hold_elsewhere(server, key)
    order: list[int] = []
    threads = []
    for i in range(5):
        def take(i: int = i) -> Any:
            guard = client.lock(key, wait_timeout=20).acquire()
            order.append(i)
            guard.release()
            return guard
        threads.append(Waiter(take))
        threads[-1].start()
        wait_until(lambda: waiters(server, key) == i + 1, f"waiter {i} queued")
    release()
    for t in threads:
        t.result(20)
    assert order == [0, 1, 2, 3, 4]


@pytest.mark.scenario("tickets-wait", "acquire-timeout")
def test_a_ticket_wait_times_out_with_lock_timeout_and_leaves_the_queue(server, client, key):
    release = hold_elsewhere(server, key)
    cancels = server.commandstat("lock.cancel")
    start = time.monotonic()
    with pytest.raises(LockTimeout):
        client.lock(key, wait_timeout=0.3).acquire()
    assert 0.298 <= time.monotonic() - start < 3
    assert waiters(server, key) == 0
    assert server.commandstat("lock.cancel") == cancels  # the server answered `timeout`
    release()


@pytest.mark.scenario("tickets-one-connection")
def test_many_waits_of_one_client_share_one_waiting_connection(server, client, key):
    keys = [f"{key}:{i}" for i in range(10)]
    releases = [hold_elsewhere(server, k) for k in keys]
    threads = [Waiter(lambda k=k: client.lock(k, wait_timeout=20).acquire()) for k in keys]
    for t in threads:
        t.start()
    wait_until(lambda: all(waiters(server, k) == 1 for k in keys), "every acquire waits")
    wait_until(lambda: len(in_blpop(server)) == 1, "one BLPOP pops every ticket")
    assert len(named(server, ":tickets-wait")) == 1
    assert len(named(server, ":tickets-ask")) == 1
    assert server.blocked_clients("lock.acquire") == []
    for r in releases:
        r()
    for k, t in zip(keys, threads):
        guard = t.result(20)
        assert_held(server, k, guard)
        guard.release()


def blpop_key_counts(server: Server) -> list[int]:
    """The number of keys each ``BLPOP`` in the slow log named (the log keeps 32 arguments,
    the last saying how many more there were)."""
    counts = []
    for entry in server.client().execute_command("SLOWLOG", "GET", "-1"):
        args = entry[3]
        if not args or bytes(args[0]).upper() != b"BLPOP":
            continue
        argc = len(args)
        last = bytes(args[-1])
        if last.startswith(b"... (") and last.endswith(b" more arguments)"):
            argc = len(args) - 1 + int(last[5:].split(b" ")[0])
        counts.append(argc - 2)  # BLPOP and its timeout
    return counts


@pytest.mark.scenario("tickets-one-connection")
def test_250_waits_pop_on_three_connections_of_at_most_100_tickets_in_arrival_order(server, key):
    assert TICKETS_PER_CONNECTION == 100
    raw = server.client()
    raw.config_set("slowlog-log-slower-than", 0)
    raw.config_set("slowlog-max-len", 1_000_000)
    raw.slowlog_reset()
    release = hold_elsewhere(server, key)

    async def main() -> list[int]:
        order: list[int] = []
        async with AsyncLockClient.from_url(server.url) as client:
            async def take(i: int) -> None:
                guard = await client.lock(key, wait_timeout=120).acquire()
                order.append(i)
                await guard.release()
            tasks = []
            for i in range(250):
                tasks.append(asyncio.create_task(take(i)))
                until = time.monotonic() + 10
                while waiters(server, key) != i + 1:
                    assert time.monotonic() < until, f"waiter {i} never queued"
                    await asyncio.sleep(0.001)
            until = time.monotonic() + 10
            while len(in_blpop(server)) != 3:
                assert time.monotonic() < until, f"{len(in_blpop(server))} BLPOPs"
                await asyncio.sleep(0.01)
            assert len(named(server, ":tickets-wait")) == 3
            release()
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
        return order

    assert run(main()) == list(range(250))
    counts = blpop_key_counts(server)
    assert counts and max(counts) <= 100, max(counts)
    assert max(counts) == 100  # the first connection filled up


@pytest.mark.scenario("tickets-one-connection")
def test_one_wake_up_per_release_eight_tasks_fifty_sections(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            cancels = server.commandstat("lock.cancel")
            inside = 0

            async def worker() -> None:
                nonlocal inside
                lock = client.lock(key, wait_timeout=30)
                for _ in range(50):
                    async with lock:
                        inside += 1
                        assert inside == 1
                        await asyncio.sleep(0)
                        inside -= 1
            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(8))), 120)
            desk = client._single.tickets  # type: ignore[union-attr]
            assert desk is not None and desk.issued > 0
            assert desk.answered == desk.issued  # each ticket answered once: one wake-up each
            assert server.commandstat("lock.cancel") == cancels
            assert len(named(server, ":tickets-wait")) == 1
    run(main())


@pytest.mark.scenario("tickets-one-connection")
def test_async_many_waits_share_one_waiting_connection(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            keys = [f"{key}:{i}" for i in range(10)]
            releases = [hold_elsewhere(server, k) for k in keys]
            tasks = [asyncio.create_task(client.lock(k, wait_timeout=20).acquire()) for k in keys]
            while not all(waiters(server, k) == 1 for k in keys) or len(in_blpop(server)) != 1:
                await asyncio.sleep(0.01)
            assert len(named(server, ":tickets-wait")) == 1
            for r in releases:
                r()
            guards = await asyncio.wait_for(asyncio.gather(*tasks), 20)
            for k, guard in zip(keys, guards):
                assert_held(server, k, guard)
                await guard.release()
    run(main())


def test_the_blpop_of_tickets_is_sent_as_redis_py_would_pack_it():
    from redis.asyncio.connection import Connection
    from redis_lock_client._async._tickets import _Slot, _Ticket, _blpop as async_blpop
    from redis_lock_client._sync._tickets import _blpop as sync_blpop

    names = [b"__lock_fence__ticket{k:1}17", b"__lock_fence__ticket{k:2}1801", b"t\r\n"]
    wires = [_Ticket(n, [], _Slot(None, 1)).wire for n in names]
    for block in (1.0, 0.1):
        expected = b"".join(Connection().pack_command("BLPOP", *names, block))
        assert async_blpop(wires, block) == expected
        assert sync_blpop(wires, block) == expected


@pytest.mark.scenario("tickets-one-connection")
def test_the_clients_work_per_grant_does_not_grow_with_the_tickets_queued(server, key, monkeypatch):
    """Each answer popped is followed by a BLPOP over every outstanding ticket: redis-py encoding
    every name again for each (2.3 ms a BLPOP over 2,000 tickets) made draining a queue
    quadratic. Each name is encoded once now: the arguments redis-py packs while 300 queued
    waits drain stay a few per grant (before: every BLPOP's, over 40,000)."""
    from redis.asyncio.connection import AbstractConnection

    waits, packed = 300, [0]
    pack = AbstractConnection.pack_command

    def counting(self: Any, *args: Any) -> Any:
        packed[0] += len(args)
        return pack(self, *args)

    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            release = hold_elsewhere(server, key)

            async def waiter() -> None:
                guard = await client.lock(key, wait_timeout=60).acquire()
                await guard.release()

            tasks = [asyncio.create_task(waiter()) for _ in range(waits)]
            while waiters(server, key) < waits:
                await asyncio.sleep(0.05)
            monkeypatch.setattr(AbstractConnection, "pack_command", counting)
            release()
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
            monkeypatch.undo()
            desk = client._single.tickets  # type: ignore[union-attr]
            assert desk is not None and desk.answered >= waits
        assert packed[0] < 40 * waits, f"{packed[0]} arguments packed for {waits} grants"

    run(main())


@pytest.mark.scenario("tickets-cancel")
def test_a_cancelled_ticket_wait_leaves_the_queue_and_holds_nothing(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            release = hold_elsewhere(server, key)
            task = asyncio.create_task(client.lock(key).acquire())
            while waiters(server, key) != 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert waiters(server, key) == 0  # withdrawn with LOCK.CANCEL
            release()
            assert info(server, key) is None
    run(main())


@pytest.mark.scenario("tickets-cancel")
def test_a_cancel_racing_a_grant_delivers_the_token_once(server, key):
    """The holder releases as the waiter is cancelled, in every order: the grant is either the
    waiter's (its acquire returned it) or released; the key is never left held by nobody."""
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            for i in range(30):
                release = hold_elsewhere(server, key)
                task = asyncio.create_task(client.lock(key).acquire())
                while waiters(server, key) != 1:
                    await asyncio.sleep(0.005)
                release()
                await asyncio.sleep((i % 10) * 0.0005)
                task.cancel()
                try:
                    guard = await task
                except asyncio.CancelledError:
                    guard = None
                if guard is not None:
                    assert_held(server, key, guard)
                    await guard.release()
                deadline = time.monotonic() + 5
                while info(server, key) is not None:  # a grant released in the background
                    assert time.monotonic() < deadline, f"round {i}: the grant leaked"
                    await asyncio.sleep(0.01)
    run(main())


@pytest.mark.scenario("tickets-connection-lost")
def test_a_killed_asking_connection_is_noticed_and_the_acquire_asks_again(server, client, key):
    release = hold_elsewhere(server, key)
    waiter = Waiter(lambda: client.lock(key).acquire())  # no timeout: a lost ticket would hang
    waiter.start()
    wait_until(lambda: waiters(server, key) == 1, "the acquire waits")
    (asking,) = named(server, ":tickets-ask")
    server.client().execute_command("CLIENT", "KILL", "ID", asking["id"])
    wait_until(lambda: len(named(server, ":tickets-ask")) == 1, "asked again on a new connection")
    wait_until(lambda: waiters(server, key) == 1, "the acquire waits again")
    release()
    guard = waiter.result()
    assert_held(server, key, guard)
    guard.release()


@pytest.mark.scenario("tickets-connection-lost")
def test_an_asking_connection_killed_three_times_raises_after_two_retries(server, client, key):
    release = hold_elsewhere(server, key)
    waiter = Waiter(lambda: client.lock(key, wait_timeout=30).acquire())
    waiter.start()
    seen: set[str] = set()
    for _ in range(3):
        def asked_again() -> list[dict[str, str]]:
            fresh = [c for c in named(server, ":tickets-ask") if c["id"] not in seen]
            return fresh if fresh and waiters(server, key) == 1 else []
        wait_until(asked_again, "the acquire waits with a ticket asked on a new connection")
        (asking,) = asked_again()
        seen.add(asking["id"])
        server.client().execute_command("CLIENT", "KILL", "ID", asking["id"])
    with pytest.raises(LockConnectionError):
        waiter.result()
    assert waiters(server, key) == 0
    release()


@pytest.mark.scenario("tickets-connection-lost")
def test_a_killed_waiting_connection_is_replaced_and_the_grant_delivered(server, client, key):
    release = hold_elsewhere(server, key)
    waiter = Waiter(lambda: client.lock(key, wait_timeout=30).acquire())
    waiter.start()
    wait_until(lambda: len(in_blpop(server)) == 1, "the ticket is popped")
    (waiting,) = named(server, ":tickets-wait")
    server.client().execute_command("CLIENT", "KILL", "ID", waiting["id"])
    release()
    guard = waiter.result()
    assert_held(server, key, guard)
    guard.release()
    assert info(server, key) is None


@pytest.mark.scenario("tickets-connection-lost")
def test_a_grant_written_while_the_waiting_connection_is_gone_is_taken_by_cancel(
    server, client, key
):
    """The waiting connection dies, the grant is written meanwhile and nobody pops it: the
    waiter's LOCK.CANCEL takes it (its acquire returns it), never a hold nobody knows of."""
    release = hold_elsewhere(server, key)
    waiter = Waiter(lambda: client.lock(key, wait_timeout=30).acquire())
    waiter.start()
    wait_until(lambda: len(in_blpop(server)) == 1, "the ticket is popped")
    (waiting,) = named(server, ":tickets-wait")
    raw = server.client()
    raw.execute_command("MULTI")
    raw.execute_command("LOCK.RELEASE", key, "other")
    raw.execute_command("CLIENT", "KILL", "ID", waiting["id"])
    raw.execute_command("EXEC")
    guard = waiter.result()
    assert_held(server, key, guard)
    guard.release()
    del release


@pytest.mark.scenario("tickets-wait", "multi-wait")
def test_a_multi_key_wait_is_a_ticket_with_a_token_per_key(server, client, key):
    a, b = f"{key}:a", f"{key}:b"
    release = hold_elsewhere(server, b)
    waiter = Waiter(lambda: client.multi_lock([a, b], wait_timeout=10).acquire())
    waiter.start()
    wait_until(lambda: waiters(server, b) == 1, "the multi-key acquire waits")
    assert server.blocked_clients("lock.macquire") == []
    wait_until(lambda: len(in_blpop(server)) == 1, "its ticket is popped")
    release()
    guard = waiter.result()
    for k in (a, b):
        found = info(server, k)
        assert found is not None and found[b"owner"] == guard.owner
        assert found[b"token"] == guard.tokens[k]
    assert guard.release() is Release.RELEASED


@pytest.mark.scenario("tickets-wait", "election-campaign")
def test_a_campaign_waits_with_a_ticket(server, client, key):
    first = client.election(key, "node-a", ephemeral=False).campaign()
    waiter = Waiter(lambda: client.election(key, "node-b", ephemeral=False).campaign(timeout=10))
    waiter.start()
    wait_until(lambda: waiters(server, key) == 1, "node-b waits")
    assert server.blocked_clients("lock.campaign") == []
    wait_until(lambda: len(in_blpop(server)) == 1, "its ticket is popped")
    first.resign()
    leadership = waiter.result()
    assert leadership.epoch > first.epoch
    assert client.election(key).leader().candidate == b"node-b"
    leadership.resign()


@pytest.mark.scenario("tickets-wait", "acquire-long-wait")
def test_a_ticket_wait_longer_than_the_lease_is_confirmed_and_renewed(server, client, key):
    # 2 s: renewed every 0.67 s, lost locally 1.8 s after a renewal's send. At 1 s, a test
    # process starved for 0.6 s (load average 6-9) lost the hold to its own deadline.
    lease = 2.0
    release = hold_elsewhere(server, key)
    threading.Timer(1.3 * lease, release).start()
    renews = server.commandstat("lock.renew")
    guard = client.lock(key, lease=lease, wait_timeout=30).acquire()
    assert server.commandstat("lock.renew") > renews  # confirmed by a renewal at once
    assert client._single.tickets.issued == 1  # type: ignore[union-attr]
    end = time.monotonic() + 1.5 * lease
    while time.monotonic() < end:
        assert not guard.lost.is_set()
        time.sleep(0.02)
    assert_held(server, key, guard)
    guard.release()


@pytest.mark.scenario("tickets-one-connection")
def test_the_waiting_connections_close_when_idle(server, key):
    with LockClient.from_url(server.url) as client:
        release = hold_elsewhere(server, key)
        waiter = Waiter(lambda: client.lock(key, wait_timeout=10).acquire())
        waiter.start()
        wait_until(lambda: len(named(server, ":tickets-wait")) == 1, "the desk opened")
        release()
        waiter.result().release()
        wait_until(lambda: named(server, ":tickets-") == [], "closed when idle", bound=15)


@pytest.fixture
def debug_server(tmp_path):
    from conftest import start_server

    s = start_server(tmp_path, "--enable-debug-command", "yes")
    yield s
    s.proc.kill()
    s.proc.wait()


def lapsed(server: Server) -> int:
    """Ticket grants the server marked ``expired`` (INFO lock)."""
    return int(server.client().info("lock").get("lock_ticket_grants_lapsed", 0))


def stall_past_the_grant(server: Server, key: str, seconds: float) -> None:
    """The holder releases (the waiter is granted) and the server stalls right after, in one
    MULTI: nobody can pop the grant before its lease ends."""
    pipe = server.client().pipeline(transaction=True)
    pipe.execute_command("LOCK.RELEASE", key, "other")
    pipe.execute_command("DEBUG", "SLEEP", seconds)
    pipe.execute()


@pytest.mark.scenario("tickets-wait", "tickets-expired")
def test_a_grant_that_lapsed_before_the_pop_is_no_grant_and_the_wait_asks_again(
        debug_server, key):
    """The server grants, then stalls past the grant's lease before anyone can pop it: the
    server marks the ticket ``expired`` (the hold is gone). The waiter, whose deadline has not
    passed, asks again and is granted the (free) key: a hold the server has, never the lapsed
    one."""
    server, lease = debug_server, 0.3
    with LockClient.from_url(server.url, lost_signal=False) as client:
        hold_elsewhere(server, key)
        asked = server.commandstat("lock.acquire")
        waiter = Waiter(lambda: client.lock(key, lease=lease, wait_timeout=10).acquire())
        waiter.start()
        wait_until(lambda: len(in_blpop(server)) == 1, "the ticket is popped")
        stall_past_the_grant(server, key, lease * 2)
        guard = waiter.result()
        assert lapsed(server) == 1
        assert server.commandstat("lock.acquire") == asked + 2  # asked again
        assert_held(server, key, guard)
        guard.release()
        assert info(server, key) is None


@pytest.mark.scenario("tickets-wait", "tickets-expired", "acquire-timeout")
def test_a_grant_that_lapsed_and_is_popped_after_the_wait_is_the_timeout(debug_server, key):
    """As above, but the server stalls past the waiter's own deadline too: ``expired`` popped
    then is LockTimeout, not asked again, and nothing is held."""
    server, lease = debug_server, 0.3
    with LockClient.from_url(server.url, lost_signal=False) as client:
        hold_elsewhere(server, key)
        asked = server.commandstat("lock.acquire")
        waiter = Waiter(lambda: client.lock(key, lease=lease, wait_timeout=1.0).acquire())
        waiter.start()
        wait_until(lambda: len(in_blpop(server)) == 1, "the ticket is popped")
        stall_past_the_grant(server, key, 1.5)
        with pytest.raises(LockTimeout):
            waiter.result()
        assert lapsed(server) == 1
        assert server.commandstat("lock.acquire") == asked + 1  # not asked again
        assert info(server, key) is None


@pytest.mark.scenario("tickets-cancel")
def test_an_async_cancel_while_the_acquire_is_asked_leaves_the_other_waits_in_place(server, key):
    """Writes are paused, so that an acquire's ask is out unanswered when its task is cancelled:
    the asking connection (every other wait's tickets belong to it) is kept; the cancelled
    acquire's ticket is withdrawn once the ask is answered, and nobody else asks again."""
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            desk = client._single.tickets  # type: ignore[union-attr]
            release = hold_elsewhere(server, key)
            first = asyncio.create_task(client.lock(key, wait_timeout=30).acquire())
            while waiters(server, key) != 1:
                await asyncio.sleep(0.01)
            second = asyncio.create_task(client.lock(key, wait_timeout=30).acquire())
            while waiters(server, key) != 2:
                await asyncio.sleep(0.01)
            (asking,) = named(server, ":tickets-ask")
            server.client().execute_command("CLIENT", "PAUSE", 1000, "WRITE")
            cancelled = asyncio.create_task(client.lock(key, wait_timeout=30).acquire())
            await asyncio.sleep(0.3)  # its LOCK.ACQUIRE is held back by the pause
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            deadline = time.monotonic() + 10
            while desk.issued < 3 or waiters(server, key) != 2:  # asked, then withdrawn
                assert time.monotonic() < deadline, (desk.issued, waiters(server, key))
                await asyncio.sleep(0.02)
            await asyncio.sleep(HEALTH_PERIOD)  # a broken desk would have been noticed
            assert [c["id"] for c in named(server, ":tickets-ask")] == [asking["id"]]
            assert desk.issued == 3  # nobody asked again
            release()
            guard = await first
            assert_held(server, key, guard)
            assert not second.done()
            await guard.release()
            guard = await second
            assert_held(server, key, guard)
            await guard.release()
            assert info(server, key) is None
    run(main())


def the_ticket(client: Any) -> bytes:
    """The name of the one ticket the client's desk waits for."""
    desk = client._single.tickets
    (name,) = [n for group in desk._slots.values() for n in group.tickets]
    return bytes(name)


@pytest.mark.scenario("tickets-wait", "tickets-expired")
def test_a_ticket_popped_expired_is_no_grant_and_the_wait_asks_again(server, client, key):
    """``expired`` (a grant not popped within its lease; written here from outside, as the
    server writes it) grants nothing: the wait, whose deadline has not passed, asks again
    (its new ticket takes the old one's place) and is granted when the key is released."""
    release = hold_elsewhere(server, key)
    waiter = Waiter(lambda: client.lock(key, wait_timeout=20).acquire())
    waiter.start()
    wait_until(lambda: waiters(server, key) == 1 and len(in_blpop(server)) == 1, "waits")
    desk = client._single.tickets
    server.client().lpush(the_ticket(client), "expired")
    wait_until(lambda: desk.issued == 2 and waiters(server, key) == 1, "asked again")
    assert waiter.is_alive()
    release()
    guard = waiter.result()
    assert_held(server, key, guard)
    assert guard.release() is Release.RELEASED


def own_connection(server: Server, owner: bytes) -> list[dict[str, str]]:
    return [c for c in connections(server) if c.get("name", "").endswith(":" + owner.decode())]


@pytest.mark.scenario("tickets-wait", "ephemeral-owned-connection")
def test_an_ephemeral_wait_takes_a_ticket_on_the_connection_its_hold_is_bound_to(
        server, client, key):
    release = hold_elsewhere(server, key)
    handle = client.lock(key, ephemeral=True, wait_timeout=10)
    waiter = Waiter(handle.acquire)
    waiter.start()
    wait_until(lambda: waiters(server, key) == 1 and len(in_blpop(server)) == 1,
               "waits with a ticket")
    assert server.blocked_clients("lock.acquire") == []
    (own,) = own_connection(server, handle.owner)
    assert own["cmd"] == "lock.acquire"  # asked there, not blocked there
    release()
    guard = waiter.result()
    assert_held(server, key, guard)
    assert int(info(server, key)[b"ephemeral"]) == int(own["id"])  # bound to the asking one
    server.client().execute_command("CLIENT", "KILL", "ID", own["id"])
    assert guard.lost.wait(5)
    assert info(server, key) is None


@pytest.mark.scenario("tickets-connection-lost", "ephemeral-owned-connection")
def test_an_ephemeral_ticket_wait_whose_connection_is_killed_raises_and_leaves_the_queue(
        server, client, key):
    release = hold_elsewhere(server, key)
    handle = client.lock(key, ephemeral=True)  # no timeout: a lost ticket would hang
    waiter = Waiter(handle.acquire)
    waiter.start()
    wait_until(lambda: waiters(server, key) == 1 and len(in_blpop(server)) == 1, "waits")
    (own,) = own_connection(server, handle.owner)
    server.client().execute_command("CLIENT", "KILL", "ID", own["id"])
    with pytest.raises(LockConnectionError):
        waiter.result()
    assert waiters(server, key) == 0
    release()
    assert info(server, key) is None


@pytest.mark.scenario("tickets-wait", "ephemeral-owned-connection")
def test_async_an_ephemeral_wait_takes_a_ticket(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            release = hold_elsewhere(server, key)
            handle = client.lock(key, ephemeral=True, wait_timeout=10)
            task = asyncio.create_task(handle.acquire())
            deadline = time.monotonic() + 10
            while waiters(server, key) != 1 or len(in_blpop(server)) != 1:
                assert time.monotonic() < deadline, "waits with a ticket"
                await asyncio.sleep(0.01)
            assert server.blocked_clients("lock.acquire") == []
            (own,) = own_connection(server, handle.owner)
            release()
            guard = await task
            assert_held(server, key, guard)
            assert int(info(server, key)[b"ephemeral"]) == int(own["id"])
            await guard.release()
    run(main())


def postponed(server: Server) -> bool:
    """Whether the waiting connection's ``BLPOP`` is postponed by a write pause: blocked, but in
    no timeout table (a ``BLPOP`` blocked on its keys is there, with its timeout)."""
    waiting = named(server, ":tickets-wait")
    return (
        len(waiting) == 1
        and waiting[0].get("cmd") == "blpop"
        and "b" in waiting[0].get("flags", "")
        and int(server.client().info("clients")["clients_in_timeout_table"]) == 0
    )


def alive(server: Server) -> bool:
    try:
        return bool(server.client(socket_timeout=2).ping())
    except redis.RedisError:
        return False


@pytest.mark.scenario("tickets-wait")
def test_a_new_wait_interrupting_a_blpop_a_write_pause_postponed_leaves_the_server_up(
        fresh_server, key, monkeypatch):
    # A ticket issued just before a write pause (CLIENT PAUSE WRITE, as every failover pauses
    # writes) interrupts the BLPOP out, which the group sent again during the pause: BLPOP is a
    # write, so the server postponed it, and CLIENT UNBLOCK of a postponed client kills Redis
    # 7.0 ("Unknown btype in replyToBlockedClientTimedOut"); newer servers answer 0, and a
    # bare interrupt is sent again and again. The gate holds the interrupt until the BLPOP is
    # postponed (it is sent at once otherwise, and that ordering is a matter of luck).
    server = fresh_server
    with LockClient.from_url(server.url) as client:
        release = hold_elsewhere(server, key)
        first = Waiter(lambda: client.lock(key, wait_timeout=60).acquire())
        first.start()
        wait_until(lambda: waiters(server, key) == 1 and len(in_blpop(server)) == 1, "pops")
        reached, gate = threading.Event(), threading.Event()
        interrupt = SyncDesk._unblock

        def gated(desk: SyncDesk, ticket: Any) -> None:
            reached.set()
            gate.wait(30)
            interrupt(desk, ticket)

        monkeypatch.setattr(SyncDesk, "_unblock", gated)
        second = Waiter(lambda: client.lock(key, wait_timeout=60).acquire())
        second.start()
        assert reached.wait(10), "the second wait has its ticket"
        raw = server.client()
        unblocks = server.commandstat("client|unblock")
        raw.execute_command("CLIENT", "PAUSE", 8000, "WRITE")
        try:
            wait_until(lambda: postponed(server), "the BLPOP sent again is postponed", 10)
            gate.set()
            time.sleep(0.5)
            assert alive(server), "the server went down"
            assert server.commandstat("client|unblock") - unblocks <= 1, "CLIENT UNBLOCK spins"
        finally:
            gate.set()
            if alive(server):
                raw.execute_command("CLIENT", "UNPAUSE")
        release()
        guard = first.result(20)
        assert_held(server, key, guard)
        guard.release()
        guard = second.result(20)
        assert_held(server, key, guard)
        guard.release()


@pytest.mark.scenario("tickets-wait")
def test_async_a_new_wait_interrupting_a_blpop_a_write_pause_postponed_leaves_the_server_up(
        fresh_server, key, monkeypatch):
    server = fresh_server

    async def until(condition: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.01)

    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            release = hold_elsewhere(server, key)
            first = asyncio.create_task(client.lock(key, wait_timeout=60).acquire())
            await until(lambda: waiters(server, key) == 1 and len(in_blpop(server)) == 1, "pops")
            reached, gate = asyncio.Event(), asyncio.Event()
            interrupt = AsyncDesk._unblock

            async def gated(desk: AsyncDesk, ticket: Any) -> None:
                reached.set()
                await gate.wait()
                await interrupt(desk, ticket)

            monkeypatch.setattr(AsyncDesk, "_unblock", gated)
            second = asyncio.create_task(client.lock(key, wait_timeout=60).acquire())
            await asyncio.wait_for(reached.wait(), 10)
            raw = server.client()
            unblocks = server.commandstat("client|unblock")
            raw.execute_command("CLIENT", "PAUSE", 8000, "WRITE")
            try:
                await until(lambda: postponed(server), "the BLPOP sent again is postponed")
                gate.set()
                await asyncio.sleep(0.5)
                assert alive(server), "the server went down"
                assert server.commandstat("client|unblock") - unblocks <= 1, "UNBLOCK spins"
            finally:
                gate.set()
                if alive(server):
                    raw.execute_command("CLIENT", "UNPAUSE")
            release()
            guard = await asyncio.wait_for(first, 20)
            assert_held(server, key, guard)
            await guard.release()
            guard = await asyncio.wait_for(second, 20)
            assert_held(server, key, guard)
            await guard.release()
    run(main())


@pytest.mark.scenario("tickets-cancel")
def test_async_a_grant_released_for_a_cancelled_acquire_is_gone_before_the_handle_acquires_again(
        server, key):
    # An acquire cancelled while it is asked (a write pause holds the ask back) is granted at
    # once when the pause ends; that grant is released for it. The handle's next acquire (ONCE:
    # the owner's grant is re-entered with its token) must wait for that release, or it would
    # re-enter the grant just before the release frees it, and hold nothing.
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            handle = client.lock(key, wait_timeout=30)
            for _ in range(3):
                server.client().execute_command("CLIENT", "PAUSE", 500, "WRITE")
                cancelled = asyncio.create_task(handle.acquire())
                await asyncio.sleep(0.2)  # its LOCK.ACQUIRE is held back by the pause
                cancelled.cancel()
                guard = await asyncio.wait_for(handle.acquire(), 10)
                with pytest.raises(asyncio.CancelledError):
                    await cancelled
                await asyncio.sleep(0.2)
                assert_held(server, key, guard)
                await guard.release()
                assert info(server, key) is None
    run(main())


@pytest.mark.scenario("tickets-one-connection")
@pytest.mark.parametrize("refused", ["-multi", "-del"])
def test_a_user_refused_the_fenced_interrupt_still_has_a_new_ticket_popped(
        fresh_server, key, refused):
    # The interrupt goes in MULTI ... EXEC behind a DEL: a user an ACL refuses either never
    # sends CLIENT UNBLOCK (alone it could meet a postponed BLPOP); the BLPOP out ends within
    # HEALTH_PERIOD and the next one takes the new ticket in.
    server = fresh_server
    # `&*`: the lost-hold channels (a refused one fails the acquire at once, test_acl.py).
    server.client().execute_command("ACL", "SETUSER", "waiter", "on", ">pw", "~*", "&*", "+@all",
                                    refused)
    with LockClient.from_url(f"redis://waiter:pw@127.0.0.1:{server.port}/") as client:
        release = hold_elsewhere(server, key)
        first = Waiter(lambda: client.lock(key, wait_timeout=30).acquire())
        first.start()
        wait_until(lambda: waiters(server, key) == 1 and len(in_blpop(server)) == 1, "pops")
        second = Waiter(lambda: client.lock(key, wait_timeout=30).acquire())
        second.start()
        wait_until(lambda: waiters(server, key) == 2, "two wait")
        release()
        guard = first.result(10)
        assert_held(server, key, guard)
        guard.release()
        guard = second.result(10)
        assert_held(server, key, guard)
        guard.release()
        assert server.commandstat("client|unblock") == 0
