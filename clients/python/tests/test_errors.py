"""What each public call answers, and when: one test per row of the README's "Errors" table
(the row is named in each test's docstring), sync and asyncio, against a real server with the
module (see conftest.py). Rows whose outcome other files test in depth name those tests too.
Every error is one of the library's documented types: none of redis-py's own escapes."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from conftest import Server, info, wait_until
from redis_lock_client import (
    AsyncLockClient,
    Fenced,
    LockClient,
    LockConnectionError,
    LockGuard,
    LockServerError,
    LockTimeout,
    LostReason,
    NotHeld,
    NotSafelyAcquired,
    Release,
)

CLOSED = (LostReason.CONNECTION_CLOSED, LostReason.DISCONNECTED)
SIGNAL = [True, False]
SIGNAL_IDS = ["signal", "no-signal"]


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


# -- One test per row of the README's table, in its order ------------------------------------


def test_row_acquire(server, client, key):
    """Row ``acquire()``: a guard; LockTimeout, LockServerError, NotSafelyAcquired,
    LockConnectionError (NoPermission: test_acl.py,
    test_the_old_documented_line_is_refused_by_name_at_the_first_acquire; a lost-hold channel
    refused: test_acl.py, test_a_refused_lost_signal_channel_fails_the_acquire_at_once_naming_the_rule)."""
    raw = server.client()
    guard = client.lock(key).acquire()
    assert guard.token > 0
    with pytest.raises(LockTimeout):
        client.lock(key, wait_timeout=0.2).acquire()
    raw.set(key + ":string", "x")
    with pytest.raises(LockServerError, match="^WRONGTYPE"):
        client.lock(key + ":string").acquire()
    with pytest.raises(NotSafelyAcquired):  # no replica at all
        client.lock(key + ":r", replicas=1, replicas_timeout=0.1).acquire()
    assert info(server, key + ":r") is None  # released, not handed out
    guard.release()
    with LockClient.from_url(f"redis://127.0.0.1:{dead_port()}/") as dead:
        with pytest.raises(LockConnectionError):
            dead.lock(key).acquire()


def test_row_try_acquire(server, client, key):
    """Row ``try_acquire()``: a guard, or None while busy; the errors of acquire() but
    LockTimeout."""
    guard = client.lock(key).try_acquire()
    assert guard is not None
    assert client.lock(key).try_acquire() is None
    guard.release()
    server.client().set(key + ":string", "x")
    with pytest.raises(LockServerError):
        client.lock(key + ":string").try_acquire()
    with LockClient.from_url(f"redis://127.0.0.1:{dead_port()}/") as dead:
        with pytest.raises(LockConnectionError):
            dead.lock(key).try_acquire()


def test_row_release(server, key):
    """Row ``release()``: RELEASED, STILL_HELD, ALREADY_RELEASED; NotHeld with the reason after
    a loss, NotHeld(None) when the server no longer had it, LockConnectionError with no answer
    (NoPermission: test_acl.py, test_a_refused_check_is_a_permission_error_naming_lock_check_not_a_loss;
    an EPHEMERAL hold whose connection closed: test_lost.py,
    test_releasing_an_ephemeral_hold_whose_connection_closed_asks_the_server)."""
    raw = server.client()
    with LockClient.from_url(server.url, lost_signal=False, command_timeout=0.3) as client:
        lock = client.lock(key)
        first, second = lock.acquire(), lock.acquire()
        assert second.release() is Release.STILL_HELD
        assert first.release() is Release.RELEASED
        assert first.release() is Release.ALREADY_RELEASED
        guard = lock.acquire()
        raw.execute_command("LOCK.FORCERELEASE", key)
        with pytest.raises(NotHeld) as caught:  # nothing told the library: the server answered
            guard.release()
        assert caught.value.reason is None
        guard = lock.acquire()
        raw.execute_command("LOCK.FORCERELEASE", key)
        with pytest.raises(Fenced):
            guard.execute("GET", "{" + key + "}:v")
        with pytest.raises(NotHeld) as caught:
            guard.release()
        assert caught.value.reason is LostReason.HOLD_GONE
        guard = lock.acquire()
        with server.stopped():
            with pytest.raises(LockConnectionError):
                guard.release()
        wait_until(lambda: info(server, key) is None, "released in the background")


def test_row_renewal(server, key):
    """Row renewal: no call raises; a renewal answered 0 reports the hold lost."""
    with LockClient.from_url(server.url, lost_signal=False) as client:
        guard = client.lock(key, lease=0.6).acquire()
        server.client().execute_command("LOCK.FORCERELEASE", key)
        assert guard.lost.wait(3.0)  # the next renewal, 0.2 s on
        assert guard.lost_reason is LostReason.HOLD_GONE


def test_row_execute(server, key):
    """Row ``guard.execute``: the reply; Fenced, NotHeld, LockServerError, LockConnectionError
    (NoPermission: test_fenced.py, test_a_user_who_may_not_set_may_not_set_through_the_fence;
    EPHEMERAL closed: the tests above)."""
    raw = server.client()
    data = "{" + key + "}:v"
    with LockClient.from_url(server.url, lost_signal=False, command_timeout=0.3) as client:
        guard = client.lock(key).acquire()
        assert guard.execute("SET", data, "1") == b"OK"
        with pytest.raises(LockServerError, match="^WRONGTYPE"):
            guard.execute("LPUSH", data, "x")
        assert guard.lost_reason is None  # the command's own error is no loss
        with server.stopped():
            with pytest.raises(LockConnectionError):
                guard.execute("SET", data, "2")
        raw.execute_command("LOCK.FORCERELEASE", key)
        with pytest.raises(Fenced) as fenced:
            guard.execute("SET", data, "3")
        assert fenced.value.reason is LostReason.HOLD_GONE
        assert guard.lost_reason is LostReason.HOLD_GONE
        with pytest.raises(NotHeld):  # lost before: nothing sent
            guard.execute("SET", data, "4")
        released = client.lock(key).acquire()
        released.release()
        with pytest.raises(NotHeld):
            released.execute("SET", data, "5")
        assert raw.get(data) in (b"1", b"2")


def test_row_lost(server, client, key):
    """Row ``lost``, ``lost_reason``: never raise, before or after a loss or a release."""
    guard = client.lock(key).acquire()
    assert not guard.lost.is_set() and guard.lost_reason is None
    server.client().execute_command("LOCK.FORCERELEASE", key)
    assert guard.lost.wait(2.0)
    assert guard.lost_reason is LostReason.FORCE_RELEASED
    with pytest.raises(NotHeld):
        guard.release()
    assert guard.lost_reason is LostReason.FORCE_RELEASED


def test_row_multi_key(server, client, key):
    """Row ``multi_lock``: TypeError / ValueError before anything is sent; release() raises
    NotHeld when a key was lost and frees the others."""
    with pytest.raises(TypeError):
        client.multi_lock(key)  # type: ignore[arg-type]
    for keys in ([], [key, key], [f"{key}:{i}" for i in range(65)]):
        with pytest.raises(ValueError):
            client.multi_lock(keys)
    a, b = "{" + key + "}:a", "{" + key + "}:b"
    guard = client.multi_lock([a, b]).acquire()
    with pytest.raises(ValueError):
        guard.execute("{" + key + "}:c", "GET", "{" + key + "}:x")
    server.client().execute_command("LOCK.FORCERELEASE", a)
    assert guard.lost.wait(2.0)
    with pytest.raises(NotHeld):
        guard.release()
    assert info(server, b) is None


def test_row_semaphore(server, client, key):
    """Row ``semaphore``: ValueError outside 1 to 1,000; another limit: LockServerError."""
    for n in (0, 1001):
        with pytest.raises(ValueError):
            client.semaphore(key, n)
    guard = client.semaphore(key, 2).acquire()
    with pytest.raises(LockServerError, match="LIMIT 2"):
        client.semaphore(key, 3).acquire()
    guard.release()


def test_row_campaign(server, client, key):
    """Row ``campaign()``: a Leadership; LockTimeout, ValueError, and acquire()'s errors."""
    leadership = client.election(key).campaign()
    with pytest.raises(LockTimeout):
        client.election(key).campaign(timeout=0.2)
    with pytest.raises(ValueError):
        client.election(key).campaign(timeout=-1)
    leadership.resign()
    with LockClient.from_url(f"redis://127.0.0.1:{dead_port()}/") as dead:
        with pytest.raises(LockConnectionError):
            dead.election(key).campaign(timeout=0)


