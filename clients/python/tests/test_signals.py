"""The lost-hold and leader messages name their database and key: the library acts only on its
own (sync and asyncio), against a real server. Keys ``k`` and ``{k}`` share a channel, and so
does one key name in every database. The cluster cases (a key that moves with its slot) are in
test_cluster.py."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import pytest

from conftest import Server, info, reports_key_events, wait_until
from redis_lock_client import (
    AsyncLockClient,
    Leader,
    LockClient,
    LostReason,
    NotHeld,
    Release,
    leader_channel,
    lost_signal_channel,
)


def listen(server: Server, channel: bytes, db: int = 0) -> "queue.Queue[bytes]":
    """The messages of `channel`, as a raw client hears them (proof that the server sent what
    the library then had to ignore)."""
    heard: "queue.Queue[bytes]" = queue.Queue()
    conn = server.client(db=db)
    pubsub = conn.pubsub()
    pubsub.subscribe(channel)
    ready = threading.Event()

    def run() -> None:
        _ = conn  # alive while it listens: a collected client closes its pool's connections
        try:
            for message in pubsub.listen():
                if message["type"] == "subscribe":
                    ready.set()
                elif message["type"] == "message":
                    heard.put(message["data"])
        except Exception:  # noqa: BLE001 - the server is stopped at the end of the module
            pass
    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(5)
    return heard


def needs_key_events(server: Server) -> None:
    if not reports_key_events(server):
        pytest.skip("the server tells modules of no key removed from outside (Redis < 7.2): run "
                    "with LOCK_SERVER of Redis >= 7.2 or Valkey (scripts/server-deps.sh)")


@pytest.mark.scenario("lost-deleted", "signal-own-key")
@pytest.mark.parametrize("copy", ["other-db", "braced-key"])
def test_a_copy_of_a_lock_deleted_is_not_the_originals_loss(server, client, key, copy):
    needs_key_events(server)
    raw = server.client()
    guard = client.lock(key).acquire()  # lease 30 s: no renewal in this test
    heard = listen(server, lost_signal_channel(key))
    if copy == "other-db":  # a backup copy in db 1 (COPY keeps owner and token)
        assert raw.execute_command("COPY", key, key, "DB", 1) == 1
        server.client(db=1).delete(key)
        want = f"deleted 1 {guard.token} {len(key)} {key} ".encode() + guard.owner
    else:  # k and {k} share the channel lock.lost:{k}
        braced = "{" + key + "}"
        assert raw.execute_command("COPY", key, braced) == 1
        raw.delete(braced)
        want = f"deleted 0 {guard.token} {len(braced)} {braced} ".encode() + guard.owner
    assert heard.get(timeout=2) == want  # the server did say so, on the original's channel
    assert not guard.lost.wait(0.3)
    assert info(server, key)[b"token"] == guard.token
    raw.execute_command("LOCK.FORCERELEASE", key)  # still listening: its own loss is heard
    assert guard.lost.wait(1.0)
    assert guard.lost_reason is LostReason.FORCE_RELEASED


@pytest.mark.scenario("lost-forcereleased", "signal-own-key")
def test_a_one_hold_message_is_acted_on_only_when_it_names_db_key_owner_and_token(server, key):
    # Published by hand (any server): only the exact (db, key, owner, token) loses the hold.
    with LockClient.from_url(server.url) as client:
        raw = server.client()
        guard = client.lock(key).acquire()
        channel = lost_signal_channel(key)
        owner, token, k = guard.owner, guard.token, key.encode()

        def message(db: int, token: int, k: bytes, owner: bytes) -> bytes:
            return b"forcereleased %d %d %d %s %s" % (db, token, len(k), k, owner)
        for other in [message(1, token, k, owner), message(0, token, b"{" + k + b"}", owner),
                      message(0, token + 1, k, owner), message(0, token, k, owner + b"x"),
                      b"forcereleased %d %s" % (token, owner)]:  # the format before db and key
            assert raw.publish(channel, other) == 1  # heard by the library's listener
        assert not guard.lost.wait(0.3)
        raw.publish(channel, message(0, token, k, owner))
        assert guard.lost.wait(1.0)
        assert guard.lost_reason is LostReason.FORCE_RELEASED


@pytest.mark.scenario("signal-own-key")
def test_a_whole_key_message_is_checked_and_only_holds_really_gone_are_lost(fresh_server, key):
    server = fresh_server  # its own: LOCK.INFO is counted
    with LockClient.from_url(server.url) as client:
        raw = server.client()
        readers = [client.read_lock(key).acquire() for _ in range(2)]
        other = client.read_lock(key + ":other").acquire()
        before = server.commandstat("lock.info")
        # A whole-key message for a key whose holds are all there (a hold granted after the
        # message was published is not concerned; pub/sub is not ordered with commands).
        raw.publish(lost_signal_channel(key), f"deleted 0 * {len(key)} {key}")
        raw.publish(lost_signal_channel(key), f"deleted 1 * {len(key)} {key}")  # another db
        wait_until(lambda: server.commandstat("lock.info") >= before + 2, "each hold checked")
        time.sleep(0.2)
        assert server.commandstat("lock.info") == before + 2  # one read each, db 1's none
        assert not any(r.lost.is_set() for r in readers) and not other.lost.is_set()
        if reports_key_events(server):
            raw.delete(key)  # the server sends one whole-key message for the two holds
            for r in readers:
                assert r.lost.wait(1.0)
                assert r.lost_reason is LostReason.DELETED
            assert not other.lost.is_set()
        for r in readers:
            try:
                r.release()
            except NotHeld:
                pass
        assert other.release() is Release.RELEASED


@pytest.mark.scenario("signal-own-key")
def test_async_a_copy_or_a_whole_key_message_touches_only_its_own_holds(server, key):
    needs_key_events(server)

    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            raw = server.client()
            guard = await client.lock(key).acquire()
            shared = [await client.read_lock(key + ":r").acquire() for _ in range(2)]
            heard = listen(server, lost_signal_channel(key))
            assert raw.execute_command("COPY", key, key, "DB", 1) == 1
            server.client(db=1).delete(key)
            assert heard.get(timeout=2).startswith(b"deleted 1 ")
            await asyncio.sleep(0.3)
            assert not guard.lost.is_set()
            raw.delete(key + ":r")  # two holds: one whole-key message, checked, both gone
            for r in shared:
                await asyncio.wait_for(r.lost.wait(), 1.0)
                assert r.lost_reason is LostReason.DELETED
            assert not guard.lost.is_set()
            assert await guard.release() is Release.RELEASED
    asyncio.run(main())


def next_within(observer: Any, bound: float = 5.0) -> Leader:
    out: "queue.Queue[Any]" = queue.Queue()
    threading.Thread(target=lambda: out.put(next(observer)), daemon=True).start()
    return out.get(timeout=bound)


@pytest.mark.scenario("election-observe", "election-observe-own")
def test_elections_of_one_name_in_two_dbs_and_of_k_and_braced_k_are_observed_apart(server, key):
    braced = "{" + key + "}"
    assert leader_channel(key) == leader_channel(braced)
    db0, db1 = LockClient.from_url(server.url), LockClient.from_url(server.url + "1")
    try:
        plain0 = db0.election(key, "app0-node")
        plain1 = db1.election(key, "app1-node")
        brace0 = db0.election(braced, "braced-node")
        with plain0.observe() as o0, plain1.observe() as o1, brace0.observe() as ob:
            a = plain0.campaign(value="v0")
            assert next_within(o0) == Leader(b"app0-node", a.epoch, b"v0")
            # The same key name in db 1, and {key} in db 0: same channel, same slot, so their
            # epochs come from one counter and interleave.
            b = plain1.campaign(value="v1")
            c = brace0.campaign(value="vb")
            assert a.epoch < b.epoch < c.epoch
            assert next_within(o1) == Leader(b"app1-node", b.epoch, b"v1")
            assert next_within(ob) == Leader(b"braced-node", c.epoch, b"vb")
            # db 0's leader proclaims again in its (lower) epoch: its observer still follows it.
            assert a.proclaim("v0-2")
            assert next_within(o0) == Leader(b"app0-node", a.epoch, b"v0-2")
            assert b.proclaim("v1-2") and c.proclaim("vb-2")
            assert next_within(o1) == Leader(b"app1-node", b.epoch, b"v1-2")
            assert next_within(ob) == Leader(b"braced-node", c.epoch, b"vb-2")
            a.resign()
            d = db0.election(key, "app0-next").campaign()
            assert next_within(o0) == Leader(b"app0-next", d.epoch, None)
            for leadership in (b, c, d):
                leadership.resign()
    finally:
        db0.close()
        db1.close()


@pytest.mark.scenario("election-observe", "election-observe-own")
def test_async_an_observer_follows_only_its_own_db_and_key(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as db0, \
                AsyncLockClient.from_url(server.url + "1") as db1:
            mine = db0.election(key, "mine")
            async with mine.observe() as observer:
                first = await mine.campaign(value="m1")
                assert await asyncio.wait_for(observer.__anext__(), 5) == Leader(
                    b"mine", first.epoch, b"m1")
                other = await db1.election(key, "theirs").campaign(value="t1")
                braced = await db0.election("{" + key + "}", "braced").campaign(value="b1")
                assert first.epoch < other.epoch < braced.epoch
                assert await first.proclaim("m2")
                assert await asyncio.wait_for(observer.__anext__(), 5) == Leader(
                    b"mine", first.epoch, b"m2")
                for leadership in (first, other, braced):
                    await leadership.resign()
    asyncio.run(main())


@pytest.mark.scenario("signal-own-key", "lost-flushed")
def test_a_flushed_copy_db_does_not_touch_the_original(server, client, key):
    # FLUSHDB of db 1, where a copy of the lock was: the library checks nothing in db 0.
    raw = server.client()
    guard = client.lock(key).acquire()
    raw.execute_command("COPY", key, key, "DB", 1)
    before = server.commandstat("lock.info")
    server.client(db=1).flushdb()
    time.sleep(0.3)
    assert server.commandstat("lock.info") == before
    assert not guard.lost.is_set()
    assert guard.release() is Release.RELEASED

