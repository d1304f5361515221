"""The library's lock API on a server WITHOUT the module, as a managed service runs it, with the
redislock Functions library (functions/redislock.lua): the backend found per server, the same
lock objects (acquire, waits on the unlock message and the holder's lease, the watchdog, a loss
seen by a renewal, release, tokens), a clear NotSupported for what the library cannot do,
loading the library (load_functions=True), and a user with a managed service's ACL. Sync and
asyncio."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import redis

from conftest import ROOT, Server, start_cluster, start_server, wait_until
from test_functions import TAGS, slot_tags
from redis_lock_client import (
    AsyncLockClient,
    Backend,
    LockClient,
    LockTimeout,
    LostReason,
    NotHeld,
    NotSupported,
    Release,
    Renewal,
)
from redis_lock_client._commands import FUNCTIONS_VERSION, library_source, on_functions
from redis_lock_client._messages import unlock_channel

LIBRARY = ROOT / "functions" / "redislock.lua"
#: A library of the same name whose version is older than any this package speaks.
OLD_LIBRARY = (
    "#!lua name=redislock\n"
    "redis.register_function{ function_name = 'lock_version', callback = function() return 0 end,"
    " flags = { 'no-writes' } }\n"
)


def load(r: redis.Redis) -> None:
    assert r.execute_command("FUNCTION", "LOAD", "REPLACE", LIBRARY.read_bytes()) == b"redislock"


def start(tmp: Path, loaded: bool = True) -> Server:
    s = start_server(tmp, with_module=False)
    if loaded:
        load(s.client())
    return s


def stop(s: Server) -> None:
    s.proc.kill()
    s.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A plain redis-server, no module, with the library loaded."""
    s = start(tmp_path_factory.mktemp("functions-backend"))
    yield s
    stop(s)


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[Server]:
    """A server of the test's own, no module, no library."""
    s = start(tmp_path, loaded=False)
    yield s
    stop(s)


@pytest.fixture
def client(server: Server) -> Iterator[LockClient]:
    c = LockClient.from_url(server.url)
    yield c
    c.close()


def lock_info(server: Server, key: str) -> dict[bytes, object] | None:
    reply = server.client().execute_command("FCALL_RO", "lock_info", 1, key)
    return None if reply is None else dict(zip(reply[::2], reply[1::2]))


def fcalls(server: Server) -> int:
    """FCALL calls so far (INFO commandstats)."""
    return server.commandstat("fcall")


def line_of(key: str) -> tuple[str, str]:
    """The key's waiting line in the library: its sorted set and its hash."""
    tag = TAGS[slot_tags.key_slot(key.encode())]
    return f"__lock_fence__queue{{{tag}}}{key}", f"__lock_fence__waiters{{{tag}}}{key}"


def subscribed(server: Server) -> list[str]:
    """CLIENT LIST entries of connections subscribed to a channel."""
    listed = server.client().execute_command("CLIENT", "LIST").decode().splitlines()
    return [c for c in listed if " sub=0 " not in c]


def run(coro):  # one event loop per test, no plugin needed
    return asyncio.run(coro)


# -- the backend -------------------------------------------------------------------------------


def test_the_package_ships_the_repositorys_library():
    assert library_source() == LIBRARY.read_text(encoding="utf-8")
    assert f"local VERSION = {FUNCTIONS_VERSION}\n" in library_source()


