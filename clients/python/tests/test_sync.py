"""The sync library against a real server with the module (see conftest.py)."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from conftest import Server, info
from redis_lock_client import (
    LockClient,
    LockConnectionError,
    LockTimeout,
    LostReason,
    NotHeld,
    Release,
)

REDISSON_LOCK = (
    "if (redis.call('exists', KEYS[1]) == 0) then "
    "redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
    "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then "
    "redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
    "return redis.call('pttl', KEYS[1]);"
)  # testkit/src/lock.rs REDISSON_LOCK


@pytest.mark.scenario("acquire-try")
def test_try_acquire_answers_none_when_busy_and_acquire_takes_a_free_key(server, client, key):
    guard = client.lock(key).acquire()
    assert guard.token > 0
    assert info(server, key)[b"owner"] == guard.owner
    assert client.lock(key).try_acquire() is None
    assert guard.release() is Release.RELEASED
    assert info(server, key) is None


@pytest.mark.scenario("acquire-wait")
def test_acquire_waits_in_the_server_and_is_granted_on_release(client, key):
    held = client.lock(key).acquire()
    threading.Timer(0.3, held.release).start()
    start = time.monotonic()
    guard = client.lock(key, wait_timeout=5).acquire()
    assert 0.25 < time.monotonic() - start < 2
    assert guard.token > held.token
    guard.release()


@pytest.mark.scenario("acquire-timeout")
def test_acquire_raises_lock_timeout_when_the_wait_passes(client, key):
    held = client.lock(key).acquire()
    start = time.monotonic()
    with pytest.raises(LockTimeout):
        client.lock(key, wait_timeout=0.3).acquire()
    # The server counts the wait on its millisecond clock: up to 1 ms early on ours.
    assert 0.298 <= time.monotonic() - start < 2
    held.release()


@pytest.mark.scenario("reentry", "release-idempotent")
def test_reentry_is_per_handle_counted_in_the_client_and_release_is_idempotent(server, client, key):
    lock = client.lock(key)
    first = lock.acquire()
    second = lock.acquire()
    assert second.token == first.token
    assert info(server, key)[b"count"] == 1  # ONCE: the server sees one hold
    assert client.lock(key).try_acquire() is None  # another handle is another owner
    assert first.release() is Release.STILL_HELD
    assert info(server, key)[b"owner"] == lock.owner
    assert second.release() is Release.RELEASED
    assert second.release() is Release.ALREADY_RELEASED
    assert first.release() is Release.ALREADY_RELEASED
    assert info(server, key) is None


@pytest.mark.scenario("reentry")
def test_with_block_releases_and_nests(server, client, key):
    lock = client.lock(key)
    with lock as outer:
        with lock as inner:
            assert inner.token == outer.token
        assert info(server, key) is not None
    assert info(server, key) is None


@pytest.mark.scenario("read-write")
def test_read_locks_share_and_exclude_the_writer(client, key):
    r1 = client.read_lock(key).acquire()
    r2 = client.read_lock(key).acquire()
    writer = client.lock(key)
    assert writer.try_acquire() is None
    r1.release()
    r2.release()
    w = writer.try_acquire()
    assert w is not None
    assert client.read_lock(key).try_acquire() is None
    w.release()


@pytest.mark.scenario("semaphore")
def test_semaphore_grants_limit_permits(client, key):
    a = client.semaphore(key, 2).acquire()
    b = client.semaphore(key, 2).acquire()
    assert client.semaphore(key, 2).try_acquire() is None
    a.release()
    c = client.semaphore(key, 2).try_acquire()
    assert c is not None
    b.release()
    c.release()


@pytest.mark.scenario("watchdog")
def test_watchdog_renews_across_leases_while_the_main_thread_spins_in_python(server, client, key):
    # A lease of 1.5 s: at 0.6 s, four test processes on two busy cores starved the process
    # past the hold's deadline once (UNREACHABLE), the spinning main thread aside.
    guard = client.lock(key, lease=1.5).acquire()
    before = server.commandstat("lock.renew")
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < 4.5:  # 3 leases of pure Python holding the GIL
        n += 1
    renewals = server.commandstat("lock.renew") - before
    print(f"\nwatchdog under a busy GIL: {renewals} renewals in 4.5 s at lease 1.5 s "
          f"(interval 0.5 s, so 9 expected); main loop ran {n} iterations")
    # At 0.6 s: 14 of 15 renewals, 14 ms late each on average (debug build, two busy cores).
    # The bound allows 250 ms late each (6 renewals), 18x that; the loss check below is the
    # correctness one.
    assert renewals >= 6
    assert not guard.lost.is_set()
    assert info(server, key)[b"owner"] == guard.owner
    guard.release()


@pytest.mark.scenario("no-renewal-after-release")
def test_nothing_renews_after_release(server, client, key):
    guard = client.lock(key, lease=0.3).acquire()
    time.sleep(0.5)
    guard.release()
    after = server.commandstat("lock.renew")
    time.sleep(0.6)
    assert server.commandstat("lock.renew") == after


@pytest.mark.scenario("lost-forcereleased")
def test_force_release_is_reported_by_the_signal_within_100_ms(server, client, key):
    seen: list[LostReason] = []
    guard = client.lock(key, on_lost=seen.append).acquire()  # lease 30 s: no renewal soon
    start = time.monotonic()
    server.client().execute_command("LOCK.FORCERELEASE", key)
    assert guard.lost.wait(0.1)
    elapsed = time.monotonic() - start
    print(f"\nlost signal: reported {elapsed * 1000:.1f} ms after LOCK.FORCERELEASE")
    assert guard.lost_reason is LostReason.FORCE_RELEASED
    deadline = time.monotonic() + 1  # the callback runs just after the event is set
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [LostReason.FORCE_RELEASED]
    with pytest.raises(NotHeld) as e:
        guard.release()
    assert e.value.reason is LostReason.FORCE_RELEASED
    assert guard.release() is Release.ALREADY_RELEASED


@pytest.mark.scenario("lost-hold-gone")
def test_force_release_is_reported_by_the_watchdog_without_the_signal(server, key):
    client = LockClient.from_url(server.url, lost_signal=False)
    guard = client.lock(key, lease=0.6).acquire()
    server.client().execute_command("LOCK.FORCERELEASE", key)
    assert guard.lost.wait(1.0)
    assert guard.lost_reason is LostReason.HOLD_GONE
    client.close()


@pytest.mark.scenario("lost-exit-raises")
def test_with_block_raises_not_held_when_the_hold_was_lost_inside(server, client, key):
    with pytest.raises(NotHeld):
        with client.lock(key) as guard:
            server.client().execute_command("LOCK.FORCERELEASE", key)
            assert guard.lost.wait(1.0)


@pytest.mark.scenario("ephemeral-owned-connection", "lost-disconnected")
def test_ephemeral_hold_lives_on_its_own_connection_and_ends_with_it(server, client, key):
    guard = client.lock(key, ephemeral=True, lease=30).acquire()
    conn_id = info(server, key)[b"ephemeral"]
    assert isinstance(conn_id, int)
    server.client().execute_command("CLIENT", "KILL", "ID", conn_id)
    assert guard.lost.wait(1.0)
    assert guard.lost_reason in (LostReason.DISCONNECTED, LostReason.CONNECTION_CLOSED)
    other = client.lock(key).try_acquire()  # the server ended it at once
    assert other is not None
    other.release()


@pytest.mark.scenario("ephemeral-owned-connection", "lost-disconnected")
def test_ephemeral_close_is_seen_without_the_signal(server, key):
    client = LockClient.from_url(server.url, lost_signal=False)
    guard = client.lock(key, ephemeral=True, lease=30).acquire()
    server.client().execute_command("CLIENT", "KILL", "ID", info(server, key)[b"ephemeral"])
    assert guard.lost.wait(1.0)  # the watchdog looks at the connection every 100 ms
    assert guard.lost_reason is LostReason.CONNECTION_CLOSED
    client.close()


def _child_after_fork(guard, lock, q) -> None:  # runs in the forked child
    try:
        reason = guard.lost_reason
        try:
            guard.release()
            released = "released"
        except NotHeld as e:
            released = f"NotHeld {e.reason}"
        time.sleep(1.0)  # a lease and more: nothing here renews
        q.put((reason, guard.lost.is_set(), released, lock.try_acquire() is None))
    except Exception as e:  # noqa: BLE001
        q.put(repr(e))


@pytest.mark.scenario("lost-forked")
def test_a_forked_child_neither_renews_nor_releases_its_parents_hold(server, client, key):
    lock = client.lock(key, lease=0.6)
    guard = lock.acquire()
    renews, releases = server.commandstat("lock.renew"), server.commandstat("lock.release")
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_child_after_fork, args=(guard, lock, q))
    child.start()
    result = q.get(timeout=10)
    child.join(10)
    # In the child: lost (FORKED), its release sent nothing, and the copied handle is a new
    # owner there: its acquire is refused (the parent holds the key), not a re-entry.
    assert result == (LostReason.FORKED, True, "NotHeld LostReason.FORKED", True)
    assert server.commandstat("lock.release") == releases
    assert not guard.lost.is_set()
    assert info(server, key)[b"owner"] == guard.owner
    # Renewals over that second came from the parent's watchdog only (about 5 at 0.2 s).
    assert 3 <= server.commandstat("lock.renew") - renews <= 8
    guard.release()


@pytest.mark.scenario("lost-forked")
def test_os_fork_child_has_no_watchdog_and_its_copies_are_lost(server, client, key):
    guard = client.lock(key, lease=0.6).acquire()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = guard.lost_reason is LostReason.FORKED and guard.lost.is_set()
        try:
            guard.release()
            ok = False
        except NotHeld:
            pass
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(r)
    time.sleep(0.7)
    assert not guard.lost.is_set()
    assert guard.release() is Release.RELEASED


@pytest.mark.scenario("interop-raw", "interop-redisson")
def test_a_python_hold_blocks_raw_lock_acquire_and_redissons_script(server, client, key):
    guard = client.lock(key).acquire()
    raw = server.client()
    assert raw.execute_command("LOCK.ACQUIRE", key, "other", 30000) is None
    assert raw.eval(REDISSON_LOCK, 1, key, 30000, "redisson-uuid:1") > 0  # busy: its pttl
    guard.release()
    assert raw.eval(REDISSON_LOCK, 1, key, 30000, "redisson-uuid:1") is None  # acquired


@pytest.mark.scenario("interop-raw", "interop-redisson")
def test_raw_and_redisson_holds_block_the_python_library(server, client, key):
    raw = server.client()
    assert raw.execute_command("LOCK.ACQUIRE", key, "other", 30000) > 0
    assert client.lock(key).try_acquire() is None
    raw.execute_command("LOCK.RELEASE", key, "other")
    assert raw.eval(REDISSON_LOCK, 1, key, 30000, "redisson-uuid:1") is None
    assert client.lock(key).try_acquire() is None
    assert client.lock(key, wait_timeout=0.2).try_acquire() is None
    raw.delete(key)
    guard = client.lock(key).try_acquire()
    assert guard is not None
    guard.release()



@pytest.mark.scenario("wait-own-connection")
def test_a_wait_does_not_hold_up_the_clients_other_commands(server, client, key):
    held = client.lock(key).acquire()
    got: list[object] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.lock(key, wait_timeout=5).acquire()), daemon=True)
    waiter.start()
    deadline = time.monotonic() + 2
    while info(server, key)[b"waiters"] != 1:  # the wait is queued in the server
        assert time.monotonic() < deadline
        time.sleep(0.01)
    start = time.monotonic()
    other = client.lock(key + ":other").acquire()  # the same client, meanwhile
    assert other.release() is Release.RELEASED
    assert time.monotonic() - start < 1.0  # not behind the 5 s wait
    held.release()
    waiter.join(5)
    assert len(got) == 1
    got[0].release()  # type: ignore[attr-defined]


def next_waiter(server: Server, seen: set[str]) -> dict[str, str]:
    """The connection blocked in LOCK.ACQUIRE that is not one of `seen` (bounded wait)."""
    deadline = time.monotonic() + 5
    while True:
        found = [c for c in server.blocked_clients("lock.acquire") if c["id"] not in seen]
        if found:
            seen.add(found[0]["id"])
            return found[0]
        assert time.monotonic() < deadline, "no new acquire waits in the server"
        time.sleep(0.01)


def in_thread(fn):
    """Runs fn on a thread; the returned list gets its result or its exception."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - handed to the test
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.fixture
def blocking(server):
    """A client whose waits block, each on a connection of its own (``wait_with_tickets=False``;
    test_tickets.py kills the connections of ticket waits)."""
    c = LockClient.from_url(server.url, wait_with_tickets=False)
    yield c
    c.close()


