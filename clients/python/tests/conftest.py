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
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

import pytest
import redis
import redis.cluster

if TYPE_CHECKING:
    from redis_lock_client import LockClient

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

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The server process SIGSTOPped for the block: the kernel still accepts connections
        and buffers what is sent; nothing is read or answered until SIGCONT at the end."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def blocked_clients(self, command: str) -> list[dict[str, str]]:
        """CLIENT LIST entries of connections blocked in `command` (e.g. lock.acquire)."""
        out = []
        for line in self.client().execute_command("CLIENT", "LIST").decode().splitlines():
            entry = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
            if entry.get("cmd") == command and "b" in entry.get("flags", ""):
                out.append(entry)
        return out


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


def reports_key_events(server: Server) -> bool:
    """Whether the server tells modules about keys removed or replaced by other commands (Redis
    >= 7.2 and Valkey), so the module signals deleted/overwritten/evicted/expired keys."""
    info = server.client().info("server")
    if "valkey_version" in info or info.get("server_name") == "valkey":
        return True
    major, minor = (int(x) for x in str(info["redis_version"]).split(".")[:2])
    return (major, minor) >= (7, 2)


def _free_cluster_port(taken: set[int]) -> int:
    # A node's bus port is port + 10000: both free, both below the ephemeral range.
    while True:
        port = random.randrange(20000, 22700)
        if port in taken:
            continue
        ok = True
        for p in (port, port + 10000):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return port


class Cluster:
    """Three masters with the module, slots 0-5460, 5461-10922, 10923-16383 (as
    testkit/src/cluster.rs: cluster-enabled, CLUSTER ADDSLOTSRANGE, CLUSTER MEET, then wait
    until every node says cluster_state:ok with all slots served)."""

    def __init__(self, nodes: list[Server]) -> None:
        self.nodes = nodes
        self.ports = [n.port for n in nodes]

    def redis_cluster(self, **kwargs: object) -> "redis.cluster.RedisCluster":
        import redis.cluster

        return redis.cluster.RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)  # type: ignore[arg-type]

    def node_of(self, key: str) -> Server:
        slot = redis.cluster.key_slot(key.encode())
        return self.nodes[0 if slot <= 5460 else 1 if slot <= 10922 else 2]

    def errorstat(self, name: str) -> int:
        """Errors `name` (e.g. MOVED) answered so far, over every node."""
        total = 0
        for n in self.nodes:
            entry = n.client().info("errorstats").get(f"errorstat_{name}")
            total += int(entry["count"]) if entry else 0
        return total


def start_cluster(tmp: Path) -> Cluster:
    ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
    taken: set[int] = set()
    nodes: list[Server] = []
    for i in range(3):
        d = tmp / f"node{i}"
        d.mkdir()
        port = _free_cluster_port(taken)
        taken.add(port)
        nodes.append(_start_on(port, d, "--cluster-enabled", "yes", "--cluster-config-file",
                               "nodes.conf", "--cluster-node-timeout", "5000"))
    for node, (lo, hi) in zip(nodes, ranges):
        node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
    for node in nodes[1:]:
        nodes[0].client().execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
    deadline = time.monotonic() + 20
    for node in nodes:
        while True:
            info = node.client().execute_command("CLUSTER", "INFO").decode()
            if "cluster_state:ok" in info and "cluster_slots_ok:16384" in info:
                break
            if time.monotonic() > deadline:
                pytest.fail("the cluster did not come up")
            time.sleep(0.05)
    return Cluster(nodes)


def _start_on(port: int, tmp: Path, *extra: str) -> Server:
    module = _module()
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
    pytest.fail(f"redis-server with the module did not start on {port}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    for n in c.nodes:
        n.proc.kill()
        n.proc.wait()


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[Server]:
    """A server of the test's own, for tests that change its configuration."""
    s = start_server(tmp_path)
    yield s
    s.proc.kill()
    s.proc.wait()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "scenario(*ids): the rows of docs/client-scenarios.md this test covers"
    )


@pytest.fixture
def client(server: Server) -> Iterator["LockClient"]:
    """A library client of the module's server (test_cluster.py has its own, of the cluster)."""
    from redis_lock_client import LockClient

    c = LockClient.from_url(server.url)
    yield c
    c.close()


def info(server: Server, key: str) -> dict[bytes, object] | None:
    """`LOCK.INFO key` as a dict, or None when the key is free."""
    reply = server.client().execute_command("LOCK.INFO", key)
    if reply is None:
        return None
    return dict(zip(reply[::2], reply[1::2]))


def wait_until(condition: Callable[[], object], what: str, bound: float = 5.0) -> None:
    """Polls `condition` (a bound that only catches a hang, never a timing claim)."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)
