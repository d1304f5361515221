"""The nemesis: at seeded random moments, one fault at a time, each healed before the next,
with healthy pauses between. Every fault is a set of iptables DROP rules (netns.py), so the
processes cut off see silence, not resets, as with a real partition."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Optional

from netns import Net
from nodes import SENTINEL_PORT, Nodes

# How often each fault is drawn: the master cut off from its replicas (the split-brain case)
# most, as it is the one that makes two masters.
FAULTS = {
    "isolate-master": 3,
    "isolate-client-from-master": 2,
    "isolate-replica": 2,
    "partition-sentinels": 1,
}
FAULT_SECS = (3.0, 10.0)
HEALTHY_SECS = (2.0, 6.0)


@dataclass
class Fault:
    kind: str
    target: str
    cut_from: list[str]
    start: float  # monotonic, when the rules were in place
    end: float = 0.0  # when they were removed
    master_before: Optional[str] = None
    wall_start: float = 0.0  # time.time() at start, to read beside the servers' logs


class Nemesis:
    def __init__(self, net: Net, nodes: Nodes, clients: list[str], seed: int,
                 log_path: str) -> None:
        self.net, self.nodes, self.clients = net, nodes, clients
        self.rng = random.Random(seed)
        self.log = open(log_path, "a", buffering=1)
        self.faults: list[Fault] = []
        self.stop = threading.Event()
        self.last_master = nodes.names[0]
        self.error: Optional[BaseException] = None

    def master(self) -> str:
        # A moment with no agreed master (mid-failover) keeps the last one known.
        self.last_master = self.nodes.current_master() or self.last_master
        return self.last_master

    def draw(self) -> tuple[str, str, list[str], Optional[int]]:
        """A fault: its kind, the host whose namespace gets the rules, whom it is cut from, and
        the one port concerned (None: everything)."""
        kind = self.rng.choices(list(FAULTS), weights=list(FAULTS.values()))[0]
        master = self.master()
        others = [n for n in self.nodes.names if n != master]
        if kind == "isolate-master":
            return kind, master, others, None
        if kind == "isolate-client-from-master":
            return kind, self.rng.choice(self.clients), [master], None
        if kind == "isolate-replica":
            replica = self.rng.choice(others)
            rest = [n for n in self.nodes.names if n != replica] + self.clients
            return kind, replica, rest, None
        target = self.rng.choice(self.nodes.names)
        return kind, target, [n for n in self.nodes.names if n != target], SENTINEL_PORT

    def run(self, until: float) -> None:
        try:
            while not self.stop.is_set() and time.monotonic() < until:
                if self.stop.wait(self.rng.uniform(*HEALTHY_SECS)):
                    break
                kind, target, cut_from, port = self.draw()
                length = self.rng.uniform(*FAULT_SECS)
                if time.monotonic() + length > until:
                    break
                fault = Fault(kind, target, cut_from, 0.0, master_before=self.last_master)
                self.net.drop_between(target, cut_from, port)
                fault.start, fault.wall_start = time.monotonic(), time.time()
                self.stop.wait(length)
                self.net.heal()
                fault.end = time.monotonic()
                self.faults.append(fault)
                self.log.write(json.dumps(asdict(fault)) + "\n")
                print(f"  nemesis: {kind} {target} x {','.join(cut_from)} "
                      f"{fault.end - fault.start:.1f} s", flush=True)
        except BaseException as e:  # noqa: BLE001 - reported by the orchestrator, then healed
            self.error = e
        finally:
            self.net.heal()
