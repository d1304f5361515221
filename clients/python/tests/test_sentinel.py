"""The library through Sentinel (one master, two replicas, three Sentinels, see conftest.py's
SentinelSet), and grants acknowledged by replicas (``replicas=``), against real servers."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import threading
import time
import uuid

import pytest
import redis

from conftest import (
    SentinelSet,
    _mkdir,
    _start_sentinel,
    start_server,
    start_sentinel_set,
    wait_until,
    waiting,
)
from redis_lock_client import (
    AsyncLockClient,
    LockClient,
    LockError,
    LockGuard,
    LockServerError,
    LostReason,
    NotHeld,
    NotSafelyAcquired,
    Release,
    lost_signal_channel,
)


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory):
    """A Sentinel set shared by the tests that cause no failover."""
    s = start_sentinel_set(tmp_path_factory.mktemp("sentinel"))
    yield s
    s.stop()


def unique(tag: str) -> str:
    return f"{tag}:{uuid.uuid4().hex}"


def waits(set_: SentinelSet) -> int:
    """WAIT commands the master ran so far."""
    return set_.master().commandstat("wait")


def info(server, key: str):
    reply = server.client().execute_command("LOCK.INFO", key)
    return None if reply is None else dict(zip(reply[::2], reply[1::2]))


def granted_in_turn(server, key: str, results: dict[str, object], names: list[str]) -> None:
    """Frees ``key`` on ``server`` once for each waiter of ``names``: each is granted there in
    turn (its hold read on ``server``), then its hold freed for the next."""
    for done in range(1, len(names) + 1):
        server.client().execute_command("LOCK.FORCERELEASE", key)
        wait_until(lambda: sum(n in results for n in names) >= done, f"{done} granted", bound=10)
        for name in names:
            got = results.get(name)
            assert not isinstance(got, Exception), f"{name}: {got!r}"
        owners = [getattr(results[n], "owner", None) for n in names if n in results]
        assert info(server, key)[b"owner"] in owners


@pytest.mark.scenario("sentinel-connect")
def test_a_client_through_sentinel_locks_on_the_master_and_its_replicas_get_it(sentinels):
    key = unique("connect")
    client = LockClient.from_sentinel(sentinels.addresses, SentinelSet.NAME)
    guard = client.lock(key).acquire()
    master = sentinels.master()
    assert info(master, key)[b"token"] == guard.token
    assert guard.execute("SET", key + ":data", "v") == b"OK"
    sentinels.wait_replicated()
    for replica in sentinels.replicas():
        assert info(replica, key)[b"token"] == guard.token
    assert guard.release() is Release.RELEASED
    client.close()
    # A client made from redis-py's own Sentinel client follows failovers the same way.
    from redis.sentinel import Sentinel

    direct = LockClient(Sentinel(sentinels.addresses).master_for(SentinelSet.NAME))
    assert direct.failover_timeout == 30.0
    with direct.lock(key) as again:
        assert info(master, key)[b"token"] == again.token
    direct.close()


def _answer(port: int, epoch: int, flags: str = "master") -> dict:
    """A Sentinel's ``SENTINEL MASTER`` answer as redis-py parses it (RESP2)."""
    from redis._parsers.helpers import parse_sentinel_master

    return parse_sentinel_master([b"name", b"m", b"ip", b"127.0.0.1", b"port", str(port).encode(),
                                  b"flags", flags.encode(), b"num-other-sentinels", b"2",
                                  b"config-epoch", str(epoch).encode()])


@pytest.mark.parametrize("followed, asked, chosen", [
    # The highest epoch wins, wherever its Sentinel is in the list.
    (None, [_answer(1, 0), _answer(2, 3), _answer(2, 3)], 2),
    # A Sentinel that failed, or names a master it sees down, is left out.
    (None, [_answer(1, 5, "master,s_down"), ConnectionError("refused"), _answer(2, 3)], 2),
    (None, [_answer(1, 5, "master,o_down,s_down"), _answer(2, 3)], 2),
    # A lower epoch never moves the followed master; a higher one does.
    (2, [_answer(1, 0)], 2),
    (2, [_answer(1, 0), _answer(3, 4)], 3),
    # A tie keeps the followed master if one of them names it, else the first.
    (2, [_answer(1, 1), _answer(2, 1)], 2),
    (None, [_answer(1, 1), _answer(2, 1)], 1),
    # Nobody names a usable master: redis-py's MasterNotFoundError.
    (2, [ConnectionError("refused"), _answer(1, 9, "master,s_down")], None),
])
def test_the_master_followed_is_the_one_named_with_the_highest_epoch(followed, asked, chosen):
    from redis.sentinel import MasterNotFoundError, Sentinel

    from redis_lock_client._masters import FollowedMasters

    masters = FollowedMasters()
    usable = Sentinel([]).check_master_state
    if followed is not None:  # followed first, named with epoch 2
        masters.pick("m", [(None, _answer(followed, 2))], lambda a: usable(a, "m"), None,
                     MasterNotFoundError)
    pairs = [(None, a) for a in asked]
    if chosen is None:
        with pytest.raises(MasterNotFoundError, match="refused"):
            masters.pick("m", pairs, lambda a: usable(a, "m"), None, MasterNotFoundError)
    else:
        got = masters.pick("m", pairs, lambda a: usable(a, "m"), None, MasterNotFoundError)
        assert got == ("127.0.0.1", chosen)


