"""The README's quick start runs as printed, and every default the README states is the one the
library uses (sync and asyncio alike)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import threading
import time
from pathlib import Path

from conftest import info
from redis_lock_client import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_LEASE,
    AsyncLockClient,
    LockClient,
    LostReason,
    Renewal,
)

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_readmes_quick_start_runs(server):
    section = README.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    code = code.replace("redis://127.0.0.1:6379/", server.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert [line.split()[:2] for line in lines] == [["write", "a"], ["write", "b"]]
    assert int(lines[0].split()[-1]) > 0
    assert info(server, "orders:42") is None  # released by `with`


def test_the_defaults_are_the_readmes(server, key):
    assert DEFAULT_LEASE == 30.0 and DEFAULT_COMMAND_TIMEOUT == 2.0
    with LockClient.from_url(server.url) as client:
        assert client.command_timeout == 2.0
        lock = client.lock(key)
        assert (lock.lease, lock.renewal, lock.wait_timeout, lock.ephemeral, lock.on_lost) == (
            30.0, Renewal.WATCHDOG, None, False, None)
        assert re.fullmatch(rb"[0-9a-f]{32}:\d+", lock.owner)
        assert client.lock(key).owner != lock.owner  # each handle is its own owner
        guard = lock.acquire()
        held = info(server, key)
        assert 29_000 < held[b"ttl"] <= 30_000 and held[b"ephemeral"] is None  # a 30 s lease
        guard.release()
        # wait_timeout None: acquire() waits until granted.
        other = client.lock(key).acquire()
        threading.Timer(0.5, other.release).start()
        start = time.monotonic()
        waited = client.lock(key).acquire()
        assert time.monotonic() - start >= 0.4
        waited.release()
        # An election: 30 s, EPHEMERAL.
        election = client.election(key)
        leadership = election.campaign()
        held = info(server, key)
        assert 29_000 < held[b"ttl"] <= 30_000 and isinstance(held[b"ephemeral"], int)
        leadership.resign()


def test_on_lost_is_called_once_with_the_reason_after_lost_is_set(server, key):
    calls: list[tuple[LostReason, bool]] = []
    with LockClient.from_url(server.url) as client:
        guard = None

        def on_lost(reason: LostReason) -> None:
            assert guard is not None
            calls.append((reason, guard.lost.is_set()))
        guard = client.lock(key, on_lost=on_lost).acquire()
        server.client().execute_command("LOCK.FORCERELEASE", key)
        assert guard.lost.wait(1.0)
        deadline = time.monotonic() + 1
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert calls == [(LostReason.FORCE_RELEASED, True)]


def test_async_defaults_are_the_same(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            assert client.command_timeout == 2.0
            lock = client.lock(key)
            assert (lock.lease, lock.renewal, lock.wait_timeout, lock.ephemeral) == (
                30.0, Renewal.WATCHDOG, None, False)
            guard = await lock.acquire()
            assert 29_000 < info(server, key)[b"ttl"] <= 30_000
            await guard.release()
    asyncio.run(main())
