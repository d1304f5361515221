"""The server's truth, read on connections of the oracle's own: every few milliseconds one
``MULTI`` per server reads each lock key (``LOCK.INFO``: the holds alive on the server's clock)
and drains each key's writes list (``LRANGE`` + ``DEL``: the writes that landed since the last
read). A disruption that ends holds from the server side runs inside such a ``MULTI``, between
a read before and a read after, so what it ended and which writes landed before it are exact.
The rest (CLIENT KILL, a slot migration) runs on this same thread, between two reads."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import redis

Holds = frozenset[tuple[str, int]]


def parse_holds(reply: Any) -> tuple[Holds, int]:
    """(owner, token) of every hold ``LOCK.INFO`` shows (a hold whose lease ended is not), and
    how many of them are exclusive."""
    if not isinstance(reply, list):
        return frozenset(), 0
    fields = dict(zip(reply[::2], reply[1::2]))
    out = set()
    exclusive = 0
    for entry in fields.get(b"holders") or []:
        holder = dict(zip(entry[::2], entry[1::2]))
        owner, token = holder.get(b"owner"), holder.get(b"token")
        if isinstance(owner, bytes) and isinstance(token, int):
            out.add((owner.decode(), token))
        exclusive += holder.get(b"mode") == b"exclusive"
    return frozenset(out), exclusive


@dataclass
class Snap:
    """One read of the lock keys of one server: the holds alive, and the writes that landed
    since the previous read of the same keys. ``phase``: ``plain``, or ``before``/``after`` a
    disruption run in the same MULTI (``dis``)."""

    seq: int
    t0: float
    t1: float
    phase: str
    dis: Optional[int]
    holds: dict[str, Holds]
    writes: dict[str, list[str]]


@dataclass
class Disruption:
    idx: int
    kind: str
    t0: float = 0.0
    t1: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None


Call = Callable[["Truth"], dict[str, Any]]


@dataclass
class _Job:
    kind: str
    group: str
    commands: list[list[Any]]
    call: Optional[Call]
    detail: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Optional[Disruption] = None


class Truth:
    """``nodes``: port → a raw connection of the oracle's own; ``groups``: group → its lock
    keys (one hash tag in a cluster); ``where``: group → port of the server that serves it."""

    def __init__(self, nodes: dict[int, redis.Redis], groups: dict[str, list[str]],
                 where: dict[str, int], limits: dict[str, int], period: float = 0.005) -> None:
        self.nodes = nodes
        #: A semaphore key's limit: more permits than that at once is a violation (and on any
        #: other key an exclusive hold beside another hold).
        self.limits = limits
        self.violations: list[str] = []
        self.groups = groups
        self.where = dict(where)
        self.period = period
        self.snaps: list[Snap] = []
        self.disruptions: list[Disruption] = []
        self._jobs: "queue.Queue[_Job]" = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oracle-truth", daemon=True)
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _read_commands(self, keys: list[str]) -> list[list[Any]]:
        out: list[list[Any]] = []
        for k in keys:
            out += [["LOCK.INFO", k], ["LRANGE", k + ":writes", 0, -1], ["DEL", k + ":writes"]]
        return out

    def _parse(self, keys: list[str], replies: list[Any]) -> tuple[dict[str, Holds],
                                                                    dict[str, list[str]]]:
        holds: dict[str, Holds] = {}
        writes: dict[str, list[str]] = {}
        for i, k in enumerate(keys):
            info, landed = replies[3 * i], replies[3 * i + 1]
            if isinstance(info, Exception) or isinstance(landed, Exception):
                raise RuntimeError(f"truth read of {k}: {info!r} {landed!r}")
            holds[k], exclusive = parse_holds(info)
            writes[k] = [w.decode() for w in landed]
            limit = self.limits.get(k)
            if limit is not None and len(holds[k]) > limit:
                self.violations.append(f"{k}: {len(holds[k])} permits held, limit {limit}")
            if exclusive and len(holds[k]) > 1:
                self.violations.append(f"{k}: an exclusive hold beside others: {holds[k]}")
        return holds, writes

    def _multi(self, group: str, middle: list[list[Any]]) -> tuple[float, float, list[Any]]:
        """One MULTI on the server of ``group`` (in a cluster a transaction stays in one slot:
        one group, one hash tag)."""
        read = self._read_commands(self.groups[group])
        pipe = self.nodes[self.where[group]].pipeline(transaction=True)
        for c in read + middle + (read if middle else []):
            pipe.execute_command(*c)
        t0 = time.monotonic()
        replies = pipe.execute(raise_on_error=False)
        t1 = time.monotonic()
        return t0, t1, replies

    def _read(self, group: str) -> None:
        keys = self.groups[group]
        t0, t1, replies = self._multi(group, [])
        holds, writes = self._parse(keys, replies)
        self.snaps.append(Snap(len(self.snaps), t0, t1, "plain", None, holds, writes))

    def _disrupt(self, job: _Job) -> Disruption:
        d = Disruption(len(self.disruptions), job.kind, detail=dict(job.detail))
        if job.call is not None:
            d.t0 = time.monotonic()
            try:
                d.detail.update(job.call(self))
            except Exception as e:  # noqa: BLE001 - recorded: the run goes on
                d.error = f"{type(e).__name__}: {e}"
            d.t1 = time.monotonic()
            self.disruptions.append(d)
            return d
        keys = self.groups[job.group]
        try:
            d.t0, d.t1, replies = self._multi(job.group, job.commands)
        except Exception as e:  # noqa: BLE001 - recorded: the run goes on
            d.error = f"{type(e).__name__}: {e}"
            self.disruptions.append(d)
            return d
        n = 3 * len(keys)
        before = self._parse(keys, replies[:n])
        middle = replies[n:n + len(job.commands)]
        after = self._parse(keys, replies[n + len(job.commands):])
        errors = [repr(r) for r in middle if isinstance(r, Exception)]
        if errors:
            d.error = "; ".join(errors)
        d.detail["replies"] = [r if isinstance(r, (int, str)) else repr(r) for r in middle]
        self.disruptions.append(d)
        self.snaps.append(Snap(len(self.snaps), d.t0, d.t1, "before", d.idx, *before))
        self.snaps.append(Snap(len(self.snaps), d.t0, d.t1, "after", d.idx, *after))
        return d

    def submit(self, kind: str, group: str, commands: Optional[list[list[Any]]] = None,
               call: Optional[Call] = None, **detail: Any) -> Disruption:
        """Runs a disruption on the truth's thread: ``commands`` in a MULTI on the server of
        ``group``, between a read before and a read after; or ``call`` between two reads.
        Returns once done."""
        job = _Job(kind, group, commands or [], call, detail)
        self._jobs.put(job)
        job.done.wait(60)
        assert job.result is not None, f"the truth keeper did not run {kind}"
        return job.result

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                while True:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    try:
                        job.result = self._disrupt(job)
                    finally:
                        job.done.set()
                for group in self.groups:
                    self._read(group)
            except Exception as e:  # noqa: BLE001 - recorded, asserted on
                self.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.05)
            time.sleep(self.period)
        for group in self.groups:  # the last writes
            try:
                self._read(group)
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{type(e).__name__}: {e}")
