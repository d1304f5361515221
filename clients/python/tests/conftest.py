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


def _started(port: int, proc: subprocess.Popen[bytes]) -> bool:
    """Whether the process started answers on ``port`` within 10 s (false once it exits). The
    probe's connection is closed on the way out: left to the garbage collector, it stayed open
    until a collection at any later moment, and a test that counts the server's connections
    (maxclients) saw a slot free up in its middle."""
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as r:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if int(r.info("server")["process_id"]) == proc.pid:
                    return True
            except redis.RedisError:
                pass
            time.sleep(0.05)
    return False


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


def start_server(tmp: Path, *extra: str, with_module: bool = True) -> Server:
    """A server on a free loopback port, loading the module unless ``with_module`` is false (a
    server as a managed service runs it, for the Functions library: test_functions.py)."""
    load = ["--loadmodule", _module()] if with_module else []
    for _ in range(5):
        port = _free_port()
        proc = subprocess.Popen(
            [os.environ.get("LOCK_SERVER", "redis-server"), "--port", str(port), "--bind",
             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp),
             *load, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        if _started(port, proc):
            return Server(port, proc)
        proc.kill()
        proc.wait()
    pytest.fail(f"redis-server {'with' if with_module else 'without'} the module did not start")


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
    `redis-cli --cluster create` in testkit/src/cluster.rs: cluster-enabled, CLUSTER
    ADDSLOTSRANGE, a config epoch of each master's own, CLUSTER MEET, then wait until every node
    says cluster_state:ok with all slots served and knows every master's config epoch)."""

    def __init__(self, nodes: list[Server]) -> None:
        self.nodes = nodes
        self.ports = [n.port for n in nodes]

    def redis_cluster(self, **kwargs: object) -> "redis.cluster.RedisCluster":
        import redis.cluster

        return redis.cluster.RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)  # type: ignore[arg-type]

    def node_of(self, key: str) -> Server:
        slot = redis.cluster.key_slot(key.encode())
        return self.nodes[0 if slot <= 5460 else 1 if slot <= 10922 else 2]

    def epochs_agreed(self) -> bool:
        """Whether every node knows the same config epoch for each master, and no two masters
        share one. Only then does a node that takes a slot (SETSLOT NODE to itself, BUMPEPOCH)
        get an epoch no other has: a target that bumped to an epoch it did not know another
        master had lost the slot it had just been given to an UPDATE from a node that still saw
        the old owner, and no node claimed the slot again (soak run 2, a wait moved between
        the masters)."""
        views = []
        for n in self.nodes:
            with n.client() as c:
                lines = c.execute_command("CLUSTER", "NODES").decode().splitlines()
            views.append({f[0]: int(f[6]) for f in (line.split() for line in lines)
                          if "master" in f[2].split(",")})
        return all(v == views[0] for v in views) and len(set(views[0].values())) == len(views[0])

    def errorstat(self, name: str) -> int:
        """Errors `name` (e.g. MOVED) answered so far, over every node."""
        total = 0
        for n in self.nodes:
            entry = n.client().info("errorstats").get(f"errorstat_{name}")
            total += int(entry["count"]) if entry else 0
        return total


def start_cluster(tmp: Path, with_module: bool = True) -> Cluster:
    """A cluster of three masters; ``with_module`` false: without the module (a managed
    service's cluster, for the Functions library: test_functions_backend.py)."""
    ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
    taken: set[int] = set()
    nodes: list[Server] = []
    for i in range(3):
        d = tmp / f"node{i}"
        d.mkdir()
        port = _free_cluster_port(taken)
        taken.add(port)
        nodes.append(_start_on(port, d, "--cluster-enabled", "yes", "--cluster-config-file",
                               "nodes.conf", "--cluster-node-timeout", "5000",
                               with_module=with_module))
    for epoch, (node, (lo, hi)) in enumerate(zip(nodes, ranges), start=1):
        node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        # As redis-cli --cluster create: masters that meet with the same epoch (0) settle their
        # collision over gossip rounds, after the cluster says ok.
        node.client().execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
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
    cluster = Cluster(nodes)
    wait_until(cluster.epochs_agreed, "the nodes do not agree on the config epochs", bound=20)
    return cluster


