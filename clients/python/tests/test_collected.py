"""A guard the garbage collector takes unreleased is released in the background, and that
release is ordered before the same handle's next acquire: the next acquire (ONCE) must never be
handed the old hold's token and then see the background release free the key."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from conftest import info
from redis_lock_client import AsyncLockClient, LockClient, NotHeld, Release

TRIALS = 200


@pytest.mark.scenario("release-collected")
def test_a_collected_guards_release_never_frees_the_handles_next_hold(server, key):
    raw = server.client()
    with LockClient.from_url(server.url) as client:
        lock = client.lock(key, lease=30)
        broken = []
        for i in range(TRIALS):
            def forget() -> int:
                guard = lock.acquire()
                return guard.token  # the guard is collected unreleased right here
            old = forget()
            guard = lock.acquire()  # the handle's next acquire
            time.sleep(0.01)  # a background release, if any, lands
            held = info(server, key)
            if not guard.lost.is_set():
                if held is None or held[b"token"] != guard.token:
                    broken.append((i, old, guard.token, held))
            try:
                guard.release()
            except NotHeld:
                pass
            raw.execute_command("LOCK.FORCERELEASE", key)
        assert broken == [], f"{len(broken)}/{TRIALS} guards said held while the server did not"
    assert info(server, key) is None


@pytest.mark.scenario("release-collected")
def test_a_guard_collected_while_the_handle_reacquires_keeps_the_new_guard_true(server, key):
    # Deterministic: the server is stopped while a thread re-acquires through the handle (ONCE:
    # the server will answer the old token) on the client's one pooled connection, and the last
    # guard is collected meanwhile: anything the collection sends needs a new connection, so
    # the server reads the acquire first. The collected guard's release must not then free the
    # hold the acquire returned.
    with LockClient.from_url(server.url) as client:
        lock = client.lock(key, lease=30)
        guard = lock.try_acquire()  # on the pool's first connection, idle again after
        assert guard is not None
        token = guard.token
        got: list[object] = []
        with server.stopped():
            again = threading.Thread(target=lambda: got.append(lock.try_acquire()))
            again.start()
            time.sleep(0.1)  # its LOCK.ACQUIRE is sent, unanswered
            del guard
            gc.collect()
            time.sleep(0.1)  # whatever the collection sends is sent now, unanswered
        again.join(5)
        (new,) = got
        time.sleep(0.1)  # whatever was sent is answered
        assert new.token == token  # the same hold (ONCE), counted once more in the library
        held = info(server, key)
        assert not new.lost.is_set()
        assert held is not None and held[b"token"] == new.token, "the guard says held, the key is free"
        assert new.release() is Release.RELEASED
        assert info(server, key) is None


@pytest.mark.scenario("release-collected")
def test_a_collected_guard_is_released_in_the_background(server, key):
    with LockClient.from_url(server.url) as client:
        lock = client.lock(key, lease=30)
        lock.acquire()  # not kept: collected at once
        gc.collect()
        deadline = time.monotonic() + 5
        while info(server, key) is not None:
            assert time.monotonic() < deadline, "the collected guard was never released"
            time.sleep(0.01)


@pytest.mark.scenario("release-collected")
def test_async_a_collected_guards_release_never_frees_the_handles_next_hold(server, key):
    raw = server.client()

    async def main() -> list[object]:
        broken: list[object] = []
        async with AsyncLockClient.from_url(server.url) as client:
            lock = client.lock(key, lease=30)
            for i in range(TRIALS):
                async def forget() -> int:
                    guard = await lock.acquire()
                    return guard.token
                old = await forget()
                guard = await lock.acquire()
                await asyncio.sleep(0.01)
                held = info(server, key)
                if not guard.lost.is_set():
                    if held is None or held[b"token"] != guard.token:
                        broken.append((i, old, guard.token, held))
                try:
                    await guard.release()
                except NotHeld:
                    pass
                raw.execute_command("LOCK.FORCERELEASE", key)
            # A collected guard alone is released in the background too.
            await lock.acquire()
            gc.collect()
            deadline = time.monotonic() + 5
            while info(server, key) is not None:
                assert time.monotonic() < deadline, "the collected guard was never released"
                await asyncio.sleep(0.01)
        return broken

    broken = asyncio.run(main())
    assert broken == [], f"{len(broken)}/{TRIALS} guards said held while the server did not"


@pytest.mark.scenario("release-collected")
def test_async_a_guard_collected_while_the_handle_reacquires_keeps_the_new_guard_true(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            lock = client.lock(key, lease=30)
            guard = await lock.try_acquire()  # on the pool's first connection, idle again after
            assert guard is not None
            token = guard.token
            with server.stopped():
                again = asyncio.create_task(lock.try_acquire())
                await asyncio.sleep(0.1)  # its LOCK.ACQUIRE is sent, unanswered
                del guard
                gc.collect()
                await asyncio.sleep(0.1)  # whatever the collection sends is sent, unanswered
            new = await asyncio.wait_for(again, 5)
            await asyncio.sleep(0.1)
            assert new.token == token
            held = info(server, key)
            assert not new.lost.is_set()
            assert held is not None and held[b"token"] == new.token, "the guard says held, the key is free"
            assert await new.release() is Release.RELEASED
            assert info(server, key) is None
    asyncio.run(main())