@pytest.mark.parametrize("sent, expected", [
    (["LOCK.ACQUIRE", b"k", b"o", 500, "ONCE"], ["FCALL", "lock_acquire", 1, b"k", b"o", 500, "ONCE"]),
    (["LOCK.RENEW", b"k", b"o", 500], ["FCALL", "lock_renew", 1, b"k", b"o", 500]),
    (["LOCK.RELEASE", b"k", b"o"], ["FCALL", "lock_release", 1, b"k", b"o"]),
    (["LOCK.RELEASE", b"k", b"o", "TOKEN", 7], ["FCALL", "lock_release", 1, b"k", b"o", "TOKEN", 7]),
    (["LOCK.FORCERELEASE", b"k"], ["FCALL", "lock_forcerelease", 1, b"k"]),
    (["LOCK.INFO", b"k"], ["FCALL_RO", "lock_info", 1, b"k"]),
    (["LOCK.CHECK", b"k", b"o", 7], ["FCALL_RO", "lock_info", 1, b"k"]),
    (["LOCK.ACQUIRE", b"k", b"o", 500, "ONCE", "WAIT", 100, "TICKET"],
     ["FCALL", "lock_acquire", 1, b"k", b"o", 500, "ONCE", "WAIT", 100, "TICKET"]),
    (["LOCK.CANCEL", b"t"], ["FCALL", "lock_cancel", 1, b"t"]),
    (["WAIT", 1, 100], ["WAIT", 1, 100]),
])
def test_commands_as_the_library_takes_them(sent, expected):
    assert on_functions(sent).args == expected


@pytest.mark.parametrize("sent, what", [
    (["LOCK.ACQUIRE", b"k", b"o", 500, "SHARED", "ONCE"], "shared"),
    (["LOCK.ACQUIRE", b"k", b"o", 500, "LIMIT", 3, "ONCE"], "semaphores"),
    (["LOCK.ACQUIRE", b"k", b"o", 500, "EPHEMERAL", "ONCE"], "EPHEMERAL"),
    (["LOCK.ACQUIRE", b"k", b"o", 500, "ONCE", "WAIT", 100], r"waits that block the connection"),
    (["LOCK.MACQUIRE", 1, b"k", b"o", 500], "multi-key"),
    (["LOCK.GUARD", b"k", b"o", 7, "SET", "x", "1"], "fenced commands"),
    (["LOCK.CAMPAIGN", b"k", b"o", 500], "elections"),
])
def test_what_the_library_has_no_function_for_is_refused(sent, what):
    with pytest.raises(NotSupported, match=what):
        on_functions(sent)


def test_the_token_check_reads_the_holder():
    check = on_functions(["LOCK.CHECK", b"k", b"o", 7])
    held = [b"owner", b"o", b"holders", [[b"owner", b"o", b"token", 7, b"ttl", 100]]]
    assert check.answer(held) == 1
    assert check.answer([b"owner", b"o", b"holders", [[b"owner", b"o", b"token", 8]]]) == 0
    assert check.answer(None) == 0


def test_backend_is_found_per_server(server, client, tmp_path):
    assert client.backend() is Backend.FUNCTIONS
    assert not client.backend().supports_ephemeral
    module_server = start_server(tmp_path)
    try:
        with LockClient.from_url(module_server.url) as on_module:
            assert on_module.backend() is Backend.MODULE
            assert on_module.backend().supports_ephemeral
    finally:
        stop(module_server)


def test_a_server_without_either_is_refused_with_what_to_do(bare, key):
    with LockClient.from_url(bare.url) as client:
        with pytest.raises(NotSupported, match="load_functions=True") as e:
            client.lock(key).try_acquire()
        assert "neither the LOCK.* module nor the redislock Functions library" in str(e.value)
        with pytest.raises(NotSupported):
            client.backend()
    assert bare.client().execute_command("FUNCTION", "LIST") == []
    assert bare.client().exists(key) == 0


def test_load_functions_loads_the_library(bare, key):
    with LockClient.from_url(bare.url, load_functions=True) as client:
        guard = client.lock(key).acquire()
        assert client.backend() is Backend.FUNCTIONS
        guard.release()
    listed = bare.client().execute_command("FUNCTION", "LIST")
    assert [dict(zip(lib[::2], lib[1::2]))[b"library_name"] for lib in listed] == [b"redislock"]
    assert bare.client().execute_command("FCALL_RO", "lock_version", 0) == FUNCTIONS_VERSION


