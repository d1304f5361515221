"""Leader election (client.election: LOCK.CAMPAIGN / PROCLAIM / LEADER and the leader channel),
sync and asyncio, against a real server with the module (see conftest.py). Leaders that die or
stall are real processes (SIGKILL, SIGSTOP). The cluster cases are in test_cluster.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Server, info, wait_until
from redis_lock_client import (
    AsyncLockClient,
    Leader,
    LockClient,
    LockTimeout,
    LostReason,
    NotHeld,
    Release,
    leader_channel,
)


def in_thread(fn) -> "queue.Queue[Any]":
    """Runs `fn` on a thread; its result (or exception) lands in the returned queue."""
    out: "queue.Queue[Any]" = queue.Queue()

    def run() -> None:
        try:
            out.put(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.put(e)
    threading.Thread(target=run, daemon=True).start()
    return out


def next_within(observer, bound: float = 5.0):
    """The observer's next leader, failing (not hanging) when none comes within `bound`."""
    return in_thread(lambda: next(observer)).get(timeout=bound)


@pytest.mark.scenario("election-campaign", "election-leader", "election-resign")
def test_campaign_leads_with_an_epoch_and_resign_elects_the_waiting_candidate(server, client, key):
    a = client.election(key, "node-a")
    b = client.election(key, "node-b")
    assert a.leader() is None
    leadership = a.campaign(value="10.0.0.1:80")
    assert leadership.epoch > 0 and leadership.candidate == b"node-a"
    held = info(server, key)
    assert held[b"owner"] == b"node-a" and held[b"token"] == leadership.epoch
    assert isinstance(held[b"ephemeral"], int)  # EPHEMERAL by default, on its own connection
    assert a.leader() == Leader(b"node-a", leadership.epoch, b"10.0.0.1:80")
    assert b.leader() == a.leader()  # anyone reads it

    with pytest.raises(LockTimeout):
        b.campaign(timeout=0)  # one attempt
    with pytest.raises(LockTimeout):
        b.campaign(timeout=0.2)  # a wait in the server that passes
    assert info(server, key)[b"waiters"] == 0

    # Campaigning again while leading: the same leadership, one hold, the new value proclaimed.
    assert a.campaign(value="10.0.0.2:80") is leadership
    assert info(server, key)[b"count"] == 1
    assert a.leader() == Leader(b"node-a", leadership.epoch, b"10.0.0.2:80")

    waiting = in_thread(lambda: b.campaign(timeout=10))
    wait_until(lambda: info(server, key)[b"waiters"] == 1, "node-b waits in the server")
    assert leadership.resign() is Release.RELEASED
    successor = waiting.get(timeout=5)
    assert successor.epoch > leadership.epoch
    assert b.leader() == Leader(b"node-b", successor.epoch, None)  # no value in this epoch
    assert not leadership.lost.is_set()  # a resignation is not a loss
    assert leadership.proclaim("10.0.0.3:80") is False  # resigned: nothing is published
    assert b.leader() == Leader(b"node-b", successor.epoch, None)
    assert leadership.resign() is Release.ALREADY_RELEASED
    with successor:
        pass  # `with` resigns
    assert a.leader() is None and info(server, key) is None


@pytest.mark.scenario("election-campaign")
def test_the_default_candidate_is_a_name_of_its_own_and_ephemeral_can_be_turned_off(server, client, key):
    first, second = client.election(key), client.election(key)
    assert first.candidate != second.candidate
    with first.campaign(timeout=0) as leadership:
        assert first.leader().candidate == first.candidate == leadership.candidate
    with client.election(key, ephemeral=False, lease=1.5).campaign() as leadership:
        assert info(server, key)[b"ephemeral"] is None
        renews = server.commandstat("lock.renew")
        # Renewals every 0.5 s: three within a bound that only catches a hang.
        wait_until(lambda: server.commandstat("lock.renew") - renews >= 3, "renewed", 10)
        assert not leadership.lost.is_set()


@pytest.mark.scenario("election-proclaim")
def test_proclaim_publishes_only_while_leading(server, client, key):
    leadership = client.election(key, "node-a").campaign()
    assert leadership.proclaim("v1") is True
    assert client.election(key).leader() == Leader(b"node-a", leadership.epoch, b"v1")

    # Deposed, and told by the lost-hold signal: nothing is sent.
    server.client().execute_command("LOCK.FORCERELEASE", key)
    assert leadership.lost.wait(1.0)
    assert leadership.lost_reason is LostReason.FORCE_RELEASED
    calls = server.commandstat("lock.proclaim")
    assert leadership.proclaim("v2") is False
    assert server.commandstat("lock.proclaim") == calls
    with pytest.raises(NotHeld):
        leadership.resign()


