"""The three server nodes: in each namespace a ``redis-server`` with the module and a Sentinel,
started from config files in the run's folder, and the reads the orchestrator makes of them
from the root namespace (always reachable: see netns.py). Every read has a socket timeout."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import redis

from netns import Net, SetupError

MASTER_NAME = "lockmaster"
SERVER_PORT = 6379
SENTINEL_PORT = 26379


MIN_REPLICAS = 1  # min-replicas-to-write, as docs/sentinel.md sets it
DOWN_AFTER_MS = 3000  # the Sentinels' down-after-milliseconds, as docs/sentinel.md sets it


def server_conf(module: str, folder: Path, master_ip: Optional[str],
                min_replicas: int = MIN_REPLICAS) -> str:
    """The data server's settings: docs/sentinel.md's (module, min-replicas) plus what a test
    needs (its own folder, no snapshots, a log file). ``min_replicas`` 0 lets a master cut off
    from its replicas take writes for as long as the cut lasts."""
    lines = [
        f"port {SERVER_PORT}", "bind 0.0.0.0", "protected-mode no", f"dir {folder}",
        'save ""', "appendonly no", f"logfile {folder}/server.log",
        f"loadmodule {module}",
        f"min-replicas-to-write {min_replicas}", "min-replicas-max-lag 10",
    ]
    if master_ip:
        lines.append(f"replicaof {master_ip} {SERVER_PORT}")
    return "\n".join(lines) + "\n"


def sentinel_conf(folder: Path, master_ip: str, down_after_ms: int = DOWN_AFTER_MS) -> str:
    return "\n".join([
        f"port {SENTINEL_PORT}", "bind 0.0.0.0", "protected-mode no", f"dir {folder}",
        f"logfile {folder}/sentinel.log",
        f"sentinel monitor {MASTER_NAME} {master_ip} {SERVER_PORT} 2",
        f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}",
        f"sentinel failover-timeout {MASTER_NAME} 10000",
        f"sentinel parallel-syncs {MASTER_NAME} 1",
    ]) + "\n"


def connection(host: str, port: int, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis(host=host, port=port, socket_timeout=timeout,
                       socket_connect_timeout=timeout, decode_responses=True)


class Nodes:
    """The servers and Sentinels of nodes n1, n2, n3 (n1 the first master), and their
    processes, killed by ``stop``."""

    def __init__(self, net: Net, names: list[str], module: str, folder: Path,
                 min_replicas: int = MIN_REPLICAS, down_after_ms: int = DOWN_AFTER_MS) -> None:
        self.net, self.names, self.module, self.folder = net, names, module, folder
        self.min_replicas, self.down_after_ms = min_replicas, down_after_ms
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        master_ip = self.net.ip(self.names[0])
        for name in self.names:
            folder = self.folder / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "redis.conf").write_text(
                server_conf(self.module, folder, None if name == self.names[0] else master_ip,
                            self.min_replicas))
            self._spawn(name, ["redis-server", str(folder / "redis.conf")])
        self.wait_for_replicas(timeout=60)
        for name in self.names:
            folder = self.folder / name
            # A Sentinel rewrites its file: one per node, in the node's folder.
            (folder / "sentinel.conf").write_text(
                sentinel_conf(folder, master_ip, self.down_after_ms))
            self._spawn(name, ["redis-server", str(folder / "sentinel.conf"), "--sentinel"])
        self.wait_for_sentinels(timeout=60)

    def _spawn(self, name: str, argv: list[str]) -> None:
        process = subprocess.Popen(self.net.exec_argv(name, argv), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        self.processes.append(process)

    def server(self, name: str, timeout: float = 1.0) -> redis.Redis:
        return connection(self.net.ip(name), SERVER_PORT, timeout)

    def sentinel(self, name: str) -> redis.Redis:
        return connection(self.net.ip(name), SENTINEL_PORT)

    def name_of(self, ip: str) -> Optional[str]:
        return next((n for n in self.names if self.net.ip(n) == ip), None)

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise SetupError(f"a server process exited ({process.returncode}): "
                                 f"{process.args!r}; see {self.folder}/*/*.log")

    def masters_named(self) -> dict[str, Optional[str]]:
        """Which node each Sentinel names as the master (None: no answer)."""
        named: dict[str, Optional[str]] = {}
        for name in self.names:
            try:
                addr = self.sentinel(name).execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
                named[name] = self.name_of(addr[0]) if addr else None
            except redis.RedisError:
                named[name] = None
        return named

    def current_master(self) -> Optional[str]:
        """The master most Sentinels name (None while no two agree)."""
        votes: dict[str, int] = {}
        for master in self.masters_named().values():
            if master:
                votes[master] = votes.get(master, 0) + 1
        best = max(votes.items(), key=lambda kv: kv[1], default=(None, 0))
        return best[0] if best[1] >= 2 else None

    def replicas_acknowledge(self, master: str, count: int) -> bool:
        """A write on ``master`` acknowledged by ``count`` replicas (WAIT) within 2 s."""
        try:
            server = self.server(master, timeout=4.0)
            server.set("partitions:ready", str(time.monotonic()))
            return int(server.execute_command("WAIT", count, 2000)) >= count
        except redis.RedisError:
            return False  # NOREPLICAS before any replica connected, or not reachable

    def wait_for_replicas(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.replicas_acknowledge(self.names[0], len(self.names) - 1):
            self.check_alive()
            if time.monotonic() > deadline:
                raise SetupError(f"the replicas never acknowledged a write in {timeout} s; "
                                 f"see {self.folder}/*/server.log")
            time.sleep(0.5)

    def wait_for_sentinels(self, timeout: float) -> None:
        """Every Sentinel sees the master, both replicas and the two other Sentinels."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                infos = [dict(self._pairs(self.sentinel(n).execute_command(
                    "SENTINEL", "MASTER", MASTER_NAME))) for n in self.names]
                if all(i.get("num-slaves") == "2" and i.get("num-other-sentinels") == "2"
                       for i in infos):
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise SetupError(f"the Sentinels did not find each other in {timeout} s; "
                                 f"see {self.folder}/*/sentinel.log")
            time.sleep(0.5)

    @staticmethod
    def _pairs(flat: Any) -> list[tuple[str, str]]:
        if isinstance(flat, dict):
            return list(flat.items())
        return list(zip(flat[0::2], flat[1::2]))

    def settle(self, timeout: float) -> tuple[Optional[str], float]:
        """After the last heal: wait until every Sentinel names the same master and both
        replicas acknowledge a write on it. Returns that master (or the one most Sentinels
        name, if it never settled) and the seconds it took."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            named = set(self.masters_named().values())
            if len(named) == 1 and None not in named:
                master = named.pop()
                assert master is not None
                if self.replicas_acknowledge(master, len(self.names) - 1):
                    return master, time.monotonic() - start
            time.sleep(0.5)
        return self.current_master(), -1.0

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