def test_row_proclaim(server, client, key):
    """Row ``proclaim()``: True; False once over; LockServerError for a value too long; no
    answer: LockConnectionError (EPHEMERAL closed: False, the tests above)."""
    with LockClient.from_url(server.url, command_timeout=0.3) as short:
        leadership = short.election(key, ephemeral=False).campaign()
        assert leadership.proclaim("v") is True
        with pytest.raises(LockServerError, match="4096"):
            leadership.proclaim("x" * 5000)
        with server.stopped():
            with pytest.raises(LockConnectionError):
                leadership.proclaim("w")
        leadership.resign()
        assert leadership.proclaim("v") is False


def test_row_resign(server, client, key):
    """Row ``resign()``: as release()."""
    leadership = client.election(key).campaign()
    assert leadership.resign() is Release.RELEASED
    assert leadership.resign() is Release.ALREADY_RELEASED
    leadership = client.election(key).campaign()
    server.client().execute_command("LOCK.FORCERELEASE", key)
    assert leadership.lost.wait(2.0)
    with pytest.raises(NotHeld):
        leadership.resign()


def test_row_leadership_execute(server, key):
    """Row ``leadership.execute``: as guard.execute."""
    with LockClient.from_url(server.url, lost_signal=False) as client:
        leadership = client.election(key).campaign()
        assert leadership.execute("SET", "{" + key + "}:v", "1") == b"OK"
        server.client().execute_command("LOCK.FORCERELEASE", key)
        with pytest.raises(Fenced):
            leadership.execute("SET", "{" + key + "}:v", "2")
        assert leadership.lost_reason is LostReason.HOLD_GONE