def test_a_lower_epoch_never_moves_the_client_and_a_recreated_set_brings_the_epoch_down():
    # A Sentinel set re-created from scratch starts its epochs at 0 again: a client that kept
    # to the highest epoch it ever followed would never follow its failovers (review F2). A
    # majority naming the followed master at a lower epoch for EPOCH_RESET_GRACE brings the
    # epoch down; a lower epoch never moves the client to another master, even from a majority
    # (Sentinels cut off with a replaced master name it at its old epoch); a minority, or one
    # answer at the followed epoch (a master flagged down included), starts the clock again.
    # The Rust library's master.rs test takes the same steps.
    from redis_lock_client._masters import EPOCH_RESET_GRACE, FollowedMasters

    a, b = ("127.0.0.1", 1), ("127.0.0.1", 2)
    g = EPOCH_RESET_GRACE
    masters = FollowedMasters()
    assert masters.choose("m", [(5, a)], True, 5, now=0.0) == a
    # A majority at epoch 0 naming another master: never followed, however long.
    assert masters.choose("m", [(0, b)], True, 0, now=1.0) == a
    assert masters.choose("m", [(0, b)], True, 0, now=1.0 + 2 * g) == a
    # A majority naming the followed master at epoch 0: still it, its epoch kept for the grace.
    t = 2.0 + 2 * g
    assert masters.choose("m", [(0, a)], True, 0, now=t) == a
    assert masters.choose("m", [(0, a)], True, 0, now=t + g / 2) == a
    # Epoch 5 still heard (its master flagged down: no usable answer): the clock starts again.
    assert masters.choose("m", [], True, 5, now=t + g / 2) is None
    assert masters.choose("m", [(0, a)], True, 0, now=t + g) == a
    # A minority answering starts it again too.
    assert masters.choose("m", [(0, a)], False, 0, now=t + 2 * g) == a
    assert masters.choose("m", [(0, a)], True, 0, now=t + 2 * g + 0.1) == a
    assert masters.choose("m", [(0, b)], True, 0, now=t + 3 * g) == a  # not while epoch 5 holds
    assert masters.choose("m", [(0, a)], True, 0, now=t + 3 * g + 0.1) == a
    assert masters.choose("m", [(0, a)], True, 0, now=t + 4 * g + 0.1) == a  # lowered now
    # Followed at epoch 0: the new set's next failover (epoch 1) is followed at once.
    assert masters.choose("m", [(1, b)], False, 1, now=t + 4 * g + 0.2) == b


def _sentinel_names(sentinel, name: str) -> dict:
    return redis.Redis(host="127.0.0.1", port=sentinel.port, socket_timeout=2,
                       decode_responses=True).sentinel_master(name)


def _commands_run(sentinel) -> int:
    """Commands ``sentinel`` ran so far, this INFO not counted (a Sentinel of Redis 7.0 has no
    commandstats)."""
    return int(sentinel.client().info("stats")["total_commands_processed"])


@pytest.mark.scenario("sentinel-connect")
def test_the_master_named_with_the_highest_epoch_wins_and_a_lower_epoch_never_moves_a_client_back(
        sentinel_set, tmp_path):
    # A lagging Sentinel first in the list names another server under the same name with an
    # older epoch: the library follows the Sentinels that saw the failover, and once they are
    # gone, it keeps to that master rather than go back to the lagging one's.
    s = sentinel_set
    old = s.master()
    assert s.sentinel().execute_command("SENTINEL", "FAILOVER", SentinelSet.NAME)
    deadline = time.monotonic() + 30
    new = None
    while new is None:
        assert time.monotonic() < deadline, "the Sentinels did not fail over"
        named = [_sentinel_names(x, SentinelSet.NAME) for x in s.sentinels]
        ports = {int(n["port"]) for n in named}
        if (len(ports) == 1 and old.port not in ports
                and all(int(n["config-epoch"]) >= 1 and n["is_master"] for n in named)):
            candidate = next(x for x in s.servers if x.port in ports)
            if candidate.client().info("replication")["role"] == "master":
                new = candidate
        time.sleep(0.05)
    # The lagging Sentinel S0: it watches an unrelated server X under the same name, epoch 0.
    x = start_server(_mkdir(tmp_path / "x"))
    s0 = _start_sentinel(_mkdir(tmp_path / "s0"), x.port)
    try:
        lagging = _sentinel_names(s0, SentinelSet.NAME)
        assert int(lagging["port"]) == x.port and int(lagging["config-epoch"]) == 0
        addresses = [("127.0.0.1", s0.port)] + s.addresses
        client = LockClient.from_sentinel(addresses, SentinelSet.NAME)

        async def both_clients() -> None:
            async with AsyncLockClient.from_sentinel(addresses, SentinelSet.NAME) as aclient:
                key, akey = unique("epoch"), unique("aepoch")
                guard = client.lock(key).acquire()
                aguard = await aclient.lock(akey).acquire()
                assert info(x, key) is None, "locked on the lagging Sentinel's server"
                assert info(x, akey) is None, "asyncio: locked on the lagging Sentinel's server"
                assert info(new, key)[b"token"] == guard.token
                assert info(new, akey)[b"token"] == aguard.token
                # Only the lagging Sentinel is left: its lower epoch does not move the
                # clients back.
                for sentinel in s.sentinels:
                    sentinel.proc.kill()
                    sentinel.proc.wait()
                asked = _commands_run(s0)
                await asyncio.sleep(1.0)  # twice the period after which the Sentinels are asked
                later, alater = unique("later"), unique("alater")
                again = client.lock(later).acquire()
                aagain = await aclient.lock(alater).acquire()
                # More than the INFO of ``asked``: the clients asked the Sentinel left again.
                assert _commands_run(s0) > asked + 1, "the Sentinels were not asked again"
                assert info(x, later) is None and info(x, alater) is None
                assert info(new, later)[b"token"] == again.token
                assert info(new, alater)[b"token"] == aagain.token

        asyncio.run(both_clients())
        client.close()
    finally:
        for proc in (s0.proc, x.proc):
            proc.kill()
            proc.wait()


