"""A hold granted after a wait that ate most of its lease, or more than all of it: the server
holds it for a whole lease from the grant, so the library must report it held and renew it,
never lost at once (sync and asyncio; a lock, a multi-key lock, an election's campaign)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from conftest import Server, info
from redis_lock_client import AsyncLockClient, LockClient, Release

LEASE = 2.0  # long enough for a loaded machine's renewals; the waits are its multiples


def _hold_elsewhere(server: Server, keys: list[str], release_after: float) -> None:
    """Another owner holds `keys` and releases them `release_after` seconds from now."""
    raw = server.client()
    for k in keys:
        assert raw.execute_command("LOCK.ACQUIRE", k, "other", 60000) > 0

    def release() -> None:
        for k in keys:
            raw.execute_command("LOCK.RELEASE", k, "other")
    threading.Timer(release_after, release).start()


def _renewals(server: Server) -> int:
    return server.commandstat("lock.renew") + server.commandstat("lock.mrenew")


def _assert_held_for_two_leases(server: Server, keys: list[str], owner: bytes,
                                tokens: list[int], lost: Any, renews_before: int) -> None:
    """A lease and a half after the grant: never reported lost, still the server's, renewed."""
    end = time.monotonic() + 1.5 * LEASE
    while time.monotonic() < end:
        assert not lost.is_set(), "reported lost while the server holds it"
        time.sleep(0.02)
    for k, t in zip(keys, tokens):
        held = info(server, k)
        assert held is not None and held[b"owner"] == owner and held[b"token"] == t
    assert _renewals(server) - renews_before >= 2  # renewed every lease / 3


@pytest.mark.scenario("acquire-long-wait")
@pytest.mark.parametrize("waited", [0.7 * LEASE, 1.3 * LEASE])
def test_a_lock_granted_after_a_long_wait_is_held_and_renewed(server, client, key, waited):
    _hold_elsewhere(server, [key], waited)
    start = time.monotonic()
    before = _renewals(server)
    guard = client.lock(key, lease=LEASE, wait_timeout=30).acquire()
    assert time.monotonic() - start >= waited * 0.9
    renews = _renewals(server)
    assert renews > before  # the grant was confirmed by a renewal before acquire() returned
    _assert_held_for_two_leases(server, [key], guard.owner, [guard.token], guard.lost, renews)
    assert guard.release() is Release.RELEASED


@pytest.mark.scenario("acquire-long-wait")
def test_a_multi_key_lock_granted_after_a_long_wait_is_held_and_renewed(server, client, key):
    keys = [key + ":a", key + ":b"]
    _hold_elsewhere(server, keys[1:], 1.3 * LEASE)
    guard = client.multi_lock(keys, lease=LEASE, wait_timeout=30).acquire()
    renews = _renewals(server)
    _assert_held_for_two_leases(server, keys, guard.owner, list(guard.tokens.values()),
                                guard.lost, renews)
    assert guard.release() is Release.RELEASED


@pytest.mark.scenario("acquire-long-wait")
def test_a_campaign_elected_after_a_long_wait_leads_proclaims_and_resigns(server, client, key):
    _hold_elsewhere(server, [key], 1.3 * LEASE)
    leadership = client.election(key, lease=LEASE).campaign(timeout=30)
    renews = _renewals(server)
    assert leadership.proclaim("v1") is True
    _assert_held_for_two_leases(server, [key], leadership.candidate, [leadership.epoch],
                                leadership.lost, renews)
    assert leadership.resign() is Release.RELEASED


async def _async_held_for_two_leases(server: Server, keys: list[str], owner: bytes,
                                     tokens: list[int], lost: asyncio.Event,
                                     renews_before: int) -> None:
    end = time.monotonic() + 1.5 * LEASE
    while time.monotonic() < end:
        assert not lost.is_set(), "reported lost while the server holds it"
        await asyncio.sleep(0.02)
    for k, t in zip(keys, tokens):
        held = info(server, k)
        assert held is not None and held[b"owner"] == owner and held[b"token"] == t
    assert _renewals(server) - renews_before >= 2


@pytest.mark.scenario("acquire-long-wait")
@pytest.mark.parametrize("what", ["lock", "multi", "election"])
def test_async_a_hold_granted_after_a_long_wait_is_held_and_renewed(server, key, what):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            if what == "lock":
                _hold_elsewhere(server, [key], 1.3 * LEASE)
                guard = await client.lock(key, lease=LEASE, wait_timeout=30).acquire()
                keys, tokens, owner = [key], [guard.token], guard.owner
            elif what == "multi":
                keys = [key + ":a", key + ":b"]
                _hold_elsewhere(server, keys[1:], 1.3 * LEASE)
                guard = await client.multi_lock(keys, lease=LEASE, wait_timeout=30).acquire()
                tokens, owner = list(guard.tokens.values()), guard.owner
            else:
                _hold_elsewhere(server, [key], 1.3 * LEASE)
                guard = await client.election(key, lease=LEASE).campaign(timeout=30)
                keys, tokens, owner = [key], [guard.epoch], guard.candidate
                assert await guard.proclaim("v1") is True
            renews = _renewals(server)
            await _async_held_for_two_leases(server, keys, owner, tokens, guard.lost, renews)
            assert await guard.release() is Release.RELEASED
    asyncio.run(main())