def test_row_leader(server, client, key):
    """Row ``leader()``: a Leader or None; no answer: LockConnectionError."""
    election = client.election(key)
    assert election.leader() is None
    leadership = election.campaign("v")
    found = election.leader()
    assert found is not None and found.epoch == leadership.epoch and found.value == b"v"
    leadership.resign()
    with LockClient.from_url(f"redis://127.0.0.1:{dead_port()}/") as dead:
        with pytest.raises(LockConnectionError):
            dead.election(key).leader()


def test_row_observe(server, client, key):
    """Row ``observe()``: raises nothing; a killed connection is connected again (in depth:
    test_election.py, test_an_observer_reads_the_leader_again_when_it_reconnects)."""
    election = client.election(key)
    with election.observe() as observer:
        leadership = election.campaign()
        first = next(observer)
        assert first.epoch == leadership.epoch
        server.client().execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        leadership.proclaim("after")
        seen = next(observer)
        assert seen.epoch == leadership.epoch and seen.value == b"after"
        leadership.resign()


def test_async_rows_raise_the_same_types(server, key):
    """Every row, asyncio: the same answers and types for the calls that reach the server."""
    raw = server.client()

    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, lost_signal=False,
                                            command_timeout=0.3) as client:
            guard = await client.lock(key).acquire()
            with pytest.raises(LockTimeout):
                await client.lock(key, wait_timeout=0.2).acquire()
            assert await client.lock(key).try_acquire() is None
            raw.set("{" + key + "}:v", "s")
            with pytest.raises(LockServerError):
                await guard.execute("LPUSH", "{" + key + "}:v", "x")
            raw.execute_command("LOCK.FORCERELEASE", key)
            with pytest.raises(Fenced):
                await guard.execute("GET", "{" + key + "}:v")
            with pytest.raises(NotHeld):
                await guard.release()
            leadership = await client.election(key + ":e", ephemeral=False).campaign()
            assert await leadership.proclaim("v") is True
            with server.stopped():
                with pytest.raises(LockConnectionError):
                    await leadership.proclaim("w")
            assert await leadership.resign() is Release.RELEASED
            assert await leadership.proclaim("v") is False
            assert await client.election(key + ":e").leader() is None
        async with AsyncLockClient.from_url(f"redis://127.0.0.1:{dead_port()}/") as dead:
            with pytest.raises(LockConnectionError):
                await dead.lock(key).acquire()

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


def test_a_client_closed_while_a_command_connects_lets_no_redis_py_error_escape(fresh_server, key):
    """A call whose pooled connection is still in its handshake (a server that pauses every
    command) when ``close()`` comes from another thread loses that connection as any other:
    nothing was sent, so the acquire is sent again and granted once the pause ends (or, out of
    time, raises LockConnectionError). Before, redis-py's error for a read of a socket closed
    under it (ValueError, "I/O operation on closed file") escaped: found killing the lost-hold
    listener's thread, whose check of a message was connecting when its client closed."""
    from redis_lock_client._sync._backend import pool_in_use

    client = LockClient(fresh_server.client(), lost_signal=False)
    fresh_server.client().execute_command("CLIENT", "PAUSE", 3000, "ALL")
    outcome: list[object] = []

    def acquire() -> None:
        try:
            outcome.append(client.lock(key, wait_timeout=0).acquire())
        except BaseException as e:  # noqa: BLE001 - asserted on
            outcome.append(e)

    thread = threading.Thread(target=acquire)
    thread.start()
    pool = client._single.commands.pool  # type: ignore[union-attr]
    wait_until(lambda: any(getattr(c, "_sock", None) is not None for c in pool_in_use(pool)),
               "the command's connection is open, in its handshake")
    client.close()
    thread.join(10)
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], (LockGuard, LockConnectionError)), outcome
    if isinstance(outcome[0], LockGuard):
        assert outcome[0].release() is Release.RELEASED