@pytest.mark.scenario("replicas-unsafe")
def test_min_replicas_to_write_makes_the_master_refuse_grants(sentinels):
    key = unique("minreplicas")
    client = LockClient.from_sentinel(sentinels.addresses, SentinelSet.NAME)
    master = sentinels.master()
    master.client().config_set("min-replicas-to-write", 3)  # two replicas exist
    try:
        with pytest.raises(LockServerError, match="NOREPLICAS"):
            client.lock(key).acquire()
    finally:
        master.client().config_set("min-replicas-to-write", 0)
    assert info(master, key) is None
    client.close()


@pytest.mark.scenario("replicas-ack")
def test_replicas_1_waits_for_a_replica_after_the_grant_and_after_every_renewal(sentinels):
    key = unique("ack")
    client = LockClient.from_sentinel(sentinels.addresses, SentinelSet.NAME)
    master = sentinels.master()
    before_waits, before_renews = waits(sentinels), master.commandstat("lock.renew")
    guard = client.lock(key, lease=1.5, replicas=1).acquire()
    # The grant was confirmed by a renewal and a WAIT on its connection before acquire()
    # returned: the replica had it by then.
    assert waits(sentinels) == before_waits + 1
    assert master.commandstat("lock.renew") == before_renews + 1
    wait_until(lambda: master.commandstat("lock.renew") >= before_renews + 4, "renewals",
               bound=10)
    renews = master.commandstat("lock.renew") - before_renews
    assert waits(sentinels) - before_waits in (renews, renews - 1)  # one WAIT after each
    assert not guard.lost.is_set()
    assert guard.release() is Release.RELEASED
    # Elections and multi-key locks take the option too.
    now = waits(sentinels)
    multi = client.multi_lock([key + ":a", key + ":b"], replicas=2).acquire()
    leader = client.election(key + ":e", replicas=2).campaign()
    reader = client.read_lock(key + ":r", replicas=1).acquire()
    permit = client.semaphore(key + ":s", 2, replicas=1).acquire()
    assert waits(sentinels) >= now + 4
    for g in (multi, reader, permit):
        g.release()
    leader.resign()
    client.close()


@pytest.mark.scenario("replicas-unsafe")
def test_too_few_replicas_release_the_grant_and_raise_not_safely_acquired(sentinels):
    key = unique("unsafe")
    client = LockClient.from_sentinel(sentinels.addresses, SentinelSet.NAME)
    master = sentinels.master()
    started = time.monotonic()
    with pytest.raises(NotSafelyAcquired) as unsafe:
        client.lock(key, replicas=3, replicas_timeout=0.3).acquire()  # two replicas exist
    assert time.monotonic() - started >= 0.3  # WAIT waited its timeout
    assert unsafe.value.acknowledged == 2 and unsafe.value.wanted == 3
    # Two replicas are connected, three wanted: the refusal says so first.
    assert unsafe.value.why == (
        "the master has 2 connected replicas, 3 needed: "
        "2 of 3 replicas acknowledged within 300 ms (WAIT)"
    ), unsafe.value.why
    assert unsafe.value.token > 0 and unsafe.value.tokens == (unsafe.value.token,)
    assert info(master, key) is None  # released
    # After a wait: granted when the holder leaves, then the same.
    holder = client.lock(key).acquire()
    threading.Timer(0.3, holder.release).start()
    with pytest.raises(NotSafelyAcquired) as after_wait:
        client.lock(key, replicas=3, replicas_timeout=0.3, wait_timeout=5).acquire()
    assert after_wait.value.token > holder.token
    assert info(master, key) is None
    # A multi-key lock and a campaign: released as well.
    with pytest.raises(NotSafelyAcquired):
        client.multi_lock([key + ":a", key + ":b"], replicas=3, replicas_timeout=0.3).acquire()
    assert info(master, key + ":a") is None and info(master, key + ":b") is None
    with pytest.raises(NotSafelyAcquired):
        client.election(key + ":e", replicas=3, replicas_timeout=0.3).campaign()
    assert info(master, key + ":e") is None
    # The handle is not left holding anything: the next acquire is a new grant.
    again = client.lock(key, replicas=2).acquire()
    assert again.token > after_wait.value.token
    again.release()
    client.close()