@pytest.mark.scenario("acquire-long-wait")
def test_a_grant_after_a_short_wait_is_handed_out_without_a_confirmation(server, client, key):
    lease = 6.0
    _hold_elsewhere(server, [key], 0.2)  # well under lease / 3
    before = _renewals(server)
    guard = client.lock(key, lease=lease, wait_timeout=30).acquire()
    assert _renewals(server) == before  # the first renewal is due lease / 3 after the send
    assert guard.release() is Release.RELEASED


@pytest.mark.scenario("acquire-long-wait")
def test_a_fixed_lease_granted_after_a_long_wait_ends_a_lease_after_the_grant(server, key):
    # Nothing renews a fixed lease; its end is read from the server (LOCK.INFO's ttl), not
    # counted from the start of the wait.
    from redis_lock_client import LostReason, Renewal

    with LockClient.from_url(server.url) as client:
        _hold_elsewhere(server, [key], 1.3 * LEASE)
        renews = _renewals(server)
        reads = server.commandstat("lock.info")
        guard = client.lock(key, lease=LEASE, renewal=Renewal.FIXED, wait_timeout=30).acquire()
        granted = time.monotonic()
        assert server.commandstat("lock.info") == reads + 1  # its ttl, read once
        assert not guard.lost.wait(0.5 * LEASE), "reported lost while the server holds it"
        assert info(server, key)[b"token"] == guard.token
        assert guard.lost.wait(5 * LEASE)
        assert guard.lost_reason is LostReason.LEASE_ENDED
        assert time.monotonic() - granted >= 0.8 * LEASE
        assert _renewals(server) == renews  # a fixed lease is never renewed


@pytest.fixture
def debug_server(tmp_path):
    """A server of the test's own that takes DEBUG (here: DEBUG SLEEP)."""
    from conftest import start_server

    s = start_server(tmp_path, "--enable-debug-command", "yes")
    yield s
    s.proc.kill()
    s.proc.wait()


def _grant_then_sleep_past_its_lease(server: Server, key: str, lease: float) -> None:
    """Once the acquire waits: the other owner releases (the wait is granted) and the server
    sleeps past the grant's lease before it answers anyone, in one MULTI: the grant's reply
    reaches the library after the hold it names has ended."""
    raw = server.client()
    deadline = time.monotonic() + 5
    while not server.blocked_clients("lock.acquire"):
        assert time.monotonic() < deadline, "the acquire never waited"
        time.sleep(0.01)
    time.sleep(lease)  # the wait takes more than lease / 3: the grant needs a confirmation
    pipe = raw.pipeline(transaction=True)
    pipe.execute_command("LOCK.RELEASE", key, "other")
    pipe.execute_command("DEBUG", "SLEEP", lease * 2)
    pipe.execute()


@pytest.mark.scenario("acquire-long-wait")
def test_a_grant_gone_before_its_confirmation_is_not_handed_out(debug_server, key):
    # The confirmation answers 0: the acquire goes on as if not granted, and is granted again.
    server, lease = debug_server, 0.3
    # A blocking wait (a ticket's grant expires with its lease: never popped stale).
    with LockClient.from_url(server.url, lost_signal=False, wait_with_tickets=False) as client:
        assert server.client().execute_command("LOCK.ACQUIRE", key, "other", 60000) > 0
        acquires, renews = server.commandstat("lock.acquire"), _renewals(server)
        threading.Thread(target=_grant_then_sleep_past_its_lease,
                         args=(server, key, lease), daemon=True).start()
        guard = client.lock(key, lease=lease, wait_timeout=30).acquire()
        held = info(server, key)
        assert held is not None and held[b"owner"] == guard.owner and held[b"token"] == guard.token
        assert not guard.lost.is_set()
        assert server.commandstat("lock.acquire") == acquires + 2  # the wait, then once more
        assert _renewals(server) >= renews + 1  # the confirmation, answered 0
        assert guard.release() is Release.RELEASED


@pytest.mark.scenario("acquire-long-wait")
def test_async_a_grant_gone_before_its_confirmation_is_not_handed_out(debug_server, key):
    server, lease = debug_server, 0.3

    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, lost_signal=False,
                                            wait_with_tickets=False) as client:
            assert server.client().execute_command("LOCK.ACQUIRE", key, "other", 60000) > 0
            acquires = server.commandstat("lock.acquire")
            threading.Thread(target=_grant_then_sleep_past_its_lease,
                             args=(server, key, lease), daemon=True).start()
            guard = await client.lock(key, lease=lease, wait_timeout=30).acquire()
            held = info(server, key)
            assert held is not None and held[b"token"] == guard.token
            assert not guard.lost.is_set()
            assert server.commandstat("lock.acquire") == acquires + 2
            assert await guard.release() is Release.RELEASED
    asyncio.run(main())
