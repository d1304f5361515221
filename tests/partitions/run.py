"""The partition test (``make partitions SECS=120 SEED=1``): three server nodes, each a
``redis-server`` with the lock module and a Sentinel in a network namespace of its own, clients
of both lock libraries (Python's client.py, Rust's partition_client example) in namespaces of
their own, and a nemesis cutting the network with iptables DROP rules; then a check of what the
clients saw against what the servers kept.

Run as root (namespaces, iptables), in the Python library's venv, with the Rust example built
(``cargo build -p redis-lock-client --example partition_client``; the Makefile does both). See
README.md beside it.
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
from nemesis import FAULTS, WEIGHTS, Nemesis
from netns import Net, SetupError
from nodes import DOWN_AFTER_MS, MIN_REPLICAS, SENTINEL_PORT, Nodes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NODES = ["n1", "n2", "n3"]
PLAIN_KEYS = ["{plain:a}", "{plain:b}"]
ACKED_KEYS = ["{acked:a}", "{acked:b}"]  # locked with replicas=1
SEMAPHORE_KEYS = ["{sem:a}"]  # a counting semaphore of SEMAPHORE_LIMIT permits
SEMAPHORE_LIMIT = 2
ELECTION_KEYS = ["{elect:a}"]  # its leaders write heartbeats to {elect:a}:log
ACKED_ELECTION_KEYS = ["{elect:b}"]  # the same, campaigned for with replicas=1
KINDS = {"plain": PLAIN_KEYS, "replicas=1": ACKED_KEYS, "semaphore": SEMAPHORE_KEYS,
         "election": ELECTION_KEYS, "election, replicas=1": ACKED_ELECTION_KEYS}
LIMITS = {"semaphore": SEMAPHORE_LIMIT}  # how many may hold a key of the kind at once; else 1
CLIENT_GRACE_SECS = 45  # past SECS, a client still running is killed (its last op: no answer)
SETTLE_SECS = 90
LIBRARIES = ("python", "rust")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secs", type=float, default=float(os.environ.get("SECS") or 120))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED") or 1))
    parser.add_argument("--python", type=int, default=4, help="clients of the Python library")
    parser.add_argument("--rust", type=int, default=2, help="clients of the Rust library")
    parser.add_argument("--rust-client", default=os.environ.get("RUST_PARTITION_CLIENT")
                        or str(ROOT / "target" / "debug" / "examples" / "partition_client"),
                        help="the Rust library's partition_client example, built")
    parser.add_argument("--module", default=os.environ.get("LOCK_MODULE")
                        or "/work/lib/libredis_lock.so")
    parser.add_argument("--min-replicas", type=int, choices=(0, 1),
                        default=int(os.environ.get("MIN_REPLICAS") or MIN_REPLICAS),
                        help="the servers' min-replicas-to-write (min-replicas-max-lag 10)")
    parser.add_argument("--down-after", type=int,
                        default=int(os.environ.get("DOWN_AFTER") or DOWN_AFTER_MS),
                        help="the Sentinels' down-after-milliseconds")
    parser.add_argument("--faults", default=os.environ.get("FAULTS") or ",".join(FAULTS),
                        help="the kinds of fault the nemesis draws, comma-separated, or 'all' "
                        f"({', '.join(WEIGHTS)}); default: the first {len(FAULTS)}")
    parser.add_argument("--out", default=str(ROOT / "target" / "partitions"))
    args = parser.parse_args()
    args.faults = fault_kinds(args.faults, parser)
    if args.down_after <= 0:
        parser.error("--down-after: a positive number of milliseconds")
    return args


def fault_kinds(spec: str, parser: argparse.ArgumentParser) -> list[str]:
    kinds = list(WEIGHTS) if spec == "all" else [k for k in spec.split(",") if k]
    unknown = [k for k in kinds if k not in WEIGHTS]
    if unknown or not kinds:
        parser.error(f"--faults {spec!r}: choose from {', '.join(WEIGHTS)} (or 'all')")
    return kinds


def configuration(args: argparse.Namespace) -> str:
    """The settings the run's servers and nemesis had, as table.md states them."""
    faults = "all" if args.faults == list(WEIGHTS) else ",".join(args.faults)
    return (f"min-replicas-to-write {args.min_replicas} (min-replicas-max-lag 10), "
            f"down-after-milliseconds {args.down_after} (failover-timeout 10000), "
            f"faults {faults}")