def test_an_older_library_is_refused_or_replaced(bare, key):
    bare.client().execute_command("FUNCTION", "LOAD", OLD_LIBRARY)
    with LockClient.from_url(bare.url) as client:
        with pytest.raises(NotSupported, match="redislock library version 0"):
            client.lock(key).try_acquire()
    with LockClient.from_url(bare.url, load_functions=True) as client:
        assert client.lock(key).acquire().token > 0
    assert bare.client().execute_command("FCALL_RO", "lock_version", 0) == FUNCTIONS_VERSION


def test_a_library_flushed_under_a_hold_is_loaded_again(bare, key):
    """FUNCTION FLUSH answers the next FCALL "Function not found": the backend is found again
    (and, with load_functions, the library loaded again) and the command sent once more."""
    with LockClient.from_url(bare.url, load_functions=True) as client:
        guard = client.lock(key).acquire()
        bare.client().execute_command("FUNCTION", "FLUSH")
        assert guard.release() is Release.RELEASED
    assert bare.client().exists(key) == 0


# -- what works --------------------------------------------------------------------------------


def test_acquire_reenter_release(server, client, key):
    lock = client.lock(key)
    guard = lock.acquire()
    found = lock_info(server, key)
    assert found is not None and found[b"owner"] == lock.owner and found[b"token"] == guard.token
    with lock as inner:  # re-entry: the same hold (ONCE: counted by the handle, not the server)
        assert inner.token == guard.token
        assert lock_info(server, key)[b"count"] == 1  # type: ignore[index]
    assert lock_info(server, key) is not None  # the outer guard still holds it
    assert client.lock(key).try_acquire() is None  # another owner
    assert guard.release() is Release.RELEASED
    assert guard.release() is Release.ALREADY_RELEASED
    assert lock_info(server, key) is None


def test_tokens_rise_across_releases(server, client, key):
    tokens = []
    for _ in range(5):
        with client.lock(key) as guard:
            tokens.append(guard.token)
    with LockClient.from_url(server.url) as other:
        with other.lock(key) as guard:
            tokens.append(guard.token)
    server.client().delete(key)
    with client.lock(key) as guard:
        tokens.append(guard.token)
    assert tokens == sorted(set(tokens)), tokens


@pytest.mark.parametrize("tickets", [True, False])
def test_a_waiter_is_granted_promptly_after_the_release(server, key, tickets):
    """Two clients: the waiter waits with a ticket (the release hands it the key), or without
    tickets listens to the unlock message and asks again when it comes (not by polling: a
    handful of FCALLs over the whole hold)."""
    with LockClient.from_url(server.url) as a, LockClient.from_url(
        server.url, wait_with_tickets=tickets
    ) as b:
        held = a.lock(key).acquire()
        got: list[tuple[float, int]] = []

        def wait() -> None:
            guard = b.lock(key, wait_timeout=10).acquire()
            got.append((time.monotonic(), guard.token))
            guard.release()

        waiter = threading.Thread(target=wait)
        calls = fcalls(server)
        waiter.start()
        time.sleep(1.0)
        assert not got
        released = time.monotonic()
        held.release()
        waiter.join(10)
        assert got and got[0][1] > held.token
        # Measured: about 3 ms on a loaded two-core machine; bound 100x that.
        assert got[0][0] - released < 0.3, got[0][0] - released
        # Its acquires (before, and once released), a lease read, the release of each: no polling.
        assert fcalls(server) - calls <= 8