@pytest.mark.scenario("election-proclaim")
def test_a_proclaim_the_server_refuses_reports_the_leadership_lost(server, key):
    with LockClient.from_url(server.url, lost_signal=False) as client:  # nothing tells it
        seen = []
        election = client.election(key, "node-a", on_lost=seen.append)
        leadership = election.campaign(value="v1")
        raw = server.client()
        raw.execute_command("LOCK.FORCERELEASE", key)
        assert raw.execute_command("LOCK.CAMPAIGN", key, "node-b", 30000) > leadership.epoch
        calls = server.commandstat("lock.proclaim")
        assert leadership.proclaim("v2") is False  # the server answered 0
        assert server.commandstat("lock.proclaim") == calls + 1
        assert leadership.lost.is_set() and seen == [LostReason.HOLD_GONE]
        assert election.leader() == Leader(b"node-b", election.leader().epoch, None)
        raw.execute_command("LOCK.RELEASE", key, "node-b")


@pytest.mark.scenario("election-observe")
def test_observe_yields_the_leaders_in_order_with_their_proclamations(server, client, key):
    a, b, c = (client.election(key, n) for n in ("node-a", "node-b", "node-c"))
    first = a.campaign(value="addr-a")
    seen: "queue.Queue[Leader]" = queue.Queue()
    observer = a.observe()

    def follow() -> None:
        for leader in observer:
            seen.put(leader)
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert seen.get(timeout=5) == Leader(b"node-a", first.epoch, b"addr-a")  # read at start
    assert first.proclaim("addr-a2")
    assert first.proclaim("addr-a2")  # the same value again: not a change
    assert seen.get(timeout=5) == Leader(b"node-a", first.epoch, b"addr-a2")

    waiting = in_thread(lambda: b.campaign(value="addr-b", timeout=10))
    wait_until(lambda: info(server, key)[b"waiters"] == 1, "node-b waits")
    first.resign()
    second = waiting.get(timeout=5)
    # Elected with its value (at the grant): the read after the messages finds both.
    assert seen.get(timeout=5) == Leader(b"node-b", second.epoch, b"addr-b")
    second.resign()
    third = c.campaign()
    assert seen.get(timeout=5) == Leader(b"node-c", third.epoch, None)
    assert first.epoch < second.epoch < third.epoch
    third.resign()

    observer.close()  # from another thread: the blocked iteration ends
    thread.join(5)
    assert not thread.is_alive()
    assert seen.empty()


@pytest.mark.scenario("election-observe-reconnect")
def test_an_observer_reads_the_leader_again_when_it_reconnects(server, client, key):
    raw = server.client()
    epoch_x = raw.execute_command("LOCK.CAMPAIGN", key, "x", 30000, "VALUE", "vx")
    with client.election(key).observe() as observer:
        assert next_within(observer) == Leader(b"x", epoch_x, b"vx")
        reads = server.commandstat("lock.leader")
        # The observer's connection is killed, and only then is y elected: its messages go to
        # nobody. The observer must read LOCK.LEADER again when it reconnects to know.
        pipe = raw.pipeline(transaction=True)
        pipe.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        pipe.execute_command("LOCK.RELEASE", key, "x")
        pipe.execute_command("LOCK.CAMPAIGN", key, "y", 30000, "VALUE", "vy")
        epoch_y = pipe.execute()[2]
        assert epoch_y > epoch_x
        assert next_within(observer) == Leader(b"y", epoch_y, b"vy")  # not (y, None): no message seen
        assert server.commandstat("lock.leader") == reads + 1
    raw.execute_command("LOCK.RELEASE", key, "y")


LEADER_PROCESS = r"""
import json, sys, time
import redis
from redis_lock_client import LockClient

url, key, lease, mode = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
FENCE = sys.stdin.readline()
client = LockClient.from_url(url)
events = []
election = client.election(key, "old", lease=lease,
                           on_lost=lambda reason: events.append("lost " + reason.value))
leadership = election.campaign(value="old-addr")
print(leadership.epoch, flush=True)
if mode == "kill":
    time.sleep(60)
sys.stdin.readline()  # paused around here; resumed, the test says go
ok = leadership.proclaim("old-again")  # the first thing it does on resume
events.append(f"proclaim {ok}")
fenced = redis.Redis.from_url(url).eval(json.loads(FENCE), 1, key + ":resource",
                                        leadership.epoch, "from-old")
print(json.dumps({"events": events, "fenced": fenced}), flush=True)
"""

# A fenced resource: takes a write only with an epoch at least the highest it has seen.
FENCE = """
local seen = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'data', ARGV[2])
return 1
"""


def leader_process(server: Server, key: str, lease: float, mode: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LEADER_PROCESS, server.url, key, str(lease), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(FENCE) + "\n")
    proc.stdin.flush()
    return proc, int(proc.stdout.readline())


