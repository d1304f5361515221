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