def test_without_tickets_a_newcomer_can_take_the_lock_ahead_of_a_waiter(server, key):
    """Without tickets there is no line. The release and a newcomer's acquire in one
    transaction: the newcomer holds the lock when the waiter asks again; the waiter goes on
    waiting, and gets it at the next release."""
    client = LockClient.from_url(server.url, wait_with_tickets=False)
    held = client.lock(key).acquire()
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.lock(key, wait_timeout=10).acquire().token)
    )
    waiter.start()
    time.sleep(0.3)
    pipe = server.client().pipeline(transaction=True)
    pipe.execute_command("FCALL", "lock_release", 1, key, held.owner)
    pipe.execute_command("FCALL", "lock_acquire", 1, key, "newcomer", 10000)
    released, newcomer = pipe.execute()
    assert released == 0 and newcomer > held.token
    time.sleep(0.3)
    assert not got
    assert lock_info(server, key)[b"owner"] == b"newcomer"  # type: ignore[index]
    server.client().execute_command("FCALL", "lock_release", 1, key, "newcomer")
    waiter.join(5)
    assert got and got[0] > newcomer
    with pytest.raises(NotHeld):
        held.release()  # (its hold was released from outside)
    client.close()


def test_a_cancelled_async_wait_leaves_no_connection_behind(server, key):
    """Without tickets, the wait's subscription is closed with it: nothing stays subscribed on
    the server."""
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, wait_with_tickets=False) as client:
            held = await client.lock(key).acquire()
            waiting = asyncio.create_task(client.lock(key, wait_timeout=10).acquire())
            await asyncio.sleep(0.3)
            assert len(subscribed(server)) == 1
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await held.release()
    run(main())
    wait_until(lambda: not subscribed(server), "the cancelled wait's subscription closed")


@pytest.mark.parametrize("tickets", [True, False])
def test_a_wait_ends_at_its_deadline(server, key, tickets):
    """With a ticket, the wait that ends withdraws it (lock_cancel): the line is empty."""
    client = LockClient.from_url(server.url, wait_with_tickets=tickets)
    held = client.lock(key).acquire()
    start = time.monotonic()
    with pytest.raises(LockTimeout):
        client.lock(key, wait_timeout=0.5).acquire()
    assert 0.5 <= time.monotonic() - start < 2.5
    wait_until(lambda: not subscribed(server), "the wait's subscription closed")
    assert server.client().exists(*line_of(key)) == 0
    held.release()
    client.close()


@pytest.mark.parametrize("tickets", [True, False])
def test_a_waiter_is_granted_when_the_holders_lease_ends(server, key, tickets):
    """Nothing is published when a lease ends: the waiter asks again at the holder's lease end,
    which its ticket's reply named (or, without tickets, which it read)."""
    client = LockClient.from_url(server.url, wait_with_tickets=tickets)
    held = client.lock(key, lease=0.5, renewal=Renewal.FIXED).acquire()
    granted_at = held  # (keeps the guard alive: its lease ends on the server, not by a release)
    start = time.monotonic()
    guard = client.lock(key, wait_timeout=5).acquire()
    waited = time.monotonic() - start
    assert guard.token > granted_at.token
    assert waited < 2.5, waited  # the lease had under 0.5 s left: asked again right after
    guard.release()
    client.close()


def test_the_watchdog_keeps_a_hold_past_its_lease(server, client, key):
    guard = client.lock(key, lease=0.6).acquire()
    time.sleep(1.5)  # 2.5 leases: renewed every 0.2 s
    assert not guard.lost.is_set()
    found = lock_info(server, key)
    assert found is not None and found[b"token"] == guard.token
    assert 0 < int(found[b"ttl"]) <= 600  # type: ignore[call-overload]
    # No lost-hold signal here: the client listens to nothing (no pub/sub connection).
    listed = server.client().execute_command("CLIENT", "LIST").decode().splitlines()
    assert not [c for c in listed if " sub=0 " not in c or " ssub=0 " not in c], listed
    assert guard.release() is Release.RELEASED


def test_a_deleted_lock_is_reported_lost_by_the_renewal(server, client, key):
    guard = client.lock(key, lease=0.6).acquire()
    server.client().delete(key)
    assert guard.lost.wait(3)
    assert guard.lost_reason is LostReason.HOLD_GONE
    with pytest.raises(NotHeld):
        guard.release()