@pytest.mark.scenario("election-killed")
def test_a_killed_leader_process_is_succeeded_by_the_waiting_candidate_at_once(server, client, key):
    proc, old = leader_process(server, key, 30.0, "kill")  # a 30 s lease: only EPHEMERAL helps
    try:
        granted: "queue.Queue[Any]" = queue.Queue()

        def campaign() -> None:
            leadership = client.election(key, "new").campaign(timeout=10)
            granted.put((time.monotonic(), leadership))
        threading.Thread(target=campaign, daemon=True).start()
        observer = client.election(key).observe()
        assert next_within(observer).epoch == old
        announced = in_thread(lambda: (next(observer), time.monotonic()))
        wait_until(lambda: info(server, key)[b"waiters"] == 1, "the candidate waits")
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        at, leadership = granted.get(timeout=10)
        elected, heard = announced.get(timeout=10)
        observer.close()
        print(f"\nkilled leader process -> observer hears the next leader after "
              f"{(heard - killed) * 1000:.2f} ms, its campaign() returns after "
              f"{(at - killed) * 1000:.2f} ms")
        assert at - killed < 5.0  # a bound against a hang; 30 s would be the lease
        assert leadership.epoch > old
        assert elected == Leader(b"new", leadership.epoch, None)
        assert client.election(key).leader() == Leader(b"new", leadership.epoch, None)
        leadership.resign()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.scenario("election-paused")
def test_a_paused_leader_is_deposed_and_on_resume_loses_before_it_can_act(server, client, key):
    raw = server.client()
    proc, old = leader_process(server, key, 1.0, "pause")
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        # Its EPHEMERAL connection stays open: only its lease (1 s, no renewals now) ends it.
        new = client.election(key, "new").campaign(value="new-addr", timeout=10)
        assert new.epoch > old
        assert raw.eval(FENCE, 1, key + ":resource", new.epoch, "from-new") == 1
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        # Its lost fired, then its proclamation was refused; the resource refused its epoch.
        assert len(result["events"]) == 2, result
        assert result["events"][0].split()[0] == "lost", result
        assert result["events"][0].split()[1] in ("expired", "unreachable", "hold-gone")
        assert result["events"][1] == "proclaim False"
        assert result["fenced"] == 0
        assert raw.hget(key + ":resource", "data") == b"from-new"
        assert client.election(key).leader() == Leader(b"new", new.epoch, b"new-addr")
        new.resign()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.scenario("election-campaign", "election-leader", "election-proclaim",
                      "election-resign", "election-observe")
def test_async_election_campaigns_proclaims_observes_and_resigns(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            a, b = client.election(key, "node-a"), client.election(key, "node-b")
            assert await a.leader() is None
            seen: "asyncio.Queue[Leader]" = asyncio.Queue()
            observer = a.observe()

            async def follow() -> None:
                async for leader in observer:
                    await seen.put(leader)
            task = asyncio.create_task(follow())
            channel = leader_channel(key)
            while server.client().execute_command("PUBSUB", "NUMSUB", channel)[1] != 1:
                await asyncio.sleep(0.005)  # subscribed (and read nobody): now the campaign
            first = await a.campaign(value="addr-a")
            assert info(server, key)[b"token"] == first.epoch
            assert isinstance(info(server, key)[b"ephemeral"], int)
            assert await a.campaign() is first
            # Elected with its value: the read after the messages finds both.
            assert await asyncio.wait_for(seen.get(), 5) == Leader(b"node-a", first.epoch, b"addr-a")
            assert await first.proclaim("addr-a2") is True
            assert await asyncio.wait_for(seen.get(), 5) == Leader(b"node-a", first.epoch, b"addr-a2")
            assert await b.leader() == Leader(b"node-a", first.epoch, b"addr-a2")
            with pytest.raises(LockTimeout):
                await b.campaign(timeout=0.2)

            waiting = asyncio.create_task(b.campaign(timeout=10))
            while info(server, key)[b"waiters"] != 1:
                await asyncio.sleep(0.005)
            assert await first.resign() is Release.RELEASED
            second = await asyncio.wait_for(waiting, 5)
            assert second.epoch > first.epoch
            assert await asyncio.wait_for(seen.get(), 5) == Leader(b"node-b", second.epoch, None)

            server.client().execute_command("LOCK.FORCERELEASE", key)
            await asyncio.wait_for(second.lost.wait(), 1.0)
            assert await second.proclaim("late") is False
            assert await b.leader() is None
            await observer.aclose()
            await asyncio.wait_for(task, 5)
            assert seen.empty()
    asyncio.run(main())


@pytest.mark.scenario("election-proclaim")
def test_async_proclaim_past_the_local_deadline_reports_lost_and_sends_nothing(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url, lost_signal=False) as client:
            leadership = await client.election(key, lease=0.5).campaign()
            time.sleep(0.8)  # blocks the loop: no renewal, the lease ends in the server
            calls = server.commandstat("lock.proclaim")
            assert await leadership.proclaim("late") is False  # before the watchdog runs
            assert leadership.lost_reason is LostReason.UNREACHABLE
            assert server.commandstat("lock.proclaim") == calls
    asyncio.run(main())


def test_the_readmes_election_example_runs(server):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Leader election", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    code = code.replace("redis://127.0.0.1:6379/", server.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("leading in epoch ")
    epoch = int(lines[0].split()[-1])
    assert lines[1:] == [
        f"Leader(candidate=b'node-a', epoch={epoch}, value=b'10.0.0.1:80')",
        "resigned",
    ], lines
    assert info(server, "svc") is None