def command_line(args: argparse.Namespace) -> str:
    """The make line that repeats the run (settings left at their defaults are left out)."""
    words = [f"make partitions SECS={args.secs:g} SEED={args.seed}"]
    if args.min_replicas != MIN_REPLICAS:
        words.append(f"MIN_REPLICAS={args.min_replicas}")
    if args.down_after != DOWN_AFTER_MS:
        words.append(f"DOWN_AFTER={args.down_after}")
    if args.faults != list(FAULTS):
        words.append("FAULTS=" + ("all" if args.faults == list(WEIGHTS) else
                                  ",".join(args.faults)))
    return " ".join(words)


def faults_applied(faults: list[Any]) -> str:
    """How many faults of each kind (a flapping one with its number of cuts)."""
    counts: dict[str, list[int]] = {}
    for fault in faults:
        n = counts.setdefault(fault.kind, [0, 0])
        n[0] += 1
        n[1] += len(fault.flaps)
    return ", ".join(f"{n} {kind}" + (f" ({cuts} cuts)" if cuts else "")
                     for kind, (n, cuts) in sorted(counts.items())) or "none"


def check_prerequisites(module: str, rust_client: str | None) -> None:
    if os.geteuid() != 0:
        raise SetupError("run as root: network namespaces and iptables need it")
    for tool in ("ip", "iptables", "redis-server"):
        if shutil.which(tool) is None:
            raise SetupError(f"{tool} not found (apt-get install -y iproute2 iptables "
                             "redis-server; make partitions installs them)")
    if not Path(module).is_file():
        raise SetupError(f"the module {module} does not exist (cargo build --lib)")
    if rust_client is not None and not os.access(rust_client, os.X_OK):
        raise SetupError(f"the Rust client {rust_client} does not exist (cargo build -p "
                         "redis-lock-client --example partition_client)")


def raise_on_signals() -> None:
    """SIGTERM and SIGHUP end the run as Ctrl-C does, through the cleanup of ``main``."""
    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)


def client_names(python: int, rust: int) -> dict[str, str]:
    """Each client's name (c1, c2, ...: the Python library's first) and its library."""
    libraries = ["python"] * python + ["rust"] * rust
    return {f"c{i + 1}": library for i, library in enumerate(libraries)}


