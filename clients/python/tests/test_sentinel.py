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