def test_a_forced_release_is_reported_lost_and_wakes_a_waiter(server, client, key):
    guard = client.lock(key, lease=0.6).acquire()
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.lock(key, wait_timeout=10).acquire().token)
    )
    waiter.start()
    time.sleep(0.2)
    assert server.client().execute_command("FCALL", "lock_forcerelease", 1, key) == 1
    waiter.join(5)
    assert got and got[0] > guard.token
    assert guard.lost.wait(3)
    assert guard.lost_reason is LostReason.HOLD_GONE


def test_the_unlock_channel_is_the_one_the_library_publishes_on(server, client, key):
    sub = server.client().pubsub()
    sub.subscribe(unlock_channel(key))
    assert sub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    client.lock(key).acquire().release()
    message = sub.get_message(timeout=2)
    assert message is not None and message["data"] == b"0"
    sub.close()


# -- waiting in line, with tickets -----------------------------------------------------------

#: functions/redislock.lua's WAITER_LIVE_MS: an entry not asked for again for this long is
#: passed over.
WAITER_LIVE = 3.0


def contend(server: Server, key: str, n: int, rounds: int, tickets: bool,
            hold: float = 0.0) -> tuple[list[int], int, int, float]:
    """``n`` clients (threads), each taking the lock ``rounds`` times: the order of the grants
    (by client), the FCALLs and BLPOPs the server ran meanwhile (INFO commandstats), and how
    long it took."""
    clients = [LockClient.from_url(server.url, wait_with_tickets=tickets) for _ in range(n)]
    for c in clients:
        c.backend()  # (found before counting)
    server.client().config_resetstat()
    order: list[int] = []
    start = threading.Barrier(n)

    def work(i: int) -> None:
        lock = clients[i].lock(key, wait_timeout=60)
        start.wait()
        for _ in range(rounds):
            with lock:
                order.append(i)
                if hold:
                    time.sleep(hold)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    elapsed = time.monotonic() - began
    stats = server.client().info("commandstats")
    for c in clients:
        c.close()
    calls = {name: stats.get(f"cmdstat_{name}", {"calls": 0})["calls"] for name in ("fcall", "blpop")}
    return order, calls["fcall"], calls["blpop"], elapsed


def jain(counts: list[int]) -> float:
    return sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts))


def test_waiters_are_granted_in_arrival_order(server, key):
    """Six waits of one client (one asking connection, one BLPOP for all): each is in line when
    the next starts; the releases grant them in that order."""
    n = 6
    with LockClient.from_url(server.url) as a, LockClient.from_url(server.url) as b:
        held = a.lock(key).acquire()
        order: list[int] = []
        threads = []
        for i in range(n):
            def wait(i: int = i) -> None:
                with b.lock(key, wait_timeout=30):
                    order.append(i)
            threads.append(threading.Thread(target=wait))
            threads[-1].start()
            wait_until(lambda: server.client().zcard(line_of(key)[0]) == i + 1, f"waiter {i} in line")
        held.release()
        for t in threads:
            t.join(30)
        assert order == list(range(n))
        assert server.client().exists(key, *line_of(key)) == 0


def test_commands_per_acquisition_under_contention(server, key):
    """Eight clients take turns: each acquisition costs its acquire and its release (two
    FCALLs) and one BLPOP, no polling (beyond those, a waiter asks again and a desk's BLPOP
    ends at most once a second); and the line keeps it fair (Jain's index of the grants over
    the first half of the run)."""
    n, rounds = 8, 12
    order, fcall, blpop, elapsed = contend(server, key, n, rounds, tickets=True, hold=0.002)
    acquisitions = n * rounds
    assert len(order) == acquisitions
    seconds = int(elapsed) + 1
    assert fcall <= 2 * acquisitions + n * seconds, (fcall, elapsed)
    assert blpop <= acquisitions + n * seconds, (blpop, elapsed)
    half = order[: acquisitions // 2]
    assert jain([half.count(i) for i in range(n)]) > 0.95, half


def test_with_tickets_a_newcomer_never_takes_the_lock_ahead_of_a_waiter(server, client, key):
    """The release and a newcomer's acquire in one transaction: the release hands the key to
    the waiter in line, and the newcomer gets nil."""
    held = client.lock(key).acquire()
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.lock(key, wait_timeout=10).acquire().token)
    )
    waiter.start()
    wait_until(lambda: server.client().zcard(line_of(key)[0]) == 1, "the waiter in line")
    pipe = server.client().pipeline(transaction=True)
    pipe.execute_command("FCALL", "lock_release", 1, key, held.owner)
    pipe.execute_command("FCALL", "lock_acquire", 1, key, "newcomer", 10000)
    released, newcomer = pipe.execute()
    assert released == 0 and newcomer is None
    waiter.join(5)
    assert got and got[0] > held.token


