"""Fenced commands (``guard.execute``: LOCK.GUARD through a hold), sync and asyncio, against a
real server (see conftest.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conftest import Server
from redis_lock_client import (
    AsyncLockClient,
    Fenced,
    LockClient,
    LockServerError,
    LostReason,
    NotHeld,
    Release,
)


def guarded(server: Server) -> tuple[int, int]:
    """INFO lock's (lock_guarded, lock_fenced): tokens LOCK.GUARD admitted and refused."""
    info = server.client().info("lock")
    return int(info["lock_guarded"]), int(info["lock_fenced"])


@pytest.mark.scenario("fenced-write")
def test_execute_runs_the_command_through_the_fence_and_returns_its_reply(server, client, key):
    data = key + ":data"
    raw = server.client()
    guard = client.lock(key).acquire()
    admitted, _ = guarded(server)
    assert guard.execute("SET", data, "paid") == b"OK"
    assert guard.execute("GET", data) == b"paid"  # the inner reply, as redis-py gives it
    assert guard.execute("RPUSH", data + ":log", guard.token) == 1
    assert guard.execute("LRANGE", data + ":log", 0, -1) == [str(guard.token).encode()]
    assert guard.execute("GET", data + ":none") is None
    assert guarded(server)[0] == admitted + 5  # each one through LOCK.GUARD
    assert raw.get(data) == b"paid"
    assert not guard.lost.is_set()
    assert guard.release() is Release.RELEASED


@pytest.mark.scenario("fenced-refused")
def test_a_fenced_refusal_raises_and_reports_the_hold_gone_and_writes_nothing(server, key):
    # No lost signal: the fence alone tells (the watchdog's next renewal is 10 s away).
    client = LockClient.from_url(server.url, lost_signal=False)
    data = key + ":data"
    raw = server.client()
    seen: list[LostReason] = []
    guard = client.lock(key, on_lost=seen.append).acquire()
    guard.execute("SET", data, "first")
    raw.execute_command("LOCK.FORCERELEASE", key)
    _, fenced = guarded(server)
    with pytest.raises(Fenced) as refused:
        guard.execute("SET", data, "stale")
    assert refused.value.reason is LostReason.HOLD_GONE
    assert isinstance(refused.value, NotHeld)
    assert refused.value.line.startswith("FENCED the hold is gone")
    assert raw.get(data) == b"first"  # the command did not run
    assert guarded(server)[1] == fenced + 1
    assert guard.lost.is_set() and guard.lost_reason is LostReason.HOLD_GONE
    assert seen == [LostReason.HOLD_GONE]  # on_lost ran before execute raised
    # Lost: nothing more is sent, and the release raises as for any loss.
    calls = server.commandstat("lock.guard")
    with pytest.raises(NotHeld) as again:
        guard.execute("SET", data, "later")
    assert not isinstance(again.value, Fenced) and again.value.reason is LostReason.HOLD_GONE
    assert server.commandstat("lock.guard") == calls
    with pytest.raises(NotHeld):
        guard.release()
    client.close()


@pytest.mark.scenario("fenced-refused")
def test_a_token_that_is_not_current_is_reported_as_such(server, key):
    # Two handles under one owner name (the application named them alike): the second holds the
    # key under a newer token after the first was force-released unheard.
    client = LockClient.from_url(server.url, lost_signal=False)
    data = key + ":data"
    first = client.lock(key, owner=b"worker").acquire()
    server.client().execute_command("LOCK.FORCERELEASE", key)
    second = client.lock(key, owner=b"worker").acquire()
    assert second.token > first.token
    with pytest.raises(Fenced) as refused:
        first.execute("SET", data, "stale")
    assert refused.value.reason is LostReason.TOKEN_NOT_CURRENT
    assert refused.value.line.startswith("FENCED the token is not current")
    assert first.lost_reason is LostReason.TOKEN_NOT_CURRENT
    assert second.execute("SET", data, "fresh") is not None
    assert not second.lost.is_set()
    assert server.client().get(data) == b"fresh"
    assert second.release() is Release.RELEASED
    client.close()


