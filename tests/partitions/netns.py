"""The network of a partition run: one namespace per server node and per client, each with a
veth into a bridge of the root namespace, and faults made of iptables DROP rules inside the
namespaces concerned.

Every name starts with the run's pid and the subnet is one nobody on the host uses yet, so two
runs side by side never meet. The root namespace keeps an address on the bridge (``.1``) and no
rule ever drops it: the orchestrator can always reach every server and Sentinel, whatever the
fault, so a fault never hangs the run.
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass, field

COMMAND_TIMEOUT = 15  # seconds for any ip/iptables call: a stuck one must not hang the run


class SetupError(RuntimeError):
    """Something the run needs could not be made; the message says what."""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise SetupError(f"timed out: {' '.join(argv)}") from e
    if check and done.returncode != 0:
        raise SetupError(f"failed ({done.returncode}): {' '.join(argv)}: {done.stderr.strip()}")
    return done


def free_subnet(start: int) -> str:
    """A 10.77.x.0/24 no interface of the host has an address in (x tried from ``start``)."""
    used = sh("ip", "-4", "-o", "addr").stdout
    for i in range(250):
        third = (start + i) % 250 + 1
        prefix = f"10.77.{third}."
        if prefix not in used:
            return prefix
    raise SetupError("no free 10.77.x.0/24 subnet")


@dataclass
class Net:
    """The bridge, the namespaces and their addresses; ``hosts`` maps a name (n1, c2) to its
    namespace and address."""

    pid: int
    prefix: str = ""
    bridge: str = ""
    hosts: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (netns, ip)
    cut_namespaces: set[str] = field(default_factory=set)

    @property
    def root_ip(self) -> str:
        return self.prefix + "1"

    def ip(self, name: str) -> str:
        return self.hosts[name][1]

    def netns(self, name: str) -> str:
        return self.hosts[name][0]

    def setup(self, names: list[str]) -> None:
        """The bridge with the root's address, then one namespace per name at .10, .11, ..."""
        self.prefix = free_subnet(self.pid % 250)
        self.bridge = f"pb{self.pid}"[:15]
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.root_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, name in enumerate(names):
            netns = f"p{self.pid}{name}"
            veth = f"v{self.pid}{name}"[:15]
            ip = f"{self.prefix}{10 + i}"
            sh("ip", "netns", "add", netns)
            self.hosts[name] = (netns, ip)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
            sh("ip", "link", "set", veth, "master", self.bridge)
            sh("ip", "link", "set", veth, "up")
            sh("ip", "-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", netns, "link", "set", "eth0", "up")
            sh("ip", "-n", netns, "link", "set", "lo", "up")
        ipaddress.ip_address(self.root_ip)  # a malformed prefix fails here, not later

    def exec_argv(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run inside ``name``'s namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.netns(name), *argv]

    def drop_between(self, name: str, others: list[str], port: int | None = None,
                     direction: str = "both", loss: float | None = None) -> None:
        """Silently drop, in ``name``'s namespace, packets between it and ``others`` (only TCP
        to or from ``port`` when given): with ``direction`` "both", every packet either way
        (nothing gets through, and the other side sees no reset, only silence); "out", only
        what ``name`` sends to them (they still reach it); "in", only what they send to it (it
        still reaches them). A TCP connection does not last over a one-way cut: what is sent the
        open way may arrive and be read at first, but its acknowledgements are lost, so the
        sender soon stops sending new data; and no new connection completes.

        With ``loss`` (a fraction, 0 to 1) each such packet is dropped only at random with that
        probability (iptables' ``statistic`` match), as on a lossy link: TCP connections
        last, and what is lost is sent again after a retransmission timeout."""
        if direction not in ("both", "out", "in"):
            raise ValueError(f"direction {direction!r}: both, out or in")
        netns = self.netns(name)
        for other in others:
            addr = self.ip(other)
            ports = [[]] if port is None else [["-p", "tcp", "--dport", str(port)],
                                                ["-p", "tcp", "--sport", str(port)]]
            chance = [] if loss is None else ["-m", "statistic", "--mode", "random",
                                               "--probability", str(loss)]
            for match in ([*m, *chance] for m in ports):
                if direction in ("both", "in"):
                    sh("ip", "netns", "exec", netns, "iptables", "-w", "5", "-A", "INPUT",
                       "-s", addr, *match, "-j", "DROP")
                if direction in ("both", "out"):
                    sh("ip", "netns", "exec", netns, "iptables", "-w", "5", "-A", "OUTPUT",
                       "-d", addr, *match, "-j", "DROP")
        self.cut_namespaces.add(netns)

    def heal(self) -> None:
        """Every rule any fault added, removed."""
        for netns in sorted(self.cut_namespaces):
            sh("ip", "netns", "exec", netns, "iptables", "-w", "5", "-F", "INPUT", check=False)
            sh("ip", "netns", "exec", netns, "iptables", "-w", "5", "-F", "OUTPUT", check=False)
        self.cut_namespaces.clear()

    def teardown(self) -> None:
        """The namespaces (their veths go with them) and the bridge; what is already gone is
        skipped, so this may run twice."""
        for netns, _ in self.hosts.values():
            sh("ip", "netns", "del", netns, check=False)
        if self.bridge:
            sh("ip", "link", "del", self.bridge, check=False)