def test_a_wait_whose_connection_is_killed_is_sent_again_twice_and_then_granted(server, blocking, key):
    client = blocking
    # Each send is seen waiting on a connection of its own (CLIENT LIST): Redis >= 8 and Valkey
    # count a blocked call in commandstats only once it is answered, not when it is killed.
    raw = server.client()
    assert raw.execute_command("LOCK.ACQUIRE", key, "other", 30000) > 0
    lock = client.lock(key, wait_timeout=10)
    t, out = in_thread(lock.acquire)
    seen: set[str] = set()
    for _ in range(2):  # the wait and its first retry: each killed while it waits
        raw.execute_command("CLIENT", "KILL", "ID", next_waiter(server, seen)["id"])
    next_waiter(server, seen)  # the second retry waits, on a connection of its own again
    raw.execute_command("LOCK.RELEASE", key, "other")
    t.join(5)
    assert len(out) == 1 and not isinstance(out[0], Exception), out
    guard = out[0]
    assert len(seen) == 3
    held = info(server, key)
    assert held[b"owner"] == lock.owner and held[b"token"] == guard.token  # type: ignore[attr-defined]
    assert held[b"count"] == 1
    assert guard.release() is Release.RELEASED  # type: ignore[attr-defined]


def test_a_wait_whose_connection_is_killed_three_times_raises_after_two_retries(server, blocking, key):
    client = blocking
    raw = server.client()
    assert raw.execute_command("LOCK.ACQUIRE", key, "other", 30000) > 0
    t, out = in_thread(client.lock(key, wait_timeout=10).acquire)
    seen: set[str] = set()
    for _ in range(3):
        raw.execute_command("CLIENT", "KILL", "ID", next_waiter(server, seen)["id"])
    t.join(5)
    assert len(out) == 1 and isinstance(out[0], LockConnectionError), out
    time.sleep(0.2)  # a fourth send would be waiting by now
    assert server.blocked_clients("lock.acquire") == []
    assert info(server, key)[b"waiters"] == 0
    raw.execute_command("LOCK.RELEASE", key, "other")


