"""The Python library's part in the failover test: a few holders contending, through Sentinel,
for an exclusive lock, a read lock (shared), a semaphore, an EPHEMERAL exclusive lock and an
election, writing what each acknowledged hold was, as the application saw it, for the checker.

    python clients/python/tests/failover_driver.py \\
        --sentinels 127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381 --master mymaster \\
        --exclusive fo:x --shared fo:r --semaphore fo:s --limit 2 --election fo:e \\
        [--ephemeral fo:p] \\
        --replicas 1 --duration 60 --out python.jsonl

One JSON line per line of ``--out`` (written and flushed as it happens; wall-clock epoch
milliseconds):

- each acknowledged hold, once it ended: ``{"lib": "python", "replicas": 1, "key": ...,
  "kind": "exclusive|shared|permit|ephemeral|leader", "limit": null|n, "owner": ..., "token": ...,
  "asked_ms": ..., "start_ms": ..., "end_ms": ..., "end": "released|lost:<reason>|run-end"}``
  — ``asked_ms`` when the acquire (campaign) was called, ``start_ms`` when it returned the guard, ``end_ms`` when the application stopped
  believing it held: when it began the release, when the library reported the loss (its
  ``on_lost``), or the end of the run;
- each acquire that never got an answer by the end of the run (and a grace period after it):
  ``{"lib": "python", "event": "unanswered", "replicas": ..., "key": ..., "kind": ...,
  "owner": ..., "start_ms": ...}``;
- each acquire that raised: ``{"lib": "python", "event": "acquire-error", "replicas": ...,
  "key": ..., "kind": ..., "owner": ..., "ms": ..., "error": "<Type>: <message>"}`` (a timeout,
  ``LockTimeout``, is an answer, not an error: nothing is written for it).

Holders wait up to ``--wait`` seconds (default 2) for each acquire, hold for 50 ms to
``--hold-max`` (default 0.5 s), release;
leases are ``--lease`` seconds (default 5), renewed by the watchdog. The client's
``failover_timeout`` is ``--failover-timeout`` (default 10 s). A summary goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from typing import Any, Optional

from redis_lock_client import (
    LockClient,
    LockError,
    LockTimeout,
    LostReason,
    NotHeld,
)


def now_ms() -> float:
    return round(time.time() * 1000, 3)


class Out:
    def __init__(self, path: str, replicas: int) -> None:
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()
        self.replicas = replicas
        self.counts: dict[str, int] = {}

    def write(self, line: dict[str, Any]) -> None:
        line = {"lib": "python", **line}
        kind = line.get("event") or line.get("end", "").split(":")[0]
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self._file.write(json.dumps(line) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class Holder:
    """One thread: acquire (bounded wait), hold a moment, release; again until the end."""

    def __init__(self, client: LockClient, kind: str, key: str, limit: Optional[int],
                 args: argparse.Namespace, out: Out, stop: threading.Event, seed: int) -> None:
        self.kind, self.key, self.limit = kind, key, limit
        self.args, self.out, self.stop = args, out, stop
        self.rng = random.Random(seed)
        self.lost: Optional[tuple[float, LostReason]] = None
        self.asking: Optional[float] = None  # start_ms of an acquire not answered yet
        options: dict[str, Any] = {"lease": args.lease, "on_lost": self._on_lost,
                                   "replicas": args.replicas,
                                   "replicas_timeout": args.replicas_timeout}
        if kind == "exclusive":
            self.handle: Any = client.lock(key, wait_timeout=args.wait, **options)
        elif kind == "ephemeral":
            self.handle = client.lock(key, wait_timeout=args.wait, ephemeral=True, **options)
        elif kind == "shared":
            self.handle = client.read_lock(key, wait_timeout=args.wait, **options)
        elif kind == "permit":
            self.handle = client.semaphore(key, limit or 1, wait_timeout=args.wait, **options)
        else:
            self.handle = client.election(key, **options)
        self.owner = (self.handle.candidate if kind == "leader" else self.handle.owner).decode()
        self.thread = threading.Thread(target=self.run, name=f"{kind}:{key}", daemon=True)

    def _on_lost(self, reason: LostReason) -> None:
        if self.lost is None:
            self.lost = (now_ms(), reason)

    def _base(self) -> dict[str, Any]:
        return {"replicas": self.args.replicas, "key": self.key, "kind": self.kind,
                "owner": self.owner}

    def run(self) -> None:
        while not self.stop.is_set():
            self.lost = None
            self.asking = now_ms()
            try:
                if self.kind == "leader":
                    guard = self.handle.campaign(timeout=self.args.wait)
                else:
                    guard = self.handle.acquire()
            except LockTimeout:
                self.asking = None
                continue
            except LockError as e:
                self.asking = None
                self.out.write({"event": "acquire-error", **self._base(), "ms": now_ms(),
                                "error": f"{type(e).__name__}: {e}"})
                time.sleep(0.1)
                continue
            start, asked = now_ms(), self.asking
            self.asking = None
            token = guard.epoch if self.kind == "leader" else guard.token
            until = time.monotonic() + self.rng.uniform(0.05, self.args.hold_max)
            while time.monotonic() < until and not self.stop.is_set() and self.lost is None:
                time.sleep(0.01)
            if self.lost is not None:
                end_ms, end = self.lost[0], f"lost:{self.lost[1].value}"
            elif self.stop.is_set():
                end_ms, end = now_ms(), "run-end"
            else:
                end_ms, end = now_ms(), "released"
            try:
                guard.release()
            except NotHeld:
                if self.lost is not None and end == "released":  # lost as the release began
                    end_ms, end = min(end_ms, self.lost[0]), f"lost:{self.lost[1].value}"
            except LockError:
                pass
            self.out.write({**self._base(), "limit": self.limit, "token": token,
                            "asked_ms": asked, "start_ms": start, "end_ms": end_ms, "end": end})


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentinels", required=True, help="host:port,host:port,...")
    p.add_argument("--master", required=True, help="the master's name in Sentinel")
    p.add_argument("--exclusive", help="the exclusive lock's key")
    p.add_argument("--shared", help="the read lock's key (shared holds)")
    p.add_argument("--semaphore", help="the semaphore's key")
    p.add_argument("--limit", type=int, default=2, help="the semaphore's permits")
    p.add_argument("--election", help="the election's key")
    p.add_argument("--ephemeral", help="the EPHEMERAL exclusive lock's key")
    p.add_argument("--replicas", type=int, choices=[0, 1], required=True)
    p.add_argument("--replicas-timeout", type=float, default=1.0)
    p.add_argument("--duration", type=float, required=True, help="seconds")
    p.add_argument("--out", required=True, help="the JSON lines file (appended to)")
    p.add_argument("--lease", type=float, default=5.0)
    p.add_argument("--wait", type=float, default=2.0, help="each acquire's wait_timeout")
    p.add_argument("--holders", type=int, default=3, help="holders per key")
    p.add_argument("--hold-max", type=float, default=0.5,
                   help="the longest a hold is kept, seconds (each is kept 50 ms to this)")
    p.add_argument("--failover-timeout", type=float, default=10.0)
    p.add_argument("--grace", type=float, default=None,
                   help="after the run, how long an acquire may still answer (default: "
                        "wait + failover-timeout + 5 s)")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    sentinels = [(h, int(port)) for h, port in (a.rsplit(":", 1) for a in args.sentinels.split(","))]
    client = LockClient.from_sentinel(sentinels, args.master,
                                      failover_timeout=args.failover_timeout)
    out = Out(args.out, args.replicas)
    stop = threading.Event()
    rng = random.Random(args.seed)
    keys = [("exclusive", args.exclusive, None), ("shared", args.shared, None),
            ("permit", args.semaphore, args.limit), ("leader", args.election, None),
            ("ephemeral", args.ephemeral, None)]
    holders = [Holder(client, kind, key, limit, args, out, stop, rng.randrange(1 << 30))
               for kind, key, limit in keys if key for _ in range(args.holders)]
    if not holders:
        p.error("no key given")
    for h in holders:
        h.thread.start()
    time.sleep(args.duration)
    stop.set()
    grace = args.grace if args.grace is not None else args.wait + args.failover_timeout + 5
    deadline = time.monotonic() + grace
    for h in holders:
        h.thread.join(max(deadline - time.monotonic(), 0.0))
    for h in holders:
        if h.thread.is_alive() and h.asking is not None:
            out.write({"event": "unanswered", **h._base(), "start_ms": h.asking})
    print(f"failover_driver: {json.dumps(out.counts)}", file=sys.stderr)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