@pytest.mark.scenario("replicas-ack")
def test_renewals_no_replica_acknowledged_report_unreplicated_and_release_the_hold(sentinels):
    key = unique("unacked")
    client = LockClient.from_sentinel(sentinels.addresses, SentinelSet.NAME)
    master = sentinels.master()
    seen: list[LostReason] = []
    lease = 3.0
    guard = client.lock(key, lease=lease, replicas=1, replicas_timeout=0.2,
                        on_lost=seen.append).acquire()
    replicas = sentinels.replicas()
    for r in replicas:
        os.kill(r.proc.pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        renews = master.commandstat("lock.renew")
        releases = master.commandstat("lock.release")
        assert guard.lost.wait(lease + 2)
        lost_at = time.monotonic()
        # The master kept answering the renewals 1, but no replica acknowledged any: the
        # deadline (90 % of the lease after the last acknowledged renewal) passed. Not
        # unreachable: the master answered.
        assert guard.lost_reason is LostReason.UNREPLICATED
        wait_until(lambda: seen, "on_lost called")  # just after ``lost`` is set
        assert seen == [LostReason.UNREPLICATED]
        assert lost_at - stopped < lease + 1.0
        assert master.commandstat("lock.renew") > renews
        # The master still had it (renewed until the loss, a lease to go): released there by
        # its token at once, not left to its lease.
        wait_until(lambda: master.commandstat("lock.release") > releases, "released", bound=1.0)
        assert master.client().execute_command("LOCK.CHECK", key, guard.owner, guard.token) == 0
        assert time.monotonic() - lost_at < lease / 2
    finally:
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGCONT)
    wait_until(lambda: master.client().execute_command("WAIT", 2, 1000) == 2, "replicas back",
               bound=20)
    client.close()


def test_a_replicas_refusal_on_a_master_without_replicas_says_so(server):
    # The set-up a failover leaves behind 1 master + 1 replica: a master with no replica. No
    # wait could be acknowledged, and the refusal says why, not only "0 of 1 acknowledged".
    key = unique("alone")
    client = LockClient.from_url(server.url)
    with pytest.raises(NotSafelyAcquired) as refused:
        client.lock(key, replicas=1, replicas_timeout=0.2).acquire()
    assert refused.value.why == (
        "the master has 0 connected replicas, 1 needed: "
        "0 of 1 replicas acknowledged within 200 ms (WAIT)"
    ), refused.value.why
    assert str(refused.value).endswith(refused.value.why)
    assert info(server, key) is None  # released by its token: the key is free
    client.close()


@pytest.mark.scenario("replicas-unsafe")
def test_aof_waits_with_waitaof_and_a_server_that_cannot_is_an_error(sentinels):
    # The set runs without appendonly: WAITAOF 1 ... is refused (Redis 7.2+), or unknown (7.0).
    key = unique("aof")
    client = LockClient.from_sentinel(sentinels.addresses, SentinelSet.NAME)
    master = sentinels.master()
    with pytest.raises(LockServerError) as refused:
        client.lock(key, aof=True).acquire()
    assert "WAITAOF" in str(refused.value) or "waitaof" in str(refused.value)
    assert info(master, key) is None  # released
    client.close()


