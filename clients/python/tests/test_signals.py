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


@pytest.mark.scenario("lost-forcereleased", "signal-own-key", "signal-forged")
def test_a_one_hold_message_is_checked_only_when_it_names_db_key_owner_and_token(server, key):
    # Published by hand (any server): only the exact (db, key, owner, token) is checked, with
    # one LOCK.CHECK, and the hold is still there: nothing is reported. The server's own
    # message, once the hold is really gone, is.
    with LockClient.from_url(server.url) as client:
        raw = server.client()
        guard = client.lock(key).acquire()  # lease 30 s: no renewal (and its check) here
        channel = lost_signal_channel(key)
        owner, token, k = guard.owner, guard.token, key.encode()

        def message(db: int, token: int, k: bytes, owner: bytes) -> bytes:
            return b"forcereleased %d %d %d %s %s" % (db, token, len(k), k, owner)
        checks = server.commandstat("lock.check")
        for other in [message(1, token, k, owner), message(0, token, b"{" + k + b"}", owner),
                      message(0, token + 1, k, owner), message(0, token, k, owner + b"x"),
                      b"forcereleased %d %s" % (token, owner)]:  # the format before db and key
            assert raw.publish(channel, other) == 1  # heard by the library's listener
        assert not guard.lost.wait(0.3)
        assert server.commandstat("lock.check") == checks  # not even checked
        raw.publish(channel, message(0, token, k, owner))
        wait_until(lambda: server.commandstat("lock.check") == checks + 1, "checked")
        assert not guard.lost.wait(0.1)
        raw.execute_command("LOCK.FORCERELEASE", key)
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



def publisher_only(server: Server, channel: bytes) -> Any:
    """A connection as a user that may only PUBLISH on ``channel``: no key, no LOCK.* command."""
    server.client().execute_command(
        "ACL", "SETUSER", "forger", "on", ">pw", "resetkeys", "resetchannels",
        b"&" + channel, "+publish")
    return server.client(username="forger", password="pw")


def wait_subscribed(server: Server, channel: bytes) -> None:
    raw = server.client()
    wait_until(lambda: raw.pubsub_numsub(channel)[0][1] >= 1, f"{channel!r} subscribed")


@pytest.mark.scenario("signal-forged")
def test_a_forged_lost_message_is_checked_and_a_live_hold_stays_held_and_renewed(fresh_server, key):
    # Everything a lost message names (database, key, owner, token) is readable with LOCK.INFO,
    # and a user who may do nothing but publish on the channel can send one. A message is a
    # hint: the library reads the hold (LOCK.CHECK), and the server still holds it.
    server = fresh_server  # its own: the LOCK.CHECK count is this client's alone
    raw = server.client()
    forger = publisher_only(server, lost_signal_channel(key))
    client = LockClient.from_url(server.url)
    seen: list[LostReason] = []
    guard = client.lock(key, lease=0.9, on_lost=seen.append).acquire()
    owner, token = guard.owner, guard.token
    wait_subscribed(server, lost_signal_channel(key))
    checks = server.commandstat("lock.check")
    for reason in ("forcereleased", "disconnected", "expired", "deleted"):
        forger.publish(lost_signal_channel(key),
                       b"%s 0 %d %d %s %s" % (reason.encode(), token, len(key), key.encode(), owner))
    # Each message is checked with a read (the watchdog's renewals check too: at least four).
    wait_until(lambda: server.commandstat("lock.check") >= checks + 4 or guard.lost.is_set(),
               "the forged messages checked")
    time.sleep(0.05)
    assert not guard.lost.is_set(), f"a message alone reported {guard.lost_reason}"
    assert raw.execute_command("LOCK.CHECK", key, owner, token) == 1
    # Renewed past its lease: the watchdog goes on.
    renewals = server.commandstat("lock.renew")
    time.sleep(1.8)
    assert not guard.lost.is_set() and seen == []
    assert server.commandstat("lock.renew") >= renewals + 3
    assert raw.execute_command("LOCK.CHECK", key, owner, token) == 1
    # The real thing: reported at once, with the server's reason.
    raw.execute_command("LOCK.FORCERELEASE", key)
    assert guard.lost.wait(0.3)
    assert guard.lost_reason is LostReason.FORCE_RELEASED
    client.close()