def add_replica(cluster: Cluster, master: Server, tmp: Path) -> Server:
    """A new node with the module, made a replica of ``master`` (``CLUSTER MEET``, ``CLUSTER
    REPLICATE``), returned once it is in sync and ``master`` counts it in ``WAIT`` (as
    testkit/src/cluster.rs ``add_replica``). It is added to ``cluster.nodes`` (stopped with
    them)."""
    port = _free_cluster_port(set(cluster.ports))
    tmp.mkdir(parents=True, exist_ok=True)
    node = _start_on(port, tmp, "--cluster-enabled", "yes", "--cluster-config-file",
                     "nodes.conf", "--cluster-node-timeout", "5000")
    cluster.nodes.append(node)
    master_id = master.client().execute_command("CLUSTER", "MYID").decode()
    node.client().execute_command("CLUSTER", "MEET", "127.0.0.1", master.port)
    deadline = time.monotonic() + 30
    while master_id not in node.client().execute_command("CLUSTER", "NODES").decode():
        assert time.monotonic() < deadline, "the new node did not meet the cluster"
        time.sleep(0.05)
    node.client().execute_command("CLUSTER", "REPLICATE", master_id)
    while node.client().info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica did not sync"
        time.sleep(0.05)
    wait_acknowledged(master, int(master.client().info("replication")["connected_slaves"]))
    return node


def wait_acknowledged(master: Server, replicas: int, bound: float = 60.0) -> None:
    """Waits until ``master`` counts ``replicas`` replicas in ``WAIT``: a replica whose link is
    up is counted only once the master has its first ``REPLCONF ACK`` (on Redis 7.0.15 ``WAIT 1
    200`` right after ``master_link_status:up`` can answer 0). Writes (``SET`` and ``DEL`` of a
    key of its own, in a slot the master serves when it is a cluster node: nothing is left),
    then ``WAIT replicas 5000``, again until it answers ``replicas`` (a bound that only catches
    a hang). As testkit/src/server.rs ``wait_replicas_acknowledge``."""
    r = master.client(socket_timeout=10)
    key = None
    for i in range(100_000):
        try:
            r.set(f"conftest:acknowledged:{i}", 1)
        except redis.exceptions.ResponseError as e:
            if str(e).startswith("MOVED") or isinstance(e, redis.exceptions.MovedError):
                continue
            raise
        key = f"conftest:acknowledged:{i}"
        break
    assert key is not None, "no key of a slot the master serves"
    deadline = time.monotonic() + bound
    while True:
        pipe = r.pipeline(transaction=False)
        pipe.set(key, 1)
        pipe.delete(key)
        pipe.execute()
        acknowledged = int(r.execute_command("WAIT", replicas, 5000))
        if acknowledged >= replicas:
            return
        assert time.monotonic() < deadline, (
            f"{acknowledged} of {replicas} replicas acknowledged a write of the master "
            f"{master.port} within {bound} s: {r.info('replication')}")


