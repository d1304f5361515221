"""Cross-library interop: a hold of this library blocks the Rust library
(clients/rust/examples/interop_probe.rs, built once here) and Redisson's lock script, and the
other way round, on one real server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, Server
from redis_lock_client import LockClient

REDISSON_LOCK = (
    "if (redis.call('exists', KEYS[1]) == 0) then "
    "redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
    "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then "
    "redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
    "return redis.call('pttl', KEYS[1]);"
)  # testkit/src/lock.rs REDISSON_LOCK


@pytest.fixture(scope="module")
def probe() -> Path:
    """Builds the Rust probe (cargo, offline if the crates are already fetched)."""
    subprocess.run(
        ["cargo", "build", "-q", "-p", "redis-lock-client", "--example", "interop_probe"],
        cwd=ROOT, check=True, timeout=900,
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "examples" / "interop_probe"


def rust(probe: Path, server: Server, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(probe), *args], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "REDIS_URL": server.url})


@pytest.mark.scenario("interop-python-rust", "interop-redisson")
def test_a_python_hold_blocks_the_rust_library_and_redisson(probe, server, key):
    with LockClient.from_url(server.url) as client:
        with client.lock(key):
            out, _ = rust(probe, server, "try", key).communicate(timeout=30)
            assert out.strip() == "busy"
            assert server.client().eval(REDISSON_LOCK, 1, key, 30000, "redisson-uuid:1") > 0
        out, _ = rust(probe, server, "try", key).communicate(timeout=30)
        assert out.startswith("acquired ")


@pytest.mark.scenario("interop-python-rust", "interop-redisson")
def test_a_rust_hold_blocks_the_python_library_and_redisson(probe, server, key):
    with LockClient.from_url(server.url) as client:
        holder = rust(probe, server, "hold", key, "1500")
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line.startswith("held "), line
        rust_token = int(line.split()[1])
        assert client.lock(key).try_acquire() is None
        assert server.client().eval(REDISSON_LOCK, 1, key, 30000, "redisson-uuid:1") > 0
        # A Python wait is granted when the Rust holder releases, with a higher token.
        with client.lock(key, wait_timeout=10) as guard:
            assert guard.token > rust_token
        assert holder.stdout.readline().strip() == "released"
        assert holder.wait(10) == 0