@pytest.mark.scenario("sentinel-failover")
def test_a_failover_moves_renewals_waits_and_signals_to_the_new_master(sentinel_set):
    s = sentinel_set
    # The holds' deadlines (90 % of a lease from the last renewal sent, up to a third of a lease
    # before the kill) must come after the failover and the client's switch, which a loaded
    # machine stretched past 7 s (the Rust twin of this test, make soak): 20 s leaves 11 s.
    lease = 20.0
    kept_key, wait_key, eph_key, elect_key = (unique(t) for t in ("kept", "wait", "eph", "elect"))
    client = LockClient.from_sentinel(s.addresses, SentinelSet.NAME)
    old = s.master()
    kept = client.lock(kept_key, lease=lease).acquire()
    ephemeral = client.lock(eph_key, lease=lease, ephemeral=True).acquire()
    old.client().execute_command("LOCK.ACQUIRE", wait_key, "blocker", 30000)
    results: dict[str, object] = {}

    def wait(name: str, **options: object) -> None:
        try:
            results[name] = client.lock(wait_key, lease=lease, wait_timeout=60,
                                        **options).acquire()
        except Exception as e:  # noqa: BLE001 - looked at below
            results[name] = e

    waiters = [threading.Thread(target=wait, args=("plain",)),
               threading.Thread(target=wait, args=("ephemeral",), kwargs={"ephemeral": True})]
    for t in waiters:
        t.start()
    wait_until(lambda: waiting(old, wait_key) == 2, "both waiting")
    election = client.election(elect_key, "leader", lease=lease, ephemeral=False)
    leadership = election.campaign(value="before")
    seen: "queue.Queue[object]" = queue.Queue()
    observer = election.observe()
    threading.Thread(target=lambda: [seen.put(x) for x in observer], daemon=True).start()
    assert seen.get(timeout=5).value == b"before"
    s.wait_replicated()

    old.proc.kill()
    old.proc.wait()
    new = s.wait_for_failover(old)

    # The EPHEMERAL hold is reported lost (its connection is gone).
    assert ephemeral.lost.wait(10) and ephemeral.lost_reason is LostReason.CONNECTION_CLOSED
    # The replicated hold is renewed on the new master.
    renews = new.commandstat("lock.renew")
    wait_until(lambda: new.commandstat("lock.renew") > renews, "a renewal on the new master",
               bound=lease)
    assert not kept.lost.is_set() and info(new, kept_key)[b"token"] == kept.token
    # Both waits were issued again on the new master (the EPHEMERAL one on a new connection
    # of its own), where the blocker still holds; each is granted there in turn.
    wait_until(lambda: waiting(new, wait_key) == 2, "both waiting again", bound=15)
    granted_in_turn(new, wait_key, results, ["plain", "ephemeral"])
    # The lost-hold signal is heard from the new master.
    channel = lost_signal_channel(kept_key)
    wait_until(lambda: new.client().execute_command("PUBSUB", "NUMSUB", channel)[1] == 1,
               "subscribed on the new master", bound=15)
    new.client().execute_command("LOCK.FORCERELEASE", kept_key)
    assert kept.lost.wait(2) and kept.lost_reason is LostReason.FORCE_RELEASED
    # The leader leads on the new master, and the observer follows it there.
    assert leadership.proclaim("after")
    deadline = time.monotonic() + 15
    while True:
        got = seen.get(timeout=max(deadline - time.monotonic(), 0.01))
        if getattr(got, "value", None) == b"after":
            break
    assert leadership.resign() is Release.RELEASED
    observer.close()
    client.close()


@pytest.mark.scenario("sentinel-failover")
def test_async_a_hold_the_new_master_never_got_is_lost_at_its_first_renewal(tmp_path):
    # The replicas are writable here, so that the hold can be taken out of them (DEL on each,
    # not replicated): the promoted one never had it, as if the master died before sending it.
    # The master is paused (SIGSTOP), not killed: the asyncio client's listener and wait leave
    # it for the new master while it is still paused.
    s = start_sentinel_set(tmp_path, "--replica-read-only", "no")
    old = s.master()
    try:
        async def main() -> None:
            lease = 10.0
            async with AsyncLockClient.from_sentinel(s.addresses, SentinelSet.NAME,
                                                     command_timeout=1.0) as client:
                gone_key, kept_key, wait_key = unique("gone"), unique("kept"), unique("wait")
                gone = await client.lock(gone_key, lease=lease).acquire()
                kept = await client.lock(kept_key, lease=lease).acquire()
                old.client().execute_command("LOCK.ACQUIRE", wait_key, "blocker", 30000)
                waiter = asyncio.ensure_future(client.lock(wait_key, lease=lease).acquire())
                for _ in range(100):
                    if waiting(old, wait_key):
                        break
                    await asyncio.sleep(0.05)
                s.wait_replicated()
                for r in s.replicas():
                    assert r.client().delete(gone_key) == 1
                os.kill(old.proc.pid, signal.SIGSTOP)
                new = s.wait_for_failover(old)
                assert info(new, gone_key) is None and info(new, kept_key) is not None
                await asyncio.wait_for(gone.lost.wait(), lease)  # the first renewal there
                assert gone.lost_reason is LostReason.HOLD_GONE
                assert not kept.lost.is_set() and info(new, kept_key)[b"token"] == kept.token
                channel = lost_signal_channel(kept_key)
                for _ in range(200):
                    if new.client().execute_command("PUBSUB", "NUMSUB", channel)[1] == 1:
                        break
                    await asyncio.sleep(0.05)
                new.client().execute_command("LOCK.FORCERELEASE", kept_key)
                await asyncio.wait_for(kept.lost.wait(), 2)  # heard from the new master
                assert kept.lost_reason is LostReason.FORCE_RELEASED
                for _ in range(200):
                    if waiting(new, wait_key):
                        break
                    await asyncio.sleep(0.05)
                new.client().execute_command("LOCK.FORCERELEASE", wait_key)
                granted = await asyncio.wait_for(waiter, 10)  # issued again there
                assert info(new, wait_key)[b"owner"] == granted.owner
                assert old.proc.poll() is None  # all while the old master was paused
                await granted.release()
        asyncio.run(main())
    finally:
        try:
            os.kill(old.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        s.stop()

def test_readme_sentinel_example_runs_as_printed(sentinels):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = readme.split("## Sentinel and replicas", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    code = code.replace(
        'SENTINELS = [("127.0.0.1", 26379), ("127.0.0.1", 26380), ("127.0.0.1", 26381)]',
        f"SENTINELS = {sentinels.addresses!r}")
    assert f"SENTINELS = {sentinels.addresses!r}" in code
    exec(compile(code, "README.md", "exec"), {})
    master = sentinels.master()
    assert master.client().get("orders:{42}:state") == b"paid"
    assert info(master, "orders:{42}") is None  # released by `with`


@pytest.mark.scenario("sentinel-failover")
def test_an_ephemeral_grant_whose_confirmation_a_failover_cut_is_released_on_the_new_master(
        sentinel_set):
    # The Rust library's failover-test finding, checked here too: the master pauses while an
    # EPHEMERAL grant's WAIT is unanswered. The master ends such a hold with its connection, but
    # the replica it reached keeps a copy bound to nothing; promoted, it would keep the hold for
    # its lease. The library releases it by its token on the new master.
    s = sentinel_set
    key = unique("cut")
    lease = 30.0
    client = LockClient.from_sentinel(s.addresses, SentinelSet.NAME)
    old = s.master()
    replicas = s.replicas()
    for r in replicas:  # the grant waits in their sockets; nothing acknowledges it
        os.kill(r.proc.pid, signal.SIGSTOP)
    result: dict[str, object] = {}

    def ask() -> None:
        try:
            result["r"] = client.lock(key, lease=lease, ephemeral=True, replicas=1,
                                      replicas_timeout=1.5).acquire()
        except Exception as e:  # noqa: BLE001 - looked at below
            result["r"] = e

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        wait_until(lambda: info(old, key) is not None, "granted on the master", bound=10)
        os.kill(old.proc.pid, signal.SIGSTOP)
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGCONT)
        new = s.wait_for_failover(old)
        asking.join(60)
        got = result.get("r")
        # Refused, or asked again on the new master (a grant of its own, another token).
        assert isinstance(got, (LockError, LockGuard)), result
        promoted = time.monotonic()

        def cut_held() -> bool:
            holder = info(new, key)
            return holder is not None and (not isinstance(got, LockGuard)
                                           or holder[b"token"] != got.token)

        wait_until(lambda: not cut_held(), "the cut grant released on the new master",
                   bound=lease / 2)
        assert time.monotonic() - promoted < lease / 2
        if isinstance(got, LockGuard):
            assert info(new, key)[b"token"] == got.token
            assert got.release() is Release.RELEASED
    finally:
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGCONT)
        os.kill(old.proc.pid, signal.SIGCONT)
    client.close()


