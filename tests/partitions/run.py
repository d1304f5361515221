"""The partition test (``make partitions SECS=120 SEED=1``): three server nodes, each a
``redis-server`` with the lock module and a Sentinel in a network namespace of its own, clients
of the Python library in namespaces of their own, and a nemesis cutting the network with
iptables DROP rules; then a check of what the clients saw against what the servers kept.

Run as root (namespaces, iptables), in the Python library's venv. See README.md beside it.
Everything it made (namespaces, bridge, processes) is removed at the end, on failure and on
Ctrl-C too; what it wrote stays in target/partitions/<time>/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis

import check
from nemesis import Nemesis
from netns import Net, SetupError
from nodes import SENTINEL_PORT, Nodes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NODES = ["n1", "n2", "n3"]
PLAIN_KEYS = ["{plain:a}", "{plain:b}"]
ACKED_KEYS = ["{acked:a}", "{acked:b}"]  # locked with replicas=1
KINDS = {"plain": PLAIN_KEYS, "replicas=1": ACKED_KEYS}
CLIENT_GRACE_SECS = 45  # past SECS, a client still running is killed (its last op: no answer)
SETTLE_SECS = 90


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secs", type=float, default=float(os.environ.get("SECS") or 120))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED") or 1))
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--module", default=os.environ.get("LOCK_MODULE")
                        or "/work/lib/libredis_lock.so")
    parser.add_argument("--out", default=str(ROOT / "target" / "partitions"))
    return parser.parse_args()


def check_prerequisites(module: str) -> None:
    if os.geteuid() != 0:
        raise SetupError("run as root: network namespaces and iptables need it")
    for tool in ("ip", "iptables", "redis-server"):
        if shutil.which(tool) is None:
            raise SetupError(f"{tool} not found (apt-get install -y iproute2 iptables "
                             "redis-server; make partitions installs them)")
    if not Path(module).is_file():
        raise SetupError(f"the module {module} does not exist (cargo build --lib)")


def raise_on_signals() -> None:
    """SIGTERM and SIGHUP end the run as Ctrl-C does, through the cleanup of ``main``."""
    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)


def start_clients(net: Net, names: list[str], folder: Path, secs: float,
                  seed: int) -> list[subprocess.Popen[bytes]]:
    sentinels = ",".join(f"{net.ip(n)}:{SENTINEL_PORT}" for n in NODES)
    processes = []
    for name in names:
        argv = [sys.executable, str(HERE / "client.py"), "--name", name,
                "--sentinels", sentinels, "--plain", ",".join(PLAIN_KEYS),
                "--acked", ",".join(ACKED_KEYS), "--secs", str(secs), "--seed", str(seed),
                "--out", str(folder / f"history-{name}.jsonl")]
        with open(folder / f"{name}.stderr", "wb") as err:
            processes.append(subprocess.Popen(net.exec_argv(name, argv),
                                              stdout=subprocess.DEVNULL, stderr=err))
    return processes


def wait_for_clients(processes: list[subprocess.Popen[bytes]], deadline: float) -> int:
    """Waits for each client until ``deadline``, then kills the rest; returns how many were
    killed (a client stuck in a call must not hang the run)."""
    killed = 0
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            killed += 1
    return killed


def read_final_logs(nodes: Nodes, master: str) -> dict[str, list[str]]:
    server = nodes.server(master, timeout=5.0)
    # decode_responses: every entry is a str.
    return {key: [str(e) for e in server.lrange(f"{key}:log", 0, -1)]
            for keys in KINDS.values() for key in keys}


def read_history(folder: Path, clients: list[str]) -> list[dict[str, Any]]:
    history = []
    for name in clients:
        path = folder / f"history-{name}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    history.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut short by a kill
    history.sort(key=lambda op: op["invoke"])
    with open(folder / "history.jsonl", "w") as out:
        for op in history:
            out.write(json.dumps(op) + "\n")
    return history


def count_failovers(folder: Path) -> int:
    """The most ``+switch-master`` events one Sentinel logged (each logs every one it saw)."""
    counts = []
    for name in NODES:
        path = folder / name / "sentinel.log"
        counts.append(path.read_text().count("+switch-master") if path.exists() else 0)
    return max(counts, default=0)


def main() -> int:
    args = parse_args()
    raise_on_signals()
    folder = Path(args.out) / time.strftime(f"%Y%m%d-%H%M%S-seed{args.seed}")
    folder.mkdir(parents=True, exist_ok=True)
    clients = [f"c{i + 1}" for i in range(args.clients)]
    net = Net(os.getpid())
    nodes = Nodes(net, NODES, args.module, folder)
    client_processes: list[subprocess.Popen[bytes]] = []
    nemesis = None
    try:
        check_prerequisites(args.module)
        print(f"partitions: SECS={args.secs:g} SEED={args.seed}, writing to {folder}",
              flush=True)
        net.setup(NODES + clients)
        print(f"  network {net.prefix}0/24 (bridge {net.bridge}), starting the nodes",
              flush=True)
        nodes.start()
        client_processes = start_clients(net, clients, folder, args.secs, args.seed)
        start = time.monotonic()
        nemesis = Nemesis(net, nodes, clients, args.seed, str(folder / "nemesis.jsonl"))
        thread = threading.Thread(target=nemesis.run, args=(start + args.secs,), daemon=True)
        thread.start()
        killed = wait_for_clients(client_processes, start + args.secs + CLIENT_GRACE_SECS)
        end = time.monotonic()
        nemesis.stop.set()
        thread.join(timeout=30)
        net.heal()
        if nemesis.error is not None:
            raise SetupError(f"the nemesis failed: {nemesis.error!r}")
        print(f"  clients done ({killed} killed at the deadline); settling", flush=True)
        master, settle_secs = nodes.settle(SETTLE_SECS)
        if master is None:
            raise SetupError(f"no master the Sentinels agree on {SETTLE_SECS} s after the "
                             "last heal")
        logs = read_final_logs(nodes, master)
        (folder / "final-logs.json").write_text(json.dumps(logs))
        history = read_history(folder, clients)
        faults = [(f.start, f.end) for f in nemesis.faults]
        by_kind = {}
        for kind, keys in KINDS.items():
            by_kind[kind] = check.check_kind([op for op in history if op["key"] in keys],
                                             {k: logs[k] for k in keys}, faults, (start, end))
        failovers = count_failovers(folder)
        table = check.markdown_table(by_kind, len(nemesis.faults), failovers)
        settled = (f"settled on {master} in {settle_secs:.1f} s" if settle_secs >= 0 else
                   f"NOT settled in {SETTLE_SECS} s (read {master}, named by most Sentinels)")
        summary = (f"`make partitions SECS={args.secs:g} SEED={args.seed}`: {len(clients)} "
                   f"clients, {end - start:.0f} s; {settled}.\n\n{table}")
        fault_kinds = [(f.kind, f.start, f.end) for f in nemesis.faults]
        for kind, c in by_kind.items():
            if c.lost_writes:
                summary += (f"\n{kind}: acknowledged writes lost, by the fault they were made in "
                            f"(or within 15 s of its heal): "
                            f"{check.by_fault(c.lost_write_times, fault_kinds)}")
        summary += "\n"
        (folder / "table.md").write_text(summary)
        (folder / "examples.json").write_text(json.dumps(
            {k: c.examples for k, c in by_kind.items()}, indent=1))
        print("\n" + summary)
        broken = [f"{kind}: {b}" for kind, c in by_kind.items() for b in c.failed]
        for kind, c in by_kind.items():
            for name, examples in c.examples.items():
                for example in examples[:3]:
                    print(f"  e.g. {kind} {name}: {example}")
        if broken:
            print("FAILED: " + "; ".join(broken) + f" (history in {folder})")
            return 1
        print(f"passed; history, nemesis log and server logs in {folder}")
        return 0
    except SetupError as e:
        print(f"partitions: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"partitions: interrupted ({e}); cleaning up", file=sys.stderr)
        return 130
    except redis.RedisError as e:
        print(f"partitions: reading the servers failed: {e!r}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the cleanup
        if nemesis is not None:
            nemesis.stop.set()
        for process in client_processes:
            if process.poll() is None:
                process.kill()
        nodes.stop()
        net.heal()
        net.teardown()


if __name__ == "__main__":
    sys.exit(main())
