"""Multi-key locks (client.multi_lock: LOCK.MACQUIRE / MRENEW / MRELEASE), sync and asyncio,
against a real server with the module (see conftest.py). The cluster cases are in
test_cluster.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import threading
import time
from pathlib import Path

import pytest

from conftest import Server, info, wait_until
from redis_lock_client import (
    AsyncLockClient,
    LockClient,
    LockTimeout,
    LostReason,
    NotHeld,
    Release,
)


@pytest.mark.scenario("multi-all-or-nothing")
def test_every_key_or_none_with_a_token_per_key_in_the_order_given(server, client, key):
    a, b, c = key + ":a", key + ":b", key + ":c"
    raw = server.client()
    assert raw.execute_command("LOCK.ACQUIRE", b, "other", 30000) > 0
    calls = server.commandstat("lock.macquire")
    assert client.multi_lock([a, b, c]).try_acquire() is None  # b is someone else's
    assert server.commandstat("lock.macquire") == calls + 1  # one command, not one per key
    assert info(server, a) is None and info(server, c) is None  # nothing was touched
    raw.execute_command("LOCK.RELEASE", b, "other")

    guard = client.multi_lock([c, a, b.encode()]).try_acquire()  # str and bytes keys
    assert guard is not None
    assert list(guard.tokens) == [c, a, b.encode()]  # keyed as given, in that order
    assert guard.keys == (c.encode(), a.encode(), b.encode())
    for k in (a, b, c):
        held = info(server, k)
        assert held[b"owner"] == guard.owner
        assert held[b"token"] == guard.tokens[k if k != b else b.encode()]
    assert guard.tokens[b.encode()] > 0
    # Each key is an ordinary hold: a single-key lock of another owner is refused on any.
    assert client.lock(a).try_acquire() is None
    assert guard.release() is Release.RELEASED
    assert all(info(server, k) is None for k in (a, b, c))


@pytest.mark.scenario("multi-all-or-nothing")
def test_keys_are_checked_before_anything_is_sent(client, key):
    with pytest.raises(TypeError):
        client.multi_lock(key)  # one key given as a str, not a list of keys
    with pytest.raises(ValueError):
        client.multi_lock([])
    with pytest.raises(ValueError):
        client.multi_lock([key, key.encode()])  # the same key twice
    with pytest.raises(ValueError):
        client.multi_lock([f"{key}:{i}" for i in range(65)])
    assert client.multi_lock([f"{key}:{i}" for i in range(64)]).try_acquire() is not None


@pytest.mark.scenario("multi-shared")
def test_shared_multi_locks_share_every_key_and_exclude_a_writer(server, client, key):
    a, b = key + ":a", key + ":b"
    r1 = client.multi_lock([a, b], shared=True).acquire()
    r2 = client.multi_lock([b, a], shared=True).acquire()
    assert info(server, a)[b"mode"] == b"shared"
    assert client.lock(b).try_acquire() is None
    assert client.multi_lock([a, b]).try_acquire() is None
    r1.release()
    r2.release()
    w = client.multi_lock([a, b]).try_acquire()
    assert w is not None
    assert client.read_lock(a).try_acquire() is None
    w.release()


@pytest.mark.scenario("multi-wait")
def test_a_wait_stands_in_every_queue_and_is_granted_when_the_held_key_frees(server, client, key):
    a, b = key + ":a", key + ":b"
    held = client.lock(b).acquire()
    calls = server.commandstat("lock.macquire")
    got: list[object] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.multi_lock([a, b], wait_timeout=10).acquire()),
        daemon=True,
    )
    waiter.start()
    wait_until(lambda: info(server, b)[b"waiters"] == 1, "the wait is queued on the held key")
    free = info(server, a)
    assert free is None or b"owner" not in free  # the free key is not taken alone meanwhile
    assert not got
    other = client.lock(key + ":other").try_acquire()  # the same client, meanwhile
    assert other is not None and other.release() is Release.RELEASED
    held.release()
    waiter.join(10)
    assert len(got) == 1
    guard = got[0]
    assert guard.tokens[b] > held.token  # type: ignore[attr-defined]
    assert info(server, a)[b"owner"] == info(server, b)[b"owner"] == guard.owner  # type: ignore[attr-defined]
    # Waited in the server: one LOCK.MACQUIRE ... WAIT, no polling.
    assert server.commandstat("lock.macquire") == calls + 1
    guard.release()  # type: ignore[attr-defined]


@pytest.mark.scenario("multi-wait")
def test_a_wait_that_passes_raises_lock_timeout_and_leaves_every_queue(server, client, key):
    a, b = key + ":a", key + ":b"
    held = client.lock(a).acquire()
    with pytest.raises(LockTimeout):
        client.multi_lock([a, b], wait_timeout=0.2).acquire()
    assert info(server, a)[b"waiters"] == 0
    assert info(server, b) is None
    held.release()


@pytest.mark.scenario("multi-wait")
def test_opposite_key_orders_do_not_deadlock(client, key):
    a, b = key + ":a", key + ":b"
    done: list[int] = []

    def worker(keys: list[str]) -> None:
        lock = client.multi_lock(keys, wait_timeout=10)
        for _ in range(20):
            with lock:
                pass
        done.append(1)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True)
               for k in ([a, b], [b, a], [a, b], [b, a])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(done) == 4


@pytest.mark.scenario("multi-watchdog")
def test_one_mrenew_keeps_every_key_past_several_leases(server, client, key):
    a, b, c = key + ":a", key + ":b", key + ":c"
    guard = client.multi_lock([a, b, c], lease=0.6).acquire()
    renews, mrenews = server.commandstat("lock.renew"), server.commandstat("lock.mrenew")
    time.sleep(2.0)  # more than three leases
    assert server.commandstat("lock.mrenew") - mrenews >= 4  # 10 due at lease / 3
    assert server.commandstat("lock.renew") == renews  # one command for all keys, not one each
    assert not guard.lost.is_set()
    for k in (a, b, c):
        assert info(server, k)[b"owner"] == guard.owner
    guard.release()
    after = server.commandstat("lock.mrenew")
    time.sleep(0.5)
    assert server.commandstat("lock.mrenew") == after  # nothing renews after the release


@pytest.mark.scenario("multi-lost")
def test_force_release_of_one_key_is_reported_by_its_signal(server, client, key):
    a, b = key + ":a", key + ":b"
    seen: list[LostReason] = []
    guard = client.multi_lock([a, b], on_lost=seen.append).acquire()  # lease 30 s
    server.client().execute_command("LOCK.FORCERELEASE", b)
    assert guard.lost.wait(1.0)
    assert guard.lost_reason is LostReason.FORCE_RELEASED
    wait_until(lambda: bool(seen), "the callback runs")
    assert seen == [LostReason.FORCE_RELEASED]
    assert info(server, a)[b"owner"] == guard.owner  # the other key is still the owner's ...
    with pytest.raises(NotHeld) as e:
        guard.release()
    assert e.value.reason is LostReason.FORCE_RELEASED
    assert info(server, a) is None  # ... until the release, which frees it all the same


@pytest.mark.scenario("multi-lost")
def test_without_the_signal_an_mrenew_answering_0_for_one_key_reports_hold_gone(server, key):
    client = LockClient.from_url(server.url, lost_signal=False)
    a, b = key + ":a", key + ":b"
    guard = client.multi_lock([a, b], lease=0.6).acquire()
    server.client().execute_command("LOCK.FORCERELEASE", a)
    assert guard.lost.wait(1.0)
    assert guard.lost_reason is LostReason.HOLD_GONE
    with pytest.raises(NotHeld) as e:
        guard.release()
    assert e.value.reason is LostReason.HOLD_GONE
    assert info(server, b) is None  # the release freed the key still held
    client.close()


@pytest.mark.scenario("multi-release", "multi-reentry")
def test_release_frees_every_key_and_reentry_shares_the_hold(server, client, key):
    a, b = key + ":a", key + ":b"
    lock = client.multi_lock([a, b])
    releases = server.commandstat("lock.mrelease")
    with lock as outer:
        with lock as inner:
            assert inner.tokens == outer.tokens
            assert info(server, a)[b"count"] == info(server, b)[b"count"] == 1  # ONCE
        assert info(server, a)[b"owner"] == lock.owner
        assert server.commandstat("lock.mrelease") == releases  # counted down in the client
    assert info(server, a) is None and info(server, b) is None
    assert server.commandstat("lock.mrelease") == releases + 1  # one command for both keys
    assert outer.release() is Release.ALREADY_RELEASED


@pytest.mark.scenario("multi-release")
def test_release_after_the_server_dropped_a_key_raises_not_held(server, key):
    client = LockClient.from_url(server.url, lost_signal=False)
    a, b = key + ":a", key + ":b"
    guard = client.multi_lock([a, b]).acquire()  # lease 30 s: no renewal notices meanwhile
    server.client().execute_command("LOCK.FORCERELEASE", a)
    with pytest.raises(NotHeld) as e:
        guard.release()
    assert e.value.reason is None  # the server knew no hold there
    assert info(server, b) is None  # the other key was released by the same LOCK.MRELEASE
    client.close()


@pytest.mark.scenario("multi-ephemeral")
def test_ephemeral_multi_hold_ends_on_every_key_with_its_connection(server, client, key):
    a, b = key + ":a", key + ":b"
    guard = client.multi_lock([a, b], ephemeral=True).acquire()
    conn_id = info(server, a)[b"ephemeral"]
    assert isinstance(conn_id, int) and info(server, b)[b"ephemeral"] == conn_id
    server.client().execute_command("CLIENT", "KILL", "ID", conn_id)
    assert guard.lost.wait(1.0)
    assert guard.lost_reason in (LostReason.DISCONNECTED, LostReason.CONNECTION_CLOSED)
    assert info(server, a) is None and info(server, b) is None


@pytest.mark.scenario("multi-all-or-nothing", "multi-wait", "multi-watchdog", "multi-lost",
                      "multi-release", "multi-reentry")
def test_async_multi_lock_grants_waits_renews_loses_and_releases(server, key):
    async def main() -> None:
        a, b = key + ":a", key + ":b"
        async with AsyncLockClient.from_url(server.url) as client:
            raw = server.client()
            assert raw.execute_command("LOCK.ACQUIRE", b, "other", 30000) > 0
            assert await client.multi_lock([a, b]).try_acquire() is None
            assert info(server, a) is None

            async def later() -> None:
                await asyncio.sleep(0.2)
                raw.execute_command("LOCK.RELEASE", b, "other")
            task = asyncio.create_task(later())
            calls = server.commandstat("lock.macquire")
            guard = await client.multi_lock([a, b], lease=0.6, wait_timeout=10).acquire()
            await task
            assert server.commandstat("lock.macquire") == calls + 1
            assert list(guard.tokens) == [a, b]
            assert info(server, a)[b"token"] == guard.tokens[a]
            assert info(server, b)[b"token"] == guard.tokens[b]

            mrenews = server.commandstat("lock.mrenew")
            await asyncio.sleep(2.0)  # more than three leases
            assert server.commandstat("lock.mrenew") - mrenews >= 4
            assert info(server, a)[b"owner"] == info(server, b)[b"owner"] == guard.owner

            raw.execute_command("LOCK.FORCERELEASE", a)
            await asyncio.wait_for(guard.lost.wait(), 1.0)
            assert guard.lost_reason is LostReason.FORCE_RELEASED
            with pytest.raises(NotHeld):
                await guard.release()
            assert info(server, b) is None

            lock = client.multi_lock([a, b])
            async with lock as outer:
                async with lock as inner:
                    assert inner.tokens == outer.tokens
                assert info(server, a) is not None
            assert info(server, a) is None and info(server, b) is None

            held = await client.lock(b).acquire()
            with pytest.raises(LockTimeout):
                await client.multi_lock([a, b], wait_timeout=0.2).acquire()
            assert info(server, a) is None and info(server, b)[b"waiters"] == 0
            await held.release()
    asyncio.run(main())


@pytest.mark.scenario("multi-ephemeral")
@pytest.mark.parametrize("signal", [True, False])
def test_async_ephemeral_multi_hold_ends_with_its_connection(server, key, signal):
    async def main() -> None:
        a, b = key + ":a", key + ":b"
        async with AsyncLockClient.from_url(server.url, lost_signal=signal) as client:
            guard = await client.multi_lock([a, b], ephemeral=True).acquire()
            server.client().execute_command("CLIENT", "KILL", "ID", info(server, b)[b"ephemeral"])
            await asyncio.wait_for(guard.lost.wait(), 1.0)
            assert info(server, a) is None and info(server, b) is None
    asyncio.run(main())


@pytest.mark.scenario("multi-lost")
def test_async_blocked_loop_reports_a_multi_key_hold_unreachable(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, lost_signal=False) as client:
            guard = await client.multi_lock([key + ":a", key + ":b"], lease=0.5).acquire()
            time.sleep(0.8)  # blocks the loop: the watchdog task cannot run
            await asyncio.wait_for(guard.lost.wait(), 0.5)
            assert guard.lost_reason is LostReason.UNREACHABLE
            with pytest.raises(NotHeld):
                await guard.release()
    asyncio.run(main())


def test_the_readmes_multi_key_example_runs(server):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Several keys at once", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    code = code.replace("redis://127.0.0.1:6379/", server.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    tokens = [int(t) for t in re.findall(r"\d+", out.getvalue())]
    assert len(tokens) == 2 and all(t > 0 for t in tokens)
    assert info(server, "{acct}:alice") is None and info(server, "{acct}:bob") is None