def doomed_waiter(server: Server, key: str, lease: float) -> subprocess.Popen[bytes]:
    """A process that waits for ``key`` with a ticket, in line once this returns; kill it to
    have a waiter die in line."""
    script = (
        "from redis_lock_client import LockClient\n"
        f"c = LockClient.from_url({server.url!r})\n"
        f"c.lock({key!r}, lease={lease}, wait_timeout=60).acquire()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    wait_until(lambda: server.client().zcard(line_of(key)[0]) == 1, "the doomed waiter in line")
    return proc


def test_a_waiter_that_died_is_passed_over_once_its_entry_is_due(server, client, key):
    """A waiter's process is killed in line, ahead of another: it asks again no more, and a
    release once its entry is past its deadline (WAITER_LIVE) hands the key to the next."""
    held = client.lock(key).acquire()
    doomed = doomed_waiter(server, key, lease=30)
    got: list[tuple[float, int]] = []

    def wait() -> None:
        guard = client.lock(key, wait_timeout=30).acquire()
        got.append((time.monotonic(), guard.token))

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: server.client().zcard(line_of(key)[0]) == 2, "the waiter in line")
    doomed.kill()
    doomed.wait()
    time.sleep(WAITER_LIVE + 0.5)
    released = time.monotonic()
    held.release()
    waiter.join(10)
    assert got and got[0][1] > held.token
    # Measured: a few ms (the token was pushed into its ticket by the release).
    assert got[0][0] - released < 0.5, got[0][0] - released


def test_a_waiter_that_died_and_was_granted_holds_the_key_for_its_lease(server, client, key):
    """The cost of a waiter that dies while its entry is due: the release hands it the key, and
    nobody pops its ticket; the next waiter gets the key when that lease ends (it asks again
    at the lease end its ticket's reply named)."""
    held = client.lock(key).acquire()
    doomed = doomed_waiter(server, key, lease=1.0)
    got: list[tuple[float, int]] = []

    def wait() -> None:
        guard = client.lock(key, wait_timeout=30).acquire()
        got.append((time.monotonic(), guard.token))

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: server.client().zcard(line_of(key)[0]) == 2, "the waiter in line")
    doomed.kill()
    doomed.wait()
    released = time.monotonic()
    held.release()
    waiter.join(15)
    assert got and got[0][1] > held.token
    waited = got[0][0] - released
    assert 0.9 <= waited < 5.0, waited  # the dead waiter's 1 s lease, then the next ask


