"""What the public calls answer, and when, sync and asyncio, against a real server with the
module (see conftest.py): here, the calls on an EPHEMERAL hold whose connection closed, and
asyncio calls the server does not answer in time."""

from __future__ import annotations

import asyncio

import pytest

from conftest import Server, info
from redis_lock_client import (
    AsyncLockClient,
    LockClient,
    LockConnectionError,
    LostReason,
    NotHeld,
    Release,
)

CLOSED = (LostReason.CONNECTION_CLOSED, LostReason.DISCONNECTED)
SIGNAL = [True, False]
SIGNAL_IDS = ["signal", "no-signal"]


def kill_ephemeral(server: Server, key: str) -> None:
    """``CLIENT KILL ID`` of the connection the EPHEMERAL hold on ``key`` is bound to, from
    another client: the server ends the hold with it."""
    found = info(server, key)
    assert found is not None
    assert server.client().execute_command("CLIENT", "KILL", "ID", found[b"ephemeral"]) == 1


# -- An EPHEMERAL hold whose connection closed before the call -------------------------------
#
# Each ran the call on the dead connection and raised LockConnectionError ("Connection closed by
# server"), or, once that connection was closed by this side, LockConnectionError("the
# EPHEMERAL hold's connection is closed"); a worker written as the README shows crashed. Now
# nothing is sent: the call waits for a read that finds the hold gone (one round trip; the
# server ended it with its connection) and answers as for any lost hold. Four rounds each,
# with and without the lost-hold signal (whose message may report the loss first).


@pytest.mark.scenario("ephemeral-closed-call")
@pytest.mark.parametrize("lost_signal", SIGNAL, ids=SIGNAL_IDS)
def test_execute_after_the_ephemeral_connection_closed_raises_not_held(server, key, lost_signal):
    """Row ``execute``: NotHeld (CONNECTION_CLOSED or DISCONNECTED), nothing ran."""
    raw = server.client()
    with LockClient.from_url(server.url, lost_signal=lost_signal) as client:
        for _ in range(4):
            guard = client.lock(key, ephemeral=True).acquire()
            kill_ephemeral(server, key)
            with pytest.raises(NotHeld) as caught:
                guard.execute("SET", "{" + key + "}:v", "late")
            assert caught.value.reason in CLOSED
            assert guard.lost_reason in CLOSED
            assert raw.get("{" + key + "}:v") is None
            with pytest.raises(NotHeld):
                guard.release()


@pytest.mark.scenario("ephemeral-closed-call")
@pytest.mark.parametrize("lost_signal", SIGNAL, ids=SIGNAL_IDS)
def test_proclaim_after_the_ephemeral_connection_closed_answers_false(server, key, lost_signal):
    """Row ``proclaim``: False (the leadership is over), reported lost."""
    with LockClient.from_url(server.url, lost_signal=lost_signal) as client:
        for _ in range(4):
            leadership = client.election(key).campaign()
            kill_ephemeral(server, key)
            assert leadership.proclaim("late") is False
            assert leadership.lost_reason in CLOSED
            assert server.client().execute_command("LOCK.LEADER", key) is None


@pytest.mark.scenario("ephemeral-closed-call")
@pytest.mark.parametrize("lost_signal", SIGNAL, ids=SIGNAL_IDS)
def test_a_leaders_execute_after_the_ephemeral_connection_closed_raises_not_held(
        server, key, lost_signal):
    """Row ``leadership.execute``: as ``execute``; also after a failed proclaim closed it."""
    raw = server.client()
    with LockClient.from_url(server.url, lost_signal=lost_signal) as client:
        for _ in range(4):
            leadership = client.election(key).campaign()
            kill_ephemeral(server, key)
            with pytest.raises(NotHeld) as caught:
                leadership.execute("SET", "{" + key + "}:v", "late")
            assert caught.value.reason in CLOSED
            assert raw.get("{" + key + "}:v") is None


@pytest.mark.scenario("ephemeral-closed-call")
@pytest.mark.parametrize("lost_signal", SIGNAL, ids=SIGNAL_IDS)
def test_async_calls_after_the_ephemeral_connection_closed(server, key, lost_signal):
    """Rows ``execute``, ``proclaim``, ``leadership.execute``, asyncio: NotHeld, False, NotHeld
    (the event loop has not read the server's close yet when the call is made)."""
    raw = server.client()

    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, lost_signal=lost_signal) as client:
            for _ in range(4):
                guard = await client.lock(key, ephemeral=True).acquire()
                kill_ephemeral(server, key)
                with pytest.raises(NotHeld) as caught:
                    await guard.execute("SET", "{" + key + "}:v", "late")
                assert caught.value.reason in CLOSED
                with pytest.raises(NotHeld):
                    await guard.release()
                leadership = await client.election(key).campaign()
                kill_ephemeral(server, key)
                assert await leadership.proclaim("late") is False
                with pytest.raises(NotHeld) as caught:
                    await leadership.execute("SET", "{" + key + "}:v", "late")
                assert caught.value.reason in CLOSED
                leadership = await client.election(key).campaign()
                kill_ephemeral(server, key)
                with pytest.raises(NotHeld):
                    await leadership.execute("SET", "{" + key + "}:v", "late")
            assert raw.get("{" + key + "}:v") is None

    asyncio.run(main())


def test_async_a_command_that_times_out_raises_and_leaves_no_reply_behind(server, key):
    """Rows ``leader()``, ``try_acquire()`` (no answer), asyncio. redis.asyncio answers None to
    a read whose timeout passed and keeps the connection with the reply still on its way:
    ``leader()`` on a server that did not answer in time said nobody leads while a leader led,
    ``try_acquire()`` said the key was busy, and the next command on that pooled connection
    read the late reply of the one before. Now: LockConnectionError, the connection closed."""
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, command_timeout=0.3) as client:
            leadership = await client.election(key).campaign()
            assert await client.election(key).leader() is not None  # a pooled connection
            with server.stopped():
                with pytest.raises(LockConnectionError):
                    await client.election(key).leader()
                with pytest.raises(LockConnectionError):
                    await client.lock(key + ":free").try_acquire()
            found = await client.election(key).leader()
            assert found is not None and found.epoch == leadership.epoch
            guard = await client.lock(key + ":free").try_acquire()
            assert guard is not None
            assert await guard.release() is Release.RELEASED
            assert await leadership.resign() is Release.RELEASED

    asyncio.run(main())