@pytest.mark.scenario("fenced-write")
def test_the_commands_own_errors_raise_and_are_no_loss(server, client, key):
    data = key + ":data"
    raw = server.client()
    raw.set(data, "a string")
    guard = client.lock(key).acquire()
    with pytest.raises(LockServerError) as wrong:
        guard.execute("LPUSH", data, "x")
    assert str(wrong.value).startswith("WRONGTYPE")
    with pytest.raises(LockServerError, match="never runs a command on the lock's own key"):
        guard.execute("SET", key, "x")
    with pytest.raises(LockServerError, match="only commands that name keys"):
        guard.execute("PING")
    with pytest.raises(ValueError):
        guard.execute()
    assert not isinstance(wrong.value, NotHeld)
    assert not guard.lost.is_set() and guard.lost_reason is None
    reader = client.read_lock(key + ":shared").acquire()
    assert reader.execute("GET", data) == b"a string"  # a shared hold reads
    with pytest.raises(LockServerError, match="SHARED hold runs only read-only"):
        reader.execute("SET", data, "written")
    assert raw.get(data) == b"a string" and not reader.lost.is_set()
    assert reader.release() is Release.RELEASED
    assert guard.release() is Release.RELEASED


@pytest.mark.scenario("fenced-write")
def test_a_user_who_may_not_set_may_not_set_through_the_fence(fresh_server, key):
    raw = fresh_server.client()
    raw.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "~*", "&*", "+@all", "-set")
    client = LockClient(host="127.0.0.1", port=fresh_server.port, username="reader", password="pw")
    guard = client.lock(key).acquire()
    with pytest.raises(LockServerError) as denied:
        guard.execute("SET", key + ":data", "x")
    assert str(denied.value).startswith("NOPERM")
    assert raw.get(key + ":data") is None and not guard.lost.is_set()
    assert guard.execute("RPUSH", key + ":list", "x") == 1  # what it may do, it does
    assert guard.release() is Release.RELEASED
    client.close()


@pytest.mark.scenario("fenced-write")
def test_a_released_guard_sends_nothing(server, client, key):
    handle = client.lock(key)
    outer = handle.acquire()
    inner = handle.acquire()  # a re-entry: the same hold
    assert inner.release() is Release.STILL_HELD
    calls = server.commandstat("lock.guard")
    with pytest.raises(NotHeld):
        inner.execute("SET", key + ":data", "x")  # this guard was released
    assert server.commandstat("lock.guard") == calls
    assert outer.execute("SET", key + ":data", "y") is not None  # the hold is still there
    assert outer.release() is Release.RELEASED
    with pytest.raises(NotHeld):
        outer.execute("SET", key + ":data", "z")
    assert server.client().get(key + ":data") == b"y"


@pytest.mark.scenario("fenced-write")
def test_an_ephemeral_hold_fences_on_its_own_connection(server, client, key):
    data = key + ":data"
    guard = client.lock(key, ephemeral=True).acquire()
    assert guard.execute("SET", data, "v") is not None
    # LOCK.GUARD ran on the hold's connection (named for its owner), not a pooled one.
    listed = server.client().execute_command("CLIENT", "LIST").decode().splitlines()
    own = [line for line in listed if f"name=redis-lock-client:{guard.owner.decode()}" in line]
    assert len(own) == 1 and "cmd=lock.guard" in own[0]
    assert guard.release() is Release.RELEASED