def test_an_ephemeral_wait_whose_connection_is_killed_is_not_sent_again(server, blocking, key):
    # Its connection would have been the hold's: the library raises rather than re-send (with
    # tickets: test_tickets.py, an EPHEMERAL ticket wait whose connection is killed).
    client = blocking
    raw = server.client()
    assert raw.execute_command("LOCK.ACQUIRE", key, "other", 30000) > 0
    t, out = in_thread(client.lock(key, wait_timeout=10, ephemeral=True).acquire)
    raw.execute_command("CLIENT", "KILL", "ID", next_waiter(server, set())["id"])
    t.join(5)
    assert len(out) == 1 and isinstance(out[0], LockConnectionError), out
    time.sleep(0.2)  # a second send would be waiting by now
    assert server.blocked_clients("lock.acquire") == []
    raw.execute_command("LOCK.RELEASE", key, "other")


def test_an_acquire_answered_after_its_first_send_timed_out_holds_once(fresh_server, key):
    # The server is stopped across the first send's timeout (0.5 s) and runs again before the
    # third send's would end (1.5 s). The library gave up on the first send, closed its
    # connection and sent again on a new one; on SIGCONT the server runs the first send late
    # (its reply goes nowhere) and then the retry of the same owner: ONCE makes that a re-entry
    # that counts nothing, so the server holds the key once, with the token the library got.
    server = fresh_server
    client = LockClient.from_url(server.url, command_timeout=0.5, lost_signal=False)
    client.lock(key + ":warm").try_acquire().release()  # the pool has a connection
    lock = client.lock(key, lease=30)
    calls = server.commandstat("lock.acquire")
    with server.stopped():
        t, out = in_thread(lock.try_acquire)
        time.sleep(0.7)  # past the first send's 0.5 s; the third would end at 1.5 s
    t.join(5)
    assert len(out) == 1 and not isinstance(out[0], Exception), out
    guard = out[0]
    assert guard is not None
    assert server.commandstat("lock.acquire") - calls in (2, 3)
    held = info(server, key)
    assert held[b"owner"] == lock.owner and held[b"token"] == guard.token  # type: ignore[attr-defined]
    assert held[b"count"] == 1
    assert guard.release() is Release.RELEASED  # type: ignore[attr-defined]
    assert info(server, key) is None
    client.close()


def test_a_wait_reads_with_a_timeout_of_the_wait_plus_the_margin(server, blocking, key):
    client = blocking
    # The waiting connection's socket, found by the port the server sees it on.
    import gc
    import socket

    held = client.lock(key).acquire()
    t, out = in_thread(client.lock(key, wait_timeout=5).acquire)
    port = int(next_waiter(server, set())["addr"].rsplit(":", 1)[1])
    socks = [o for o in gc.get_objects() if isinstance(o, socket.socket) and o.fileno() >= 0
             and o.family == socket.AF_INET and o.getsockname()[1] == port]
    assert len(socks) == 1
    timeout = socks[0].gettimeout()
    assert 5 + 2.0 - 0.5 < timeout <= 5 + 2.0  # the wait left when it was sent, plus 2 s
    assert client.command_timeout != timeout
    held.release()
    t.join(5)
    out[0].release()  # type: ignore[attr-defined]