def test_a_cancelled_async_wait_withdraws_its_ticket(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            held = await client.lock(key).acquire()
            waiting = asyncio.create_task(client.lock(key, wait_timeout=10).acquire())
            await asyncio.sleep(0.3)
            assert server.client().zcard(line_of(key)[0]) == 1
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert server.client().exists(*line_of(key)) == 0
            await held.release()
            assert lock_info(server, key) is None  # nobody was handed it
    run(main())


# -- what is refused ---------------------------------------------------------------------------


def refused(call, what: str) -> None:
    with pytest.raises(NotSupported, match=f"{what} need the LOCK.* module"):
        call()


def test_what_the_library_cannot_do_is_refused_before_anything_is_sent(server, client, key):
    calls = fcalls(server)
    refused(lambda: client.read_lock(key).acquire(), r"shared \(read\) holds")
    refused(lambda: client.semaphore(key, 3).try_acquire(), "semaphores")
    refused(lambda: client.multi_lock([key, key + ":b"]).acquire(), "multi-key locks")
    refused(lambda: client.lock(key, ephemeral=True).acquire(), "EPHEMERAL holds")
    refused(lambda: client.election(key).campaign(timeout=0), "elections")
    refused(lambda: client.election(key).leader(), "elections")
    with client.election(key).observe() as observer:
        refused(lambda: next(observer), "elections")
    assert fcalls(server) == calls
    with LockClient.from_url(server.url, lost_signal=True) as signalled:
        refused(lambda: signalled.lock(key).acquire(), r"the lost-hold signal \(lost_signal=True\)")
    assert server.client().exists(key) == 0
    with client.lock(key) as guard:
        refused(lambda: guard.execute("SET", key + ":data", "x"), r"fenced commands \(guard.execute\)")
    assert server.client().exists(key + ":data") == 0


# -- a cluster ---------------------------------------------------------------------------------


def test_a_cluster_without_the_module_gets_the_library_on_each_master_at_first_use(tmp_path):
    """Three masters without the module or the library: each gets it loaded (load_functions)
    when the client first sends it a command; locks, a wait across two clients (the unlock
    message is published cluster-wide) and releases work on every master."""
    from redis.cluster import RedisCluster

    cluster = start_cluster(tmp_path, with_module=False)
    try:
        keys = {}
        for i in range(1000):  # a key served by each master
            k = f"orders:{i}"
            keys.setdefault(cluster.node_of(k).port, k)
            if len(keys) == 3:
                break
        node_keys = [keys[n.port] for n in cluster.nodes]
        with LockClient(RedisCluster(host="127.0.0.1", port=cluster.ports[0]),
                        load_functions=True) as a, LockClient(
                RedisCluster(host="127.0.0.1", port=cluster.ports[0])) as b:
            with pytest.raises(ValueError):
                a.backend()
            first = a.lock(node_keys[0]).acquire()
            loaded = [bool(n.client().execute_command("FUNCTION", "LIST")) for n in cluster.nodes]
            assert loaded == [True, False, False]  # only the master asked so far
            for k in node_keys:
                assert a.backend(k) is Backend.FUNCTIONS
            for n in cluster.nodes:
                assert n.client().execute_command("FCALL_RO", "lock_version", 0) == FUNCTIONS_VERSION
            for k in node_keys[1:]:
                guard = a.lock(k, lease=0.6).acquire()
                got: list[int] = []
                waiter = threading.Thread(
                    target=lambda k=k: got.append(b.lock(k, wait_timeout=10).acquire().token)
                )
                waiter.start()
                time.sleep(1.0)  # renewed meanwhile
                assert not guard.lost.is_set() and not got
                guard.release()
                waiter.join(5)
                assert got and got[0] > guard.token
            assert first.release() is Release.RELEASED
    finally:
        for n in cluster.nodes:
            stop(n)


# -- a managed service's user ------------------------------------------------------------------


def test_a_managed_services_user(server, key):
    """`+@all -@dangerous` (no MODULE, CONFIG, DEBUG, ...), the library loaded by the service."""
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "managed", "on", ">pw", "~*", "&*", "+@all", "-@dangerous")
    url = f"redis://managed:pw@127.0.0.1:{server.port}/"
    for refused_command in (["MODULE", "LIST"], ["CONFIG", "GET", "maxmemory"], ["DEBUG", "SLEEP", "0"]):
        verdict = admin.execute_command("ACL", "DRYRUN", "managed", *refused_command)
        assert b"no permissions" in verdict, (refused_command, verdict)
    hold_renew_and_hand_over(url, key)