@pytest.mark.scenario("fenced-multi")
def test_a_multi_key_guard_fences_each_key_with_its_own_token(server, key):
    client = LockClient.from_url(server.url, lost_signal=False)
    a, b = key + ":a", key + ":b"
    raw = server.client()
    guard = client.multi_lock([a, b]).acquire()
    assert guard.execute(a, "SET", a + ":data", guard.tokens[a]) is not None
    assert guard.execute(b.encode(), "SET", b + ":data", guard.tokens[b]) is not None
    assert raw.get(a + ":data") == str(guard.tokens[a]).encode()
    with pytest.raises(ValueError):
        guard.execute(key + ":c", "SET", "x", "1")
    raw.execute_command("LOCK.FORCERELEASE", b)
    assert guard.execute(a, "SET", a + ":data", "still") is not None  # a's hold is there
    with pytest.raises(Fenced) as refused:
        guard.execute(b, "SET", b + ":data", "stale")
    assert refused.value.reason is LostReason.HOLD_GONE
    assert guard.lost.is_set()  # the hold is one hold: lost with any key
    with pytest.raises(NotHeld):
        guard.execute(a, "SET", a + ":data", "after")
    assert raw.get(b + ":data") == str(guard.tokens[b]).encode()
    assert raw.get(a + ":data") == b"still"
    with pytest.raises(NotHeld):
        guard.release()  # and frees a at once
    assert raw.execute_command("LOCK.INFO", a) is None
    client.close()


@pytest.mark.scenario("fenced-election")
def test_a_leader_fences_with_its_epoch_and_a_deposed_one_writes_nothing(server, key):
    client = LockClient.from_url(server.url, lost_signal=False)
    data = key + ":config"
    raw = server.client()
    first = client.election(key, "a", ephemeral=False).campaign()
    assert first.execute("SET", data, "from a") is not None
    raw.execute_command("LOCK.FORCERELEASE", key)
    second = client.election(key, "b").campaign(timeout=5)
    assert second.epoch > first.epoch
    with pytest.raises(Fenced) as refused:
        first.execute("SET", data, "stale from a")
    assert refused.value.reason is LostReason.HOLD_GONE
    assert first.lost.is_set() and not first.proclaim("x")
    assert second.execute("SET", data, "from b") is not None
    assert raw.get(data) == b"from b"
    assert second.resign() is Release.RELEASED
    client.close()


@pytest.mark.scenario("fenced-write", "fenced-refused", "fenced-multi", "fenced-election")
def test_async_execute_fences_like_the_sync_one(server, key):
    async def main() -> None:
        raw = server.client()
        data = key + ":data"
        async with AsyncLockClient.from_url(server.url, lost_signal=False) as client:
            seen: list[LostReason] = []
            guard = await client.lock(key, on_lost=seen.append).acquire()
            assert await guard.execute("SET", data, "one") is not None
            assert await guard.execute("GET", data) == b"one"
            raw.execute_command("LOCK.FORCERELEASE", key)
            with pytest.raises(Fenced) as refused:
                await guard.execute("SET", data, "stale")
            assert refused.value.reason is LostReason.HOLD_GONE
            assert guard.lost.is_set() and seen == [LostReason.HOLD_GONE]
            with pytest.raises(NotHeld):
                await guard.release()
            multi = await client.multi_lock([key + ":a", key + ":b"]).acquire()
            assert await multi.execute(key + ":b", "SET", data, "multi") is not None
            await multi.release()
            leadership = await client.election(key + ":e").campaign()
            assert await leadership.execute("SET", data, "leader") is not None
            await leadership.resign()
            with pytest.raises(NotHeld):
                await leadership.execute("SET", data, "resigned")
        assert raw.get(data) == b"leader"
    asyncio.run(main())


def test_readme_fenced_writes_example_runs_as_printed(server, key):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Fenced writes", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    code = code.replace("redis://127.0.0.1:6379/", server.url)
    exec(compile(code, "README.md", "exec"), {})
    raw = server.client()
    assert raw.get("orders:{42}:state") == b"paid"
    assert raw.lrange("orders:{42}:log", 0, -1) == [b"paid"]
    assert raw.execute_command("LOCK.INFO", "orders:{42}") is None  # released by `with`
