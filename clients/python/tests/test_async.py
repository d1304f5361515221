"""The asyncio library against a real server with the module (see conftest.py)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from conftest import Server, info
from redis_lock_client import AsyncLockClient, LockTimeout, LostReason, NotHeld, Release


def run(coro):  # one event loop per test, no plugin needed
    return asyncio.run(coro)


@pytest.mark.scenario("acquire-try", "release-idempotent")
def test_async_acquire_try_and_release(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            guard = await client.lock(key).acquire()
            assert await client.lock(key).try_acquire() is None
            assert await guard.release() is Release.RELEASED
            assert await guard.release() is Release.ALREADY_RELEASED
            assert info(server, key) is None
    run(main())


@pytest.mark.scenario("acquire-wait", "acquire-timeout")
def test_async_wait_is_granted_on_release_and_times_out(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            held = await client.lock(key).acquire()
            start = time.monotonic()
            with pytest.raises(LockTimeout):
                await client.lock(key, wait_timeout=0.3).acquire()
            # The server counts the wait on its millisecond clock: up to 1 ms early on ours.
            assert 0.298 <= time.monotonic() - start < 2

            async def later() -> None:
                await asyncio.sleep(0.3)
                await held.release()
            task = asyncio.create_task(later())
            guard = await client.lock(key, wait_timeout=5).acquire()
            assert guard.token > held.token
            await task
            await guard.release()
    run(main())


@pytest.mark.scenario("reentry")
def test_async_reentry_and_context_manager(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            lock = client.lock(key)
            async with lock as outer:
                async with lock as inner:
                    assert inner.token == outer.token
                    assert info(server, key)[b"count"] == 1
                assert info(server, key) is not None
            assert info(server, key) is None
    run(main())


@pytest.mark.scenario("read-write", "semaphore")
def test_async_read_write_and_semaphore(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            r1 = await client.read_lock(key).acquire()
            r2 = await client.read_lock(key).acquire()
            assert await client.lock(key).try_acquire() is None
            await r1.release()
            await r2.release()
            sem = key + ":sem"
            a = await client.semaphore(sem, 2).acquire()
            b = await client.semaphore(sem, 2).acquire()
            assert await client.semaphore(sem, 2).try_acquire() is None
            await a.release()
            await b.release()
    run(main())


@pytest.mark.scenario("watchdog", "no-renewal-after-release")
def test_async_watchdog_renews_and_stops_after_release(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            guard = await client.lock(key, lease=0.6).acquire()
            before = server.commandstat("lock.renew")
            await asyncio.sleep(2.0)
            assert server.commandstat("lock.renew") - before >= 8
            assert not guard.lost.is_set()
            await guard.release()
            after = server.commandstat("lock.renew")
            await asyncio.sleep(0.6)
            assert server.commandstat("lock.renew") == after
    run(main())


@pytest.mark.scenario("lost-unreachable")
def test_async_blocked_loop_reports_the_hold_unreachable_when_it_resumes(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, lost_signal=False) as client:
            guard = await client.lock(key, lease=0.5).acquire()
            time.sleep(0.8)  # blocks the loop: the watchdog task cannot run
            await asyncio.wait_for(guard.lost.wait(), 0.5)
            assert guard.lost_reason is LostReason.UNREACHABLE
            with pytest.raises(NotHeld):
                await guard.release()
    run(main())


@pytest.mark.scenario("lost-forcereleased")
def test_async_force_release_is_reported_by_the_signal_within_100_ms(server, key):
    async def main() -> None:
        seen: list[LostReason] = []
        async with AsyncLockClient.from_url(server.url) as client:
            guard = await client.lock(key, on_lost=seen.append).acquire()
            server.client().execute_command("LOCK.FORCERELEASE", key)
            await asyncio.wait_for(guard.lost.wait(), 0.1)
            assert guard.lost_reason is LostReason.FORCE_RELEASED
            for _ in range(100):  # the callback runs just after the event is set
                if seen:
                    break
                await asyncio.sleep(0.01)
            assert seen == [LostReason.FORCE_RELEASED]
    run(main())


@pytest.mark.scenario("lost-hold-gone")
def test_async_force_release_is_reported_by_the_watchdog_without_the_signal(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, lost_signal=False) as client:
            guard = await client.lock(key, lease=0.6).acquire()
            server.client().execute_command("LOCK.FORCERELEASE", key)
            await asyncio.wait_for(guard.lost.wait(), 1.0)
            assert guard.lost_reason is LostReason.HOLD_GONE
    run(main())


@pytest.mark.scenario("ephemeral-owned-connection", "lost-disconnected")
@pytest.mark.parametrize("signal", [True, False])
def test_async_ephemeral_hold_ends_with_its_connection(server, key, signal):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, lost_signal=signal) as client:
            guard = await client.lock(key, ephemeral=True).acquire()
            conn_id = info(server, key)[b"ephemeral"]
            server.client().execute_command("CLIENT", "KILL", "ID", conn_id)
            await asyncio.wait_for(guard.lost.wait(), 1.0)
            expected = {LostReason.DISCONNECTED, LostReason.CONNECTION_CLOSED}
            assert guard.lost_reason in (expected if signal else {LostReason.CONNECTION_CLOSED})
            other = await client.lock(key).try_acquire()
            assert other is not None
            await other.release()
    run(main())


@pytest.mark.scenario("lost-exit-raises")
def test_async_with_block_raises_not_held_when_the_hold_was_lost_inside(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            with pytest.raises(NotHeld) as e:
                async with client.lock(key) as guard:
                    server.client().execute_command("LOCK.FORCERELEASE", key)
                    await asyncio.wait_for(guard.lost.wait(), 1.0)
            assert e.value.reason is LostReason.FORCE_RELEASED
    run(main())


@pytest.mark.scenario("lost-forked")
def test_async_forked_child_neither_renews_nor_releases_its_parents_hold(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            lock = client.lock(key, lease=0.6)
            guard = await lock.acquire()
            parent_owner = lock.owner
            renews, releases = server.commandstat("lock.renew"), server.commandstat("lock.release")
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns to pytest
                code = b"?"
                try:
                    ok = guard.lost_reason is LostReason.FORKED and guard.lost.is_set()
                    try:  # raises before its first await: no event loop runs in the child
                        guard.release().send(None)
                        ok = False
                    except NotHeld as e:
                        ok = ok and e.reason is LostReason.FORKED
                    ok = ok and lock.owner != parent_owner  # a new owner, holding nothing
                    time.sleep(1.0)  # a lease and more: nothing here renews
                    code = b"1" if ok else b"0"
                finally:
                    os.write(w, code)
                    os._exit(0)
            os.close(w)
            assert await asyncio.to_thread(os.read, r, 1) == b"1"
            await asyncio.to_thread(os.waitpid, pid, 0)
            os.close(r)
            assert server.commandstat("lock.release") == releases  # the child sent none
            assert not guard.lost.is_set()
            assert info(server, key)[b"owner"] == guard.owner
            # Renewals over that second came from the parent's watchdog only (about 5 at 0.2 s).
            assert 3 <= server.commandstat("lock.renew") - renews <= 8
            assert await guard.release() is Release.RELEASED
    run(main())