def start_clients(net: Net, clients: dict[str, str], rust_client: str, folder: Path,
                  secs: float, seed: int) -> list[subprocess.Popen[bytes]]:
    """One process per client, in its namespace; both libraries take the same arguments."""
    sentinels = ",".join(f"{net.ip(n)}:{SENTINEL_PORT}" for n in NODES)
    processes = []
    for name, library in clients.items():
        program = ([sys.executable, str(HERE / "client.py")] if library == "python"
                   else [rust_client])
        argv = [*program, "--name", name,
                "--sentinels", sentinels, "--plain", ",".join(PLAIN_KEYS),
                "--acked", ",".join(ACKED_KEYS), "--semaphores", ",".join(SEMAPHORE_KEYS),
                "--limit", str(SEMAPHORE_LIMIT), "--elections", ",".join(ELECTION_KEYS),
                "--acked-elections", ",".join(ACKED_ELECTION_KEYS),
                "--secs", str(secs), "--seed", str(seed),
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


def run_summary(args: argparse.Namespace, by_kind: dict[str, check.Counts], faults: list[Any],
                failovers: int, settle_secs: float, broken: list[str]) -> dict[str, Any]:
    """What matrix.py gathers from each run: its settings and, per kind of lock, the counts."""
    kinds: dict[str, int] = {}
    for fault in faults:
        kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
    return {
        "secs": args.secs, "seed": args.seed, "min_replicas": args.min_replicas,
        "down_after": args.down_after, "faults": args.faults,
        "faults_applied": kinds, "cuts": sum(max(1, len(f.flaps)) for f in faults),
        "failovers": failovers, "settle_secs": settle_secs, "failed": broken,
        "locks": {kind: {
            "acquires_ok": c.acquires["ok"], "writes_ok": c.writes["ok"],
            "out_of_order": c.out_of_order, "refused_landed": c.refused_landed,
            "tokens_twice": c.tokens_twice, "overlapping": c.overlapping,
            "overlapping_surviving": c.overlapping_surviving,
            "overlapping_writes": c.overlapping_writes,
            "limit": c.limit, "over_limit": c.over_limit,
            "over_limit_surviving": c.over_limit_surviving,
            "lost_writes": c.lost_writes,
            "unavailability_p50": check.median([s for _, s in c.outages]),
            "unavailability_max": max((s for _, s in c.outages), default=0.0),
        } for kind, c in by_kind.items()},
    }


def main() -> int:
    args = parse_args()
    raise_on_signals()
    folder = Path(args.out) / time.strftime(f"%Y%m%d-%H%M%S-seed{args.seed}")
    folder.mkdir(parents=True, exist_ok=True)
    libraries = client_names(args.python, args.rust)
    clients = list(libraries)
    net = Net(os.getpid())
    nodes = Nodes(net, NODES, args.module, folder, args.min_replicas, args.down_after)
    client_processes: list[subprocess.Popen[bytes]] = []
    nemesis = None
    try:
        check_prerequisites(args.module, args.rust_client if args.rust else None)
        print(f"partitions: SECS={args.secs:g} SEED={args.seed}, {configuration(args)}; "
              f"writing to {folder}", flush=True)
        net.setup(NODES + clients)
        print(f"  network {net.prefix}0/24 (bridge {net.bridge}), starting the nodes",
              flush=True)
        nodes.start()
        client_processes = start_clients(net, libraries, args.rust_client, folder, args.secs,
                                         args.seed)
        start = time.monotonic()
        nemesis = Nemesis(net, nodes, clients, args.seed, str(folder / "nemesis.jsonl"),
                          args.faults)
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
        faults = [(f.kind, f.start, f.end) for f in nemesis.faults]
        by_kind = {}
        by_library = {}
        for kind, keys in KINDS.items():
            kind_history = [op for op in history if op["key"] in keys]
            kind_logs = {k: logs[k] for k in keys}
            limit = LIMITS.get(kind, 1)
            by_kind[kind] = check.check_kind(kind_history, kind_logs, faults, (start, end),
                                             limit=limit)
            for library in LIBRARIES:
                mine = {name for name, lib in libraries.items() if lib == library}
                if mine:
                    by_library[f"{kind}, {library}"] = check.check_kind(
                        kind_history, kind_logs, faults, (start, end), processes=mine,
                        limit=limit)
        failovers = count_failovers(folder)
        table = check.markdown_table(by_kind)
        settled = (f"settled on {master} in {settle_secs:.1f} s" if settle_secs >= 0 else
                   f"NOT settled in {SETTLE_SECS} s (read {master}, named by most Sentinels)")
        used = [library for library in LIBRARIES if library in libraries.values()]
        per_library = ", ".join(f"{list(libraries.values()).count(library)} {library}"
                                for library in used)
        summary = (f"`{command_line(args)}`: {len(clients)} clients ({per_library}), "
                   f"{end - start:.0f} s; {settled}.\n\nConfiguration: {configuration(args)}."
                   f"\n\n{table}\n{len(nemesis.faults)} faults ({faults_applied(nemesis.faults)}), "
                   f"{failovers} failovers.\n")
        for kind, c in by_kind.items():
            summary += (f"\n{kind}: unavailability by kind of fault (faults: p50 / max s): "
                        + "; ".join(f"{fault} {n}: {p50:.1f} / {longest:.1f}" for fault, (
                            n, p50, longest) in check.unavailability_by_kind(c.outages).items())
                        + "\n")
        if len(used) > 1:
            summary += ("\nBy library: each column counts its clients' calls, grants and "
                        "writes (out of order: the late entry is theirs); a pair of overlapping "
                        "holds or a token handed twice counts for each library in it.\n\n"
                        + check.markdown_table(by_library))
        for kind, c in by_kind.items():
            if c.lost_writes:
                summary += (f"\n{kind}: acknowledged writes lost, by the fault they were made in "
                            f"(or within 15 s of its heal): "
                            f"{check.by_fault(c.lost_write_times, faults)}")
        summary += "\n"
        (folder / "table.md").write_text(summary)
        (folder / "examples.json").write_text(json.dumps(
            {k: c.examples for k, c in by_kind.items()}, indent=1))
        broken = [f"{kind}: {b}" for kind, c in by_kind.items() for b in c.failed]
        (folder / "summary.json").write_text(json.dumps(run_summary(
            args, by_kind, nemesis.faults, failovers, settle_secs, broken), indent=1))
        print("\n" + summary)
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