def test_a_paused_master_is_left_for_the_new_one_while_it_is_still_paused(sentinel_set):
    # SIGSTOP past down-after-milliseconds: the Sentinels promote a replica while the old master
    # still holds the library's connections open, answering nothing. A renewal to it times out
    # (its connection is dropped; the next one asks the Sentinels and reaches the new master),
    # and the signal listener, the observer and the waits, whose connections do not break,
    # leave the old master as soon as the Sentinels name another: all before it resumes.
    s = sentinel_set
    lease = 10.0
    key, elect_key = unique("paused"), unique("elect")
    client = LockClient.from_sentinel(s.addresses, SentinelSet.NAME, command_timeout=1.0)
    guard = client.lock(key, lease=lease).acquire()
    wait_key = unique("wait")
    s.master().client().execute_command("LOCK.ACQUIRE", wait_key, "blocker", 30000)
    results: dict[str, object] = {}

    def wait(name: str, **options: object) -> None:
        try:
            results[name] = client.lock(wait_key, lease=lease, **options).acquire()
        except Exception as e:  # noqa: BLE001 - looked at below
            results[name] = e

    waiters = [threading.Thread(target=wait, args=("plain",)),  # waits as long as it takes
               threading.Thread(target=wait, args=("ephemeral",), kwargs={"ephemeral": True})]
    for t in waiters:
        t.start()
    wait_until(lambda: waiting(s.master(), wait_key) == 2, "both waiting")
    election = client.election(elect_key, "leader", lease=lease, ephemeral=False)
    leadership = election.campaign(value="before")
    seen: "queue.Queue[object]" = queue.Queue()
    observer = election.observe()
    threading.Thread(target=lambda: [seen.put(x) for x in observer], daemon=True).start()
    assert seen.get(timeout=5).value == b"before"
    # A client whose commands may take 30 s: one left waiting on the paused master ends as soon
    # as this client hears of the new master (its hold's signal listener asks the Sentinels
    # every half second), not at its timeout. Before: 30 s after the pause.
    patient = LockClient.from_sentinel(s.addresses, SentinelSet.NAME, command_timeout=30.0)
    patient_guard = patient.lock(unique("patient"), lease=lease).acquire()
    in_flight_ended: "queue.Queue[float]" = queue.Queue()

    def in_flight() -> None:
        try:
            patient.lock(unique("in-flight"), lease=lease).try_acquire()
        except LockError:
            pass  # no answer: what it ran into is not the point, when it ended is
        in_flight_ended.put(time.monotonic())

    s.wait_replicated()
    old = s.master()
    os.kill(old.proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        threading.Thread(target=in_flight, daemon=True).start()
        new = s.wait_for_failover(old)
        # Within 10 s of the failover (a fifth of the way to the timeout), and not before the
        # Sentinels' down-after-milliseconds (3 s) had passed: it did wait on the paused master.
        ended = in_flight_ended.get(timeout=10)
        assert ended - paused > 3, "the command never waited on the paused master"
        renews = new.commandstat("lock.renew")
        wait_until(lambda: new.commandstat("lock.renew") > renews, "renewed on the new master",
                   bound=lease)
        assert not guard.lost.is_set()
        channel = lost_signal_channel(key)
        wait_until(lambda: new.client().execute_command("PUBSUB", "NUMSUB", channel)[1] == 1,
                   "the signal listener on the new master", bound=10)
        assert old.proc.poll() is None  # still paused, its connections still open
        new.client().execute_command("LOCK.FORCERELEASE", key)
        assert guard.lost.wait(2) and guard.lost_reason is LostReason.FORCE_RELEASED
        assert leadership.proclaim("after")  # renewed there too
        deadline = time.monotonic() + 10
        while getattr(seen.get(timeout=max(deadline - time.monotonic(), 0.01)), "value",
                      None) != b"after":
            pass
        # The waits on the paused master ended and were issued again on the new master (the
        # EPHEMERAL one on a new connection of its own), where the blocker's hold (replicated)
        # still is; each is granted there in turn.
        wait_until(lambda: waiting(new, wait_key) == 2, "both waiting there", bound=10)
        granted_in_turn(new, wait_key, results, ["plain", "ephemeral"])
        assert old.proc.poll() is None  # all of it while the old master was paused
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    leadership.resign()
    observer.close()
    client.close()
    patient_guard.release()
    patient.close()


def test_a_refusal_from_a_master_the_sentinels_no_longer_name_is_no_loss(sentinel_set,
                                                                         monkeypatch):
    # Found by the partition test: a master cut off from the Sentinels still serves the clients
    # that reach it, and does not have the holds the new master granted. A fenced write the
    # library sent there (its view of the Sentinels is up to half a second old) was refused
    # FENCED, and the guard was reported lost while the new master held it. Here the old master
    # stays a master, its clients connected (its ACL refuses the Sentinels' REPLICAOF and CLIENT
    # KILL), after a forced failover, and the library's view of the Sentinels is held still
    # (FOLLOW_PERIOD of a minute, no listener), so its write goes there. Before: Fenced, the guard lost. Now the refusal makes the
    # library ask the Sentinels afresh: it came from a server they no longer name, so it counts
    # as no answer, and the next write lands on the new master, which still has the hold.
    from redis_lock_client._sync import _connection

    s = sentinel_set
    key = unique("partitioned")
    client = LockClient.from_sentinel(s.addresses, SentinelSet.NAME, command_timeout=2.0,
                                      lost_signal=False)
    guard = client.lock(key, lease=30).acquire()
    assert guard.execute("SET", f"{key}:state", "0") == b"OK"  # a pooled connection to it
    s.wait_replicated()
    monkeypatch.setattr(_connection, "FOLLOW_PERIOD", 60.0)
    old = s.master()
    old.client().execute_command("ACL", "SETUSER", "default", "-replicaof", "-slaveof", "-client|kill")
    s.sentinel().execute_command("SENTINEL", "FAILOVER", SentinelSet.NAME)
    new = s.wait_for_failover(old)
    assert old.client().info("replication")["role"] == "master"  # two masters now
    old.client().execute_command("LOCK.FORCERELEASE", key)  # gone there, not on the new one
    with pytest.raises(LockError) as refused:
        guard.execute("SET", f"{key}:state", "a")
    assert not isinstance(refused.value, NotHeld), refused.value
    assert not guard.lost.is_set()
    assert guard.execute("SET", f"{key}:state", "b") == b"OK"
    assert new.client().get(f"{key}:state") == b"b"
    guard.release()
    client.close()


@pytest.mark.scenario("sentinel-failover")
def test_the_failover_driver_writes_a_line_per_hold_across_a_failover(sentinel_set, tmp_path):
    # The driver of the failover test (failover_driver.py) against a real failover: its lines
    # are what the checker reads; holds go on on the new master.
    import json
    import subprocess
    import sys
    from pathlib import Path

    s = sentinel_set
    out = tmp_path / "python.jsonl"
    here = Path(__file__).resolve().parent
    proc = subprocess.Popen(
        [sys.executable, str(here / "failover_driver.py"),
         "--sentinels", ",".join(f"{h}:{p}" for h, p in s.addresses), "--master", SentinelSet.NAME,
         "--exclusive", "fo:x", "--shared", "fo:r", "--semaphore", "fo:s", "--limit", "2",
         "--election", "fo:e", "--replicas", "1", "--duration", "9", "--lease", "3",
         "--holders", "2", "--out", str(out), "--seed", "7"],
        stderr=subprocess.PIPE)
    time.sleep(3)
    old = s.master()
    killed_ms = time.time() * 1000
    old.proc.kill()
    old.proc.wait()
    s.wait_for_failover(old)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    holds = [x for x in lines if "event" not in x]
    assert not [x for x in lines if x.get("event") == "unanswered"]
    assert {x["kind"] for x in holds} == {"exclusive", "shared", "permit", "leader"}
    for x in holds:
        assert x["lib"] == "python" and x["replicas"] == 1
        assert set(x) == {"lib", "replicas", "key", "kind", "limit", "owner", "token",
                          "asked_ms", "start_ms", "end_ms", "end"}
        assert x["asked_ms"] <= x["start_ms"]
        assert x["limit"] == (2 if x["kind"] == "permit" else None)
        assert x["start_ms"] <= x["end_ms"]
        assert x["end"] in ("released", "run-end") or x["end"].startswith("lost:")
    assert any(x["start_ms"] > killed_ms for x in holds), "no hold after the failover"
    # A token comes back only to its own owner, after the failover (seen: a release the old
    # master answered but did not replicate before it died is undone, and the handle's next
    # acquire, ONCE, is answered with the hold the new master still has).
    first: dict[tuple[str, int], dict[str, object]] = {}
    for x in sorted(holds, key=lambda x: x["start_ms"]):
        seen = first.setdefault((x["key"], x["token"]), x)
        if seen is not x:
            assert seen["owner"] == x["owner"] and seen["start_ms"] < killed_ms < x["start_ms"]
    for x in lines:
        if x.get("event") == "acquire-error":
            assert set(x) == {"lib", "event", "replicas", "key", "kind", "owner", "ms", "error"}


@pytest.mark.scenario("sentinel-failover")
def test_an_election_has_a_new_leader_within_seconds_of_a_failover_not_a_lease(sentinel_set):
    # The leadership is EPHEMERAL (the default): after the failover the new master has it
    # bound to nothing until its lease (30 s) ends. The leader's library releases it there by
    # its token as soon as it sees the master replaced, so the waiting candidate leads then:
    # its one campaign, EPHEMERAL too, is asked again on the new master by the library
    # (before, it raised LockConnectionError, and only a candidate that campaigned again led).
    s = sentinel_set
    key = unique("elect")
    first = LockClient.from_sentinel(s.addresses, SentinelSet.NAME)
    second = LockClient.from_sentinel(s.addresses, SentinelSet.NAME)
    old = s.master()
    leadership = first.election(key, "first").campaign()
    led: "queue.Queue[object]" = queue.Queue()

    def candidate() -> None:
        try:
            led.put((time.monotonic(), second.election(key, "second").campaign()))
        except LockError as e:
            led.put(e)

    threading.Thread(target=candidate, daemon=True).start()
    wait_until(lambda: waiting(old, key) == 1, "the second candidate waiting")
    s.wait_replicated()
    old.proc.kill()
    old.proc.wait()
    killed = time.monotonic()
    new = s.wait_for_failover(old)
    got = led.get(timeout=15)
    assert isinstance(got, tuple), f"the second candidate's campaign: {got!r}"
    at, second_leadership = got
    assert at - killed < 15, f"led {at - killed:.1f} s after the kill (lease 30 s)"
    assert leadership.lost.wait(5)
    assert leadership.lost_reason is LostReason.CONNECTION_CLOSED
    assert info(new, key)[b"owner"] == second_leadership.owner
    assert second_leadership.resign() is Release.RELEASED
    first.close()
    second.close()


def test_an_answer_without_a_config_epoch_or_with_a_malformed_one_is_no_view():
    # As in the Rust library (master.rs sentinel_view): an answer that cannot be ranked counts
    # for nothing (before, a missing epoch was read as 0 here).
    from redis_lock_client._masters import named_master

    state = {"ip": "10.0.0.1", "port": 6379, "config-epoch": 2, "flags": "master"}
    assert named_master(state, lambda a: True, None) == (2, ("10.0.0.1", 6379))
    without = {k: v for k, v in state.items() if k != "config-epoch"}
    for answer in (without, {**state, "config-epoch": ""}, {**state, "config-epoch": "-1"},
                   {**state, "config-epoch": "x"}, {**state, "port": "x"}):
        assert named_master(answer, lambda a: True, None) is None, answer


def test_the_address_is_the_one_get_master_addr_by_name_gives():
    # The Sentinel leading a failover reports the new epoch with the old address in SENTINEL
    # MASTER until every replica is reconfigured; GET-MASTER-ADDR-BY-NAME names the promoted
    # replica already: the view takes its address from there.
    from redis_lock_client._masters import with_current_address

    state = {"ip": "10.0.0.1", "port": 6379, "config-epoch": 2, "flags": "master"}
    assert with_current_address(state, ("10.0.0.2", 6380)) == {
        **state, "ip": "10.0.0.2", "port": "6380"}
    assert with_current_address(state, (b"10.0.0.2", b"6380"))["ip"] == "10.0.0.2"
    assert with_current_address(state, None) is None
    error = ConnectionError("down")
    assert with_current_address(error, None) is error
