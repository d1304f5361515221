"""The one fixture file: a real redis-server with the module, one per test module.

The server is $LOCK_SERVER (default redis-server) loading $LOCK_MODULE (default the workspace's
target/debug/libredis_lock.so, built by `cargo build --lib`); it listens on a free loopback
port with `--save "" --dir <tmp>`, is trusted only once INFO names the process started here
(the approach of tests/clients/run.sh), and is killed and reaped at the end of the module.
A missing module fails the tests: nothing is skipped.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import redis

ROOT = Path(__file__).resolve().parents[3]


def _module() -> str:
    path = os.environ.get("LOCK_MODULE") or str(ROOT / "target" / "debug" / "libredis_lock.so")
    if not Path(path).is_file():
        pytest.fail(f"module {path} not found: run `cargo build --lib` or set LOCK_MODULE")
    return path


def _free_port() -> int:
    # Below the ephemeral range (32768+), so no client connection takes it before the bind.
    while True:
        port = random.randrange(23000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue


class Server:
    def __init__(self, port: int, proc: subprocess.Popen[bytes]) -> None:
        self.port = port
        self.proc = proc
        self.url = f"redis://127.0.0.1:{port}/"

    def client(self, **kwargs: object) -> redis.Redis:
        """A raw redis-py client (RESP2, bytes) for setting the scene and reading counters."""
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=2, **kwargs)  # type: ignore[arg-type]

    def commandstat(self, command: str) -> int:
        """Calls of `command` (e.g. lock.renew) so far, from INFO commandstats."""
        stats = self.client().info("commandstats")
        entry = stats.get(f"cmdstat_{command}")
        return int(entry["calls"]) if entry else 0


def start_server(tmp: Path, *extra: str) -> Server:
    module = _module()
    for _ in range(5):
        port = _free_port()
        proc = subprocess.Popen(
            [os.environ.get("LOCK_SERVER", "redis-server"), "--port", str(port), "--bind",
             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp),
             "--loadmodule", module, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if int(r.info("server")["process_id"]) == proc.pid:
                    return Server(port, proc)
            except redis.RedisError:
                pass
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    pytest.fail("redis-server with the module did not start")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("redis"))
    yield s
    s.proc.kill()
    s.proc.wait()


@pytest.fixture
def key() -> str:
    return f"test:{uuid.uuid4().hex}"