def hold_renew_and_hand_over(url: str, key: str) -> None:
    """As the user of ``url``: a hold outlives its 0.6 s lease (renewed) while another client
    waits, and the release hands the key to the waiter with a higher token."""
    with LockClient.from_url(url) as a, LockClient.from_url(url) as b:
        assert a.backend() is Backend.FUNCTIONS
        held = a.lock(key, lease=0.6).acquire()
        got: list[int] = []
        waiter = threading.Thread(target=lambda: got.append(b.lock(key, wait_timeout=10).acquire().token))
        waiter.start()
        time.sleep(1.0)  # renewed meanwhile
        assert not held.lost.is_set() and not got
        held.release()
        waiter.join(5)
        assert got and got[0] > held.token


def documented_user() -> list[str]:
    """The ``ACL SETUSER pyapp ...`` line docs/functions.md prints, split into its arguments."""
    for line in (ROOT / "docs" / "functions.md").read_text().splitlines():
        if line.startswith("ACL SETUSER pyapp "):
            return line.split()
    pytest.fail("no `ACL SETUSER pyapp` line in docs/functions.md")


def test_the_documented_least_privilege_user(server):
    """The user docs/functions.md gives this library: the functions' rules, and what the
    library's own connections send (their names, the waits' subscription); no COMMAND (the
    backend is then told by ``lock_version`` alone)."""
    line = documented_user()
    server.client().execute_command(*line)
    password = next(a[1:] for a in line if a.startswith(">"))
    url = f"redis://pyapp:{password}@127.0.0.1:{server.port}/"
    key = f"orders:{time.monotonic_ns()}"
    hold_renew_and_hand_over(url, key)


# -- asyncio -----------------------------------------------------------------------------------


def test_async_acquire_wait_release(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as a, AsyncLockClient.from_url(
            server.url
        ) as b:
            assert await a.backend() is Backend.FUNCTIONS
            held = await a.lock(key).acquire()
            assert await b.lock(key).try_acquire() is None

            async def later() -> float:
                await asyncio.sleep(0.5)
                await held.release()
                return time.monotonic()

            task = asyncio.create_task(later())
            guard = await b.lock(key, wait_timeout=10).acquire()
            granted = time.monotonic()
            released = await task
            assert guard.token > held.token
            assert granted - released < 0.3, granted - released
            with pytest.raises(LockTimeout):
                await a.lock(key, wait_timeout=0.3).acquire()
            assert await guard.release() is Release.RELEASED
            assert lock_info(server, key) is None
    run(main())


def test_async_lease_end_renewal_and_loss(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            fixed = await client.lock(key, lease=0.5, renewal=Renewal.FIXED).acquire()
            start = time.monotonic()
            guard = await client.lock(key, lease=0.6, wait_timeout=5).acquire()
            assert time.monotonic() - start < 1.5 and guard.token > fixed.token
            await asyncio.sleep(1.5)  # renewed past its lease
            assert not guard.lost.is_set()
            server.client().delete(key)
            await asyncio.wait_for(guard.lost.wait(), 3)
            assert guard.lost_reason is LostReason.HOLD_GONE
            with pytest.raises(NotHeld):
                await guard.release()
    run(main())


def test_async_refusals_and_loading(bare, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(bare.url) as client:
            with pytest.raises(NotSupported, match="load_functions=True"):
                await client.lock(key).acquire()
        async with AsyncLockClient.from_url(bare.url, load_functions=True) as client:
            assert await client.backend() is Backend.FUNCTIONS
            with pytest.raises(NotSupported, match="EPHEMERAL holds"):
                await client.lock(key, ephemeral=True).acquire()
            with pytest.raises(NotSupported, match="semaphores"):
                await client.semaphore(key, 2).acquire()
            async with client.lock(key) as guard:
                with pytest.raises(NotSupported, match="fenced commands"):
                    await guard.execute("SET", "x", "1")
    run(main())
    wait_until(lambda: bare.client().exists(key) == 0, "the lock released")
