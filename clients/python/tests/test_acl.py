"""The library run as the users of docs/operations.md (*ACL*), their ``ACL SETUSER`` lines read
from that file: the application user holds, waits (tickets and blocking), shares, takes several
keys, campaigns, fences writes and hears the lost-hold signal (the flush channel too); the
observer user follows the election; the operator force-releases. A refusal of the ACL is
``NoPermission`` naming the command, at once: never a lost hold (``UNREACHABLE``) nor a
connection error."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import redis

from conftest import Server, wait_until
from redis_lock_client import (
    AsyncLockClient,
    LockClient,
    LockConnectionError,
    LostReason,
    NoPermission,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"

#: The application line docs/operations.md printed before the libraries' recipe.
OLD_APP_LINE = (
    "ACL SETUSER app on >app-secret ~app:* resetchannels &redisson_lock__channel:{app:*} "
    "&redisson_lock__channel:app:* +lock.acquire +lock.release +lock.renew +lock.info "
    "+lock.macquire +lock.mrelease +lock.mrenew +subscribe +unsubscribe +psubscribe +punsubscribe"
)


def documented(user: str) -> list[str]:
    """The ``ACL SETUSER <user> ...`` line docs/operations.md prints, split into its arguments."""
    prefix = f"ACL SETUSER {user} "
    for line in DOCS.read_text().splitlines():
        if line.startswith(prefix):
            return line.split()
    pytest.fail(f"no `{prefix}` line in docs/operations.md")


def create(server: Server, line: list[str]) -> str:
    """Runs the line; the URL of its user."""
    server.client().execute_command(*line)
    password = next(a[1:] for a in line if a.startswith(">"))
    return f"redis://{line[2]}:{password}@127.0.0.1:{server.port}/"


def checks(server: Server, key: str, owner: bytes, token: int) -> int:
    return int(server.client().execute_command("LOCK.CHECK", key, owner, token))


def test_the_documented_application_user_runs_every_part_of_the_library(fresh_server):
    server = fresh_server
    url = create(server, documented("app"))
    with LockClient.from_url(url) as client:
        # A hold kept past its lease: renewed and checked, never reported lost.
        lease = 0.9
        guard = client.lock("app:plain", lease=lease).acquire()
        time.sleep(lease * 2)
        assert guard.lost_reason is None
        assert checks(server, "app:plain", guard.owner, guard.token) == 1
        # A fenced write (LOCK.GUARD + SET), then the release.
        guard.execute("SET", "app:plain:data", "v")
        guard.release()

        # Waiting, with tickets (the default) and blocking.
        for tickets in (True, False):
            with LockClient.from_url(url, wait_with_tickets=tickets) as waiter:
                key = f"app:wait:{tickets}"
                first = client.lock(key).acquire()
                got: list[object] = []
                thread = threading.Thread(
                    target=lambda: got.append(waiter.lock(key, wait_timeout=10).acquire())
                )
                thread.start()
                time.sleep(0.2)
                first.release()
                thread.join(10)
                assert got, f"tickets {tickets}: not granted"
                got[0].release()  # type: ignore[attr-defined]

        # Shared holds and permits.
        for g in [client.read_lock("app:shared").acquire(),
                  client.read_lock("app:shared").acquire(),
                  client.semaphore("app:sem", 2).acquire()]:
            g.release()

        # Several keys at once, kept past their lease.
        multi = client.multi_lock(["app:{m}:1", "app:{m}:2"], lease=lease).acquire()
        time.sleep(lease * 2)
        assert multi.lost_reason is None
        multi.release()

        # An election, followed by the documented observer.
        with LockClient.from_url(create(server, documented("observer"))) as watcher:
            observer = watcher.election("app:svc").observe()
            leadership = client.election("app:svc").campaign(value="10.0.0.1:80")
            seen = []
            follow = threading.Thread(
                target=lambda: seen.extend(
                    leader for leader, _ in zip(observer, range(1))
                    if leader.epoch == leadership.epoch
                ),
                daemon=True,
            )
            follow.start()
            follow.join(5)
            observer.close()
            assert [s.value for s in seen] == [b"10.0.0.1:80"]
            read = watcher.election("app:svc").leader()
            assert read is not None and read.epoch == leadership.epoch
            assert leadership.proclaim("10.0.0.2:80")
            leadership.resign()

        # The lost-hold signal: a flush (its own channel) and a force release by the operator,
        # each reported well before the lease would have.
        flushed = client.lock("app:flushed", lease=30).acquire()
        server.client().flushdb()
        assert flushed.lost.wait(5), "the flush was heard"
        assert flushed.lost_reason is LostReason.FLUSHED
        forced = client.lock("app:forced", lease=30).acquire()
        operator = redis.Redis.from_url(create(server, documented("ops")))
        assert operator.execute_command("LOCK.FORCERELEASE", "app:forced") == 1
        assert forced.lost.wait(5), "the force release was heard"
        assert forced.lost_reason is LostReason.FORCE_RELEASED


def test_the_documented_application_user_runs_the_asyncio_library(fresh_server):
    server = fresh_server
    url = create(server, documented("app"))

    async def main() -> None:
        async with AsyncLockClient.from_url(url) as client:
            lease = 0.9
            guard = await client.lock("app:a", lease=lease).acquire()
            await asyncio.sleep(lease * 2)
            assert guard.lost_reason is None
            await guard.execute("SET", "app:a:data", "v")
            first = await client.lock("app:w").acquire()
            waiting = asyncio.ensure_future(client.lock("app:w", wait_timeout=10).acquire())
            await asyncio.sleep(0.2)
            await first.release()
            await (await asyncio.wait_for(waiting, 10)).release()
            await guard.release()

    asyncio.run(main())


def test_the_old_documented_line_is_refused_by_name_at_the_first_acquire(fresh_server):
    server = fresh_server
    url = create(server, OLD_APP_LINE.split())
    with LockClient.from_url(url) as client:
        with pytest.raises(NoPermission) as refused:
            client.lock("app:k").acquire()
    assert refused.value.command == "CLIENT|SETNAME", refused.value
    assert refused.value.rule == "+client|setname"
    assert refused.value.line.startswith("NOPERM")


def test_a_refused_check_is_a_permission_error_naming_lock_check_not_a_loss(fresh_server):
    # The recipe without +lock.check: the first renewal's check is refused, and the hold ends
    # at once as NO_PERMISSION (released on the server), never UNREACHABLE at 90 % of the lease
    # while the server still holds it; the guard's release names LOCK.CHECK. The old line with
    # +ping +client|setname added did the same (every hold reported UNREACHABLE).
    server = fresh_server
    url = create(server, documented("app"))
    server.client().execute_command("ACL", "SETUSER", "app", "-lock.check")
    with LockClient.from_url(url) as client:
        lease = 1.5
        guard = client.lock("app:k", lease=lease).acquire()
        assert guard.lost.wait(lease * 0.8), "the refusal was said before 80 % of the lease"
        assert guard.lost_reason is LostReason.NO_PERMISSION
        with pytest.raises(NoPermission) as refused:
            guard.release()
        assert refused.value.command == "LOCK.CHECK"
        assert refused.value.rule == "+lock.check"
        # Released in the background: nobody waits out a hold this side gave up.
        wait_until(lambda: server.client().execute_command("LOCK.INFO", "app:k") is None,
                   "released")


def test_waits_without_client_id_still_work_and_are_no_connection_error(fresh_server):
    # The recipe without CLIENT ID: a ticketed wait is never interrupted (its BLPOP ends
    # within the health period) but is granted, as in Rust; before, it failed with
    # LockConnectionError('the connection a ticket waited on closed').
    server = fresh_server
    url = create(server, documented("app"))
    server.client().execute_command("ACL", "SETUSER", "app", "-client|id")
    with LockClient.from_url(url) as client:
        first = client.lock("app:w").acquire()
        got: list[object] = []
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                got.append(client.lock("app:w", wait_timeout=10).acquire())
            except LockConnectionError as e:
                errors.append(e)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        first.release()
        thread.join(15)
        assert not errors, errors
        assert got
        got[0].release()  # type: ignore[attr-defined]


def documented_cluster_rules() -> list[str]:
    """The rules docs/operations.md says a cluster adds to the ``app`` line ("In a cluster add
    `...`")."""
    _, found, rest = DOCS.read_text().partition("In a cluster add `")
    assert found, "an `In a cluster add` sentence in docs/operations.md"
    return rest.partition("`")[0].split()


def refusals(server: Server) -> list[str]:
    """What the server (or Sentinel) logged as refused by its ACL (``ACL LOG``): ``reason
    object`` per entry. ``CLIENT SETINFO``, which the clients send on connecting and whose
    refusal they ignore (Redis >= 7.2; Redis 7.0 has no such command), is left out."""

    def text(v: object) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    found = []
    for entry in server.client().execute_command("ACL", "LOG"):
        fields = dict(zip(map(text, entry[::2]), map(text, entry[1::2])))
        found.append(f"{fields.get('reason')} {fields.get('object')}")
    return [e for e in found if not e.endswith("client|setinfo")]


def test_through_sentinel_the_documented_users_lock_and_follow_a_failover(sentinel_set):
    # docs/operations.md's lock-sentinel line on every Sentinel and its app line on every data
    # server, read from the page: a lock held past its lease (renewed), released; after a
    # failover (the master killed) the next acquire is granted by the new master and the hold
    # kept across it is renewed there; no server and no Sentinel logged a refusal (ACL LOG).
    # The page's line before lacked +sentinel|master, which every lookup sends: no master was
    # ever found (MasterNotFoundError, then LockConnectionError).
    s = sentinel_set
    sentinel_line = documented("lock-sentinel")
    app = documented("app")
    # First without +sentinel|master: the first acquire says which rule the Sentinels lack, at
    # once (measured: a few ms), not LockConnectionError after the failover timeout (30 s) as
    # before.
    short = [a for a in sentinel_line if a != "+sentinel|master"]
    assert len(short) == len(sentinel_line) - 1
    for sentinel in s.sentinels:
        sentinel.client().execute_command(*short)
    for server in s.servers:
        server.client().execute_command(*app)

    def secret(line: list[str]) -> str:
        return next(a[1:] for a in line if a.startswith(">"))

    def make() -> LockClient:
        return LockClient.from_sentinel(
            s.addresses, s.NAME,
            sentinel_kwargs={"username": sentinel_line[2], "password": secret(sentinel_line),
                             "socket_timeout": 2, "socket_connect_timeout": 2},
            username=app[2], password=secret(app),
        )

    with make() as refused_client:
        started = time.monotonic()
        with pytest.raises(NoPermission) as refused:
            refused_client.lock("app:s").acquire()
        assert time.monotonic() - started < 1.0
        assert refused.value.command == "SENTINEL|MASTER", refused.value
        assert refused.value.rule == "+sentinel|master"
    for sentinel in s.sentinels:
        sentinel.client().execute_command(*sentinel_line)
        sentinel.client().execute_command("ACL", "LOG", "RESET")
    with make() as client:
        lease = 0.9
        guard = client.lock("app:s", lease=lease).acquire()
        time.sleep(lease * 2)
        assert guard.lost_reason is None
        guard.release()

        kept = client.lock("app:kept", lease=15).acquire()
        old = s.master()
        s.wait_replicated()
        old.proc.kill()
        old.proc.wait()
        new = s.wait_for_failover(old, bound=60)
        after = client.lock("app:after").acquire()
        assert checks(new, "app:after", after.owner, after.token) == 1, "granted by the new master"
        wait_until(lambda: new.commandstat("lock.renew") >= 1,
                   "the kept hold renewed on the new master", bound=15)
        assert kept.lost_reason is None
        after.release()
        kept.release()

    for server in s.sentinels + s.servers:
        if server is not old:
            assert refusals(server) == [], f"ACL LOG of {server.port}"


def test_in_a_cluster_the_documented_user_with_the_cluster_rules_locks_on_every_master(cluster):
    # docs/operations.md's app line with the rules the page says a cluster adds, on every node
    # of a three-master cluster: a lock on each master held past its lease (renewed), a fenced
    # write, a wait, the lost-hold signal (SSUBSCRIBE) of a force release, a multi-key hold;
    # no node logged a refusal (ACL LOG).
    import redis.cluster

    line = documented("app") + documented_cluster_rules()
    for node in cluster.nodes:
        node.client().execute_command(*line)
    password = next(a[1:] for a in line if a.startswith(">"))
    keys = []
    for low in (0, 5461, 10923):
        keys.append(next(f"app:{{c{i}}}" for i in range(10_000)
                         if low <= redis.cluster.key_slot(f"app:{{c{i}}}".encode()) < low + 5000))
    as_app = {"username": "app", "password": password}
    with LockClient(cluster.redis_cluster(**as_app)) as client, \
            LockClient(cluster.redis_cluster(**as_app)) as waiter:
        lease = 0.9
        for key in keys:
            guard = client.lock(key, lease=lease).acquire()
            time.sleep(lease * 2)
            assert guard.lost_reason is None, key
            guard.execute("SET", f"{key}:data", "v")
            got: list[object] = []
            thread = threading.Thread(
                target=lambda: got.append(waiter.lock(key, wait_timeout=10).acquire()))
            thread.start()
            time.sleep(0.2)
            guard.release()
            thread.join(10)
            assert got, f"{key}: not granted"
            granted = got[0]
            node = cluster.node_of(key)
            assert node.client().execute_command("LOCK.FORCERELEASE", key) == 1
            assert granted.lost.wait(5), f"{key}: the force release was heard"  # type: ignore[attr-defined]
            assert granted.lost_reason is LostReason.FORCE_RELEASED  # type: ignore[attr-defined]
        multi = client.multi_lock(["app:{m}:1", "app:{m}:2"], lease=lease).acquire()
        time.sleep(lease * 2)
        assert multi.lost_reason is None
        multi.release()
    for node in cluster.nodes:
        assert refusals(node) == [], f"ACL LOG of {node.port}"


@pytest.mark.parametrize("dropped, channel", [
    ("&lock.lost:{app:*}", "lock.lost:{app:k}"),
    ("&lock.lost:flush", "lock.lost:flush"),
])
def test_a_refused_lost_signal_channel_fails_the_acquire_at_once_naming_the_rule(
        fresh_server, dropped, channel):
    # The recipe without one of its lost-hold channels: the acquire that needs the subscription
    # raises NoPermission naming SUBSCRIBE, the channel and the rule to add, at once (measured:
    # a few ms), and its grant is released (the key is free). Before, the refusal was skipped:
    # the acquire waited out the 2 s command timeout for a confirmation that never came, then
    # handed out a guard nobody would tell of a loss.
    server = fresh_server
    line = [a for a in documented("app") if a != dropped]
    assert len(line) == len(documented("app")) - 1
    url = create(server, line)
    with LockClient.from_url(url) as client:
        assert client.command_timeout == 2.0
        for attempt in range(2):  # asked again each time: the ACL may have changed
            started = time.monotonic()
            with pytest.raises(NoPermission) as refused:
                client.lock("app:k").acquire()
            elapsed = time.monotonic() - started
            assert elapsed < 1.0, f"refused after {elapsed:.3f} s (attempt {attempt})"
            assert refused.value.command == "SUBSCRIBE"
            assert refused.value.channel == channel
            assert refused.value.rule == f"&{channel}"
            assert f"&{channel}" in str(refused.value)
            assert server.client().execute_command("LOCK.INFO", "app:k") is None
        # Without the lost-hold signal, nothing is subscribed: the same user acquires.
        with LockClient.from_url(url, lost_signal=False) as quiet:
            quiet.lock("app:k").acquire().release()
        # With the rule back, the same client acquires.
        server.client().execute_command("ACL", "SETUSER", "app", dropped)
        client.lock("app:k").acquire().release()


def test_a_refused_lost_signal_channel_fails_the_asyncio_acquire_at_once(fresh_server):
    server = fresh_server
    url = create(server, [a for a in documented("app") if a != "&lock.lost:{app:*}"])

    async def main() -> None:
        async with AsyncLockClient.from_url(url) as client:
            started = time.monotonic()
            with pytest.raises(NoPermission) as refused:
                await client.lock("app:k").acquire()
            assert time.monotonic() - started < 1.0
            assert refused.value.rule == "&lock.lost:{app:k}"
            assert server.client().execute_command("LOCK.INFO", "app:k") is None

    asyncio.run(main())
