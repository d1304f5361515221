"""The nemesis: at seeded random moments, one fault at a time, each healed before the next,
with healthy pauses between. Every fault is a set of iptables DROP rules (netns.py), so the
processes cut off see silence, not resets, as with a real partition."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from netns import Net
from nodes import SENTINEL_PORT, SERVER_PORT, Nodes

# How often each fault is drawn: the master cut off from its replicas (the split-brain case)
# most, as it is the one that makes two masters.
FAULTS = {
    "isolate-master": 3,
    "isolate-client-from-master": 2,
    "isolate-replica": 2,
    "partition-sentinels": 1,
}
# Drawn only when asked for (run.py --faults): a run of a seed without them draws the same
# faults as before they existed.
MORE_FAULTS = {
    "master-cannot-send": 2,  # one way: the master's packets to the other nodes dropped
    "client-cannot-receive": 1,  # one way: a client hears nothing from the master's node
    "flapping-master": 2,  # the master cut off and healed again and again within one fault
    # REPLICATION_LOSS of the packets between the master's server port and the other nodes
    # dropped at random (no delay: the kernel has no netem, see README.md)
    "replication-loss": 2,
}
REPLICATION_LOSS = 0.3
WEIGHTS = {**FAULTS, **MORE_FAULTS}
FAULT_SECS = (3.0, 10.0)
HEALTHY_SECS = (2.0, 6.0)
FLAP_SECS = (0.5, 2.0)  # each cut of a flapping fault, and each heal between two cuts


@dataclass
class Fault:
    kind: str
    target: str
    cut_from: list[str]
    start: float  # monotonic, when the rules were in place (a flapping fault: its first cut)
    end: float = 0.0  # when they were removed (a flapping fault: its last heal)
    master_before: Optional[str] = None
    wall_start: float = 0.0  # time.time() at start, to read beside the servers' logs
    port: Optional[int] = None  # the one TCP port cut (None: everything)
    direction: str = "both"  # "out": only the target's packets to cut_from; "in": only theirs
    flaps: list[list[float]] = field(default_factory=list)  # [cut, heal] of each flapping cut
    loss: Optional[float] = None  # the share of the packets dropped (None: every one)


class Nemesis:
    def __init__(self, net: Net, nodes: Nodes, clients: list[str], seed: int,
                 log_path: str, kinds: Optional[list[str]] = None) -> None:
        self.net, self.nodes, self.clients = net, nodes, clients
        self.kinds = list(FAULTS) if kinds is None else kinds
        unknown = [k for k in self.kinds if k not in WEIGHTS]
        if unknown or not self.kinds:
            raise ValueError(f"fault kinds {unknown or self.kinds}: choose from {list(WEIGHTS)}")
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

    def draw(self) -> Fault:
        """A fault, not yet applied: its kind, the host whose namespace gets the rules, whom
        it is cut from, the one port concerned and the direction."""
        kind = self.rng.choices(self.kinds, weights=[WEIGHTS[k] for k in self.kinds])[0]
        master = self.master()
        others = [n for n in self.nodes.names if n != master]
        fault = Fault(kind, master, others, 0.0, master_before=master)
        if kind == "isolate-client-from-master":
            fault.target, fault.cut_from = self.rng.choice(self.clients), [master]
        elif kind == "isolate-replica":
            replica = self.rng.choice(others)
            rest = [n for n in self.nodes.names if n != replica] + self.clients
            fault.target, fault.cut_from = replica, rest
        elif kind == "partition-sentinels":
            target = self.rng.choice(self.nodes.names)
            fault.target = target
            fault.cut_from = [n for n in self.nodes.names if n != target]
            fault.port = SENTINEL_PORT
        elif kind == "master-cannot-send":
            fault.direction = "out"
        elif kind == "client-cannot-receive":
            fault.target, fault.cut_from = self.rng.choice(self.clients), [master]
            fault.direction = "in"
        elif kind == "replication-loss":
            fault.port, fault.loss = SERVER_PORT, REPLICATION_LOSS
        # isolate-master and flapping-master: the master from both other nodes, both ways.
        return fault

    def cut(self, fault: Fault) -> None:
        self.net.drop_between(fault.target, fault.cut_from, fault.port, fault.direction,
                              fault.loss)

    def flap(self, fault: Fault, length: float) -> None:
        """Cuts and heals ``fault``'s rules in turn (each for FLAP_SECS) until ``length`` has
        passed since its first cut, ending healed; the same node throughout, even if a
        failover made it a replica meanwhile."""
        end = time.monotonic() + length
        while not self.stop.is_set():
            self.cut(fault)
            cut_at = time.monotonic()
            if not fault.flaps:
                fault.start, fault.wall_start = cut_at, time.time()
            self.stop.wait(min(self.rng.uniform(*FLAP_SECS), max(0.0, end - cut_at)))
            self.net.heal()
            fault.flaps.append([cut_at, time.monotonic()])
            pause = self.rng.uniform(*FLAP_SECS)
            if time.monotonic() + pause >= end or self.stop.wait(pause):
                break

    def run(self, until: float) -> None:
        try:
            while not self.stop.is_set() and time.monotonic() < until:
                if self.stop.wait(self.rng.uniform(*HEALTHY_SECS)):
                    break
                fault = self.draw()
                length = self.rng.uniform(*FAULT_SECS)
                if time.monotonic() + length > until:
                    break
                if fault.kind == "flapping-master":
                    self.flap(fault, length)
                    if not fault.flaps:
                        break  # stopped before its first cut
                else:
                    self.cut(fault)
                    fault.start, fault.wall_start = time.monotonic(), time.time()
                    self.stop.wait(length)
                    self.net.heal()
                fault.end = time.monotonic()
                self.faults.append(fault)
                self.log.write(json.dumps(asdict(fault)) + "\n")
                arrow = {"both": "x", "out": "->|", "in": "|<-"}[fault.direction]
                detail = f", {len(fault.flaps)} cuts" if fault.flaps else ""
                if fault.loss is not None:
                    detail += f", {fault.loss:.0%} of packets on port {fault.port}"
                print(f"  nemesis: {fault.kind} {fault.target} {arrow} {','.join(fault.cut_from)} "
                      f"{fault.end - fault.start:.1f} s{detail}", flush=True)
        except BaseException as e:  # noqa: BLE001 - reported by the orchestrator, then healed
            self.error = e
        finally:
            self.net.heal()