@pytest.mark.scenario("signal-forged")
def test_async_a_forged_lost_message_leaves_a_live_hold_held(server, key):
    async def main() -> None:
        forger = publisher_only(server, lost_signal_channel(key))
        async with AsyncLockClient.from_url(server.url) as client:
            guard = await client.lock(key, lease=0.9).acquire()
            wait_subscribed(server, lost_signal_channel(key))
            forger.publish(lost_signal_channel(key), b"forcereleased 0 %d %d %s %s" % (
                guard.token, len(key), key.encode(), guard.owner))
            await asyncio.sleep(1.5)  # past its lease: renewed meanwhile
            assert not guard.lost.is_set(), f"a message alone reported {guard.lost_reason}"
            assert server.client().execute_command(
                "LOCK.CHECK", key, guard.owner, guard.token) == 1
            assert await guard.release() is Release.RELEASED
    asyncio.run(main())


@pytest.mark.scenario("election-observe-forged")
def test_forged_leader_messages_never_make_an_observer_follow_a_leader_the_server_did_not_elect(
        server, client, key):
    forger = publisher_only(server, leader_channel(key))
    fake = 9_000_000_000_000_000
    seen: "queue.Queue[Leader]" = queue.Queue()
    with client.election(key).observe() as observer:
        threading.Thread(target=lambda: [seen.put(leader) for leader in observer],
                         daemon=True).start()
        wait_subscribed(server, leader_channel(key))
        a = client.election(key, "node-a").campaign(value="10.0.0.1:80")

        def follows(want: Leader) -> list[Leader]:
            """What the observer yields until it yields ``want`` (within 5 s)."""
            got = [seen.get(timeout=5)]
            while got[-1] != want:
                got.append(seen.get(timeout=5))
            return got

        yielded = follows(Leader(b"node-a", a.epoch, b"10.0.0.1:80"))
        forger.publish(leader_channel(key), b"elected 0 %d %d %s evil-node" % (
            fake, len(key), key.encode()))
        forger.publish(leader_channel(key), b"proclaimed 0 %d %d %s 6.6.6.6:66" % (
            fake, len(key), key.encode()))
        time.sleep(0.3)
        # A real leader after the forgery is followed, with its value.
        a.resign()
        b = client.election(key, "node-b").campaign(value="10.0.0.2:80")
        assert b.epoch < fake
        yielded += follows(Leader(b"node-b", b.epoch, b"10.0.0.2:80"))
        # Its connection killed, the observer reads LOCK.LEADER again; b's next value follows.
        server.client().execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        wait_subscribed(server, leader_channel(key))
        assert b.proclaim("10.0.0.3:80")
        yielded += follows(Leader(b"node-b", b.epoch, b"10.0.0.3:80"))
        time.sleep(0.2)
        while not seen.empty():
            yielded.append(seen.get())
        b.resign()
    real = {(b"node-a", a.epoch), (b"node-b", b.epoch)}
    assert all((l.candidate, l.epoch) in real for l in yielded), yielded


@pytest.mark.scenario("election-observe-forged")
def test_async_forged_leader_messages_are_read_and_not_followed(server, key):
    async def main() -> None:
        forger = publisher_only(server, leader_channel(key))
        async with AsyncLockClient.from_url(server.url) as client:
            async with client.election(key).observe() as observer:
                a = await client.election(key, "node-a").campaign(value="va")
                assert await asyncio.wait_for(observer.__anext__(), 5) in (
                    Leader(b"node-a", a.epoch, None), Leader(b"node-a", a.epoch, b"va"))
                forger.publish(leader_channel(key), b"elected 0 %d %d %s evil-node" % (
                    9_000_000_000_000_000, len(key), key.encode()))
                await a.resign()
                b = await client.election(key, "node-b").campaign()
                leader = await asyncio.wait_for(observer.__anext__(), 5)
                while leader == Leader(b"node-a", a.epoch, b"va"):
                    leader = await asyncio.wait_for(observer.__anext__(), 5)
                assert leader == Leader(b"node-b", b.epoch, None), leader
                await b.resign()
    asyncio.run(main())