def _start_on(port: int, tmp: Path, *extra: str, with_module: bool = True) -> Server:
    load = ["--loadmodule", _module()] if with_module else []
    proc = subprocess.Popen(
        [os.environ.get("LOCK_SERVER", "redis-server"), "--port", str(port), "--bind",
         "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp),
         *load, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    if _started(port, proc):
        return Server(port, proc)
    proc.kill()
    proc.wait()
    pytest.fail(f"redis-server {'with' if with_module else 'without'} the module did not start "
                f"on {port}")


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


def waiting(server: Server, key: str) -> int:
    """How many acquires wait in `key`'s queue (LOCK.INFO `waiters`: blocked ones and tickets)."""
    found = info(server, key)
    return 0 if found is None else int(found[b"waiters"])  # type: ignore[call-overload]


def wait_until(condition: Callable[[], object], what: str, bound: float = 5.0) -> None:
    """Polls `condition` (a bound that only catches a hang, never a timing claim)."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


class SentinelSet:
    """One master and two replicas with the module, watched by three Sentinels (``redis-server
    <conf> --sentinel``) under the name ``mymaster``, all on loopback: down-after-milliseconds
    3000 (1000 made busy Sentinels promote twice), failover-timeout 3000, quorum 2."""

    NAME = "mymaster"

    def __init__(self, servers: list[Server], sentinels: list[Server]) -> None:
        self.servers = servers
        self.sentinels = sentinels
        self.addresses = [("127.0.0.1", s.port) for s in sentinels]

    def sentinel(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.sentinels[0].port, socket_timeout=2,
                           decode_responses=True)

    def master_port(self) -> int:
        """The master's port as the Sentinels say it now (asks each until one answers)."""
        for s in self.sentinels:
            try:
                host, port = redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=1,
                                         decode_responses=True).execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.NAME)
                return int(port)
            except (redis.RedisError, TypeError, ValueError):
                continue
        raise AssertionError("no Sentinel answers")

    def master(self) -> Server:
        port = self.master_port()
        return next(s for s in self.servers if s.port == port)

    def replicas(self) -> list[Server]:
        port = self.master_port()
        return [s for s in self.servers if s.port != port and s.proc.poll() is None]

    def wait_for_failover(self, old: Server, bound: float = 30.0) -> Server:
        """After ``old`` died or stopped: waits until the Sentinels name another master and it
        answers as one (role master, serving writes). Returns it."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            try:
                port = self.master_port()
            except AssertionError:
                port = old.port
            if port != old.port:
                new = next(s for s in self.servers if s.port == port)
                try:
                    if new.client(socket_timeout=1).info("replication")["role"] == "master":
                        return new
                except redis.RedisError:
                    pass
            time.sleep(0.05)
        raise AssertionError("the Sentinels did not fail over")

    def wait_replicated(self) -> None:
        """Every write of the master so far acknowledged by both replicas."""
        assert self.master().client().execute_command("WAIT", 2, 5000) == 2

    def stop(self) -> None:
        for s in self.sentinels + self.servers:
            if s.proc.poll() is None:
                try:
                    os.kill(s.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                s.proc.kill()
            s.proc.wait()


def _start_sentinel(tmp: Path, master_port: int) -> Server:
    for _ in range(5):
        port = _free_port()
        conf = tmp / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {tmp}\n"
            f"sentinel monitor {SentinelSet.NAME} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {SentinelSet.NAME} 3000\n"
            f"sentinel failover-timeout {SentinelSet.NAME} 3000\n"
            f"sentinel parallel-syncs {SentinelSet.NAME} 2\n"
        )
        proc = subprocess.Popen(
            [os.environ.get("LOCK_SERVER", "redis-server"), str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        if _started(port, proc):
            return Server(port, proc)
        proc.kill()
        proc.wait()
    pytest.fail("redis-server --sentinel did not start")


def start_sentinel_set(tmp: Path, *replica_extra: str) -> SentinelSet:
    """The master, its two replicas (``replica_extra``: more of their settings), three
    Sentinels; returns once both replicas are in sync, the master counts both in ``WAIT``, and
    every Sentinel sees both replicas and the two other Sentinels."""
    master = start_server(_mkdir(tmp / "master"))
    replicas = [start_server(_mkdir(tmp / f"replica{i}"), "--replicaof", "127.0.0.1",
                             str(master.port), *replica_extra) for i in range(2)]
    deadline = time.monotonic() + 20
    while master.client().info("replication").get("connected_slaves", 0) < 2 or any(
            r.client().info("replication").get("master_link_status") != "up" for r in replicas):
        assert time.monotonic() < deadline, "the replicas did not sync"
        time.sleep(0.05)
    wait_acknowledged(master, 2)
    sentinels = [_start_sentinel(_mkdir(tmp / f"sentinel{i}"), master.port) for i in range(3)]
    s = SentinelSet([master] + replicas, sentinels)
    for sentinel in sentinels:
        conn = redis.Redis(host="127.0.0.1", port=sentinel.port, decode_responses=True)
        while True:
            fields = conn.sentinel_master(SentinelSet.NAME)  # parsed by redis-py
            if int(fields["num-slaves"]) == 2 and int(fields["num-other-sentinels"]) == 2:
                break
            if time.monotonic() > deadline:
                s.stop()
                pytest.fail(f"the Sentinels did not see each other: {fields}")
            time.sleep(0.05)
    return s


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    """A Sentinel set of the test's own (failovers change it)."""
    s = start_sentinel_set(tmp_path)
    yield s
    s.stop()
