"""One client process of the partition test (run inside its own network namespace, in the
Python library's venv). It loops until ``--secs`` have passed: pick a key, acquire its lock
through Sentinel, write to the key's log through the guard (``LOCK.GUARD``: the write runs only
while the token is current) twice with a pause between, release. A ``--semaphores`` key is
held the same way, one permit of ``--limit``; an ``--elections`` key is campaigned for
(``campaign``, the same wait), and its leader writes heartbeats to the key's log through the
leadership's fence (the epoch is its token) every HEARTBEAT_SECS, then resigns (an
``--acked-elections`` key alike, campaigned for with ``replicas=1``). Every
operation is one JSON line of ``--out``, written when it completes (a campaign is an
``acquire``, a resignation a ``release``, a heartbeat a ``write``)::

    {"process": "c1", "lib": "python", "op": "acquire|write|release|lost", "key": "{plain:a}",
     "invoke": <monotonic s>, "complete": <monotonic s>, "outcome": "ok|fail|info",
     "token": <int or null>, "entry": "<what the write pushed>", "error": "..."}

``ok``: the server answered yes; ``fail``: it answered no, nothing happened (a timeout, a
refusal, FENCED); ``info``: no answer, it may or may not have happened. ``lost`` is the
library telling the application its hold is gone (its ``on_lost``): the end of its belief.
Times are ``time.monotonic()``, which on Linux is one clock for every process of the host.
The Rust library's twin, ``clients/rust/examples/partition_client.rs``, writes the same lines
(``"lib": "rust"``), on the same clock.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from typing import Any, Callable, Optional

from redis_lock_client import (
    Fenced,
    LockClient,
    LockConnectionError,
    LockError,
    LockTimeout,
    NotHeld,
    NotSafelyAcquired,
)


SHORT_HOLD_SECS = (0.05, 0.4)  # the pause between a hold's two writes, mostly
LONG_HOLD_SECS = (2.0, 8.0)  # ... and in LONG_HOLD_SHARE of the holds
LONG_HOLD_SHARE = 0.1
WAIT_SECS = 1.0  # how long an acquire or a campaign waits in the server
HEARTBEATS = (2, 6)  # a leader's heartbeats in one term, besides its first write
HEARTBEAT_SECS = (0.1, 0.3)  # the pause before each


class Candidacy:
    """An election handle seen as a lock handle: ``acquire`` campaigns (``LockTimeout`` when
    ``wait`` passes) and returns the leadership as a guard."""

    def __init__(self, election: Any, wait: float) -> None:
        self.election, self.wait = election, wait

    def acquire(self) -> Term:
        return Term(self.election.campaign(timeout=self.wait))


class Term:
    """A leadership seen as a guard: its epoch is its token, its fenced writes are the
    leader's heartbeats, resigning is releasing."""

    def __init__(self, leadership: Any) -> None:
        self.leadership = leadership
        self.token: int = leadership.epoch

    def execute(self, *command: Any) -> Any:
        return self.leadership.execute(*command)

    def release(self) -> Any:
        return self.leadership.resign()


def lock_pauses(rng: random.Random) -> list[float]:
    """A lock's or permit's two writes: at once, then after a short pause, or now and then a
    long one (a holder that dawdles past its lease: a slow step, a GC pause; with the watchdog
    renewing it is still the holder, unless a fault cut it off meanwhile, and then its second
    write must be refused, not land after a newer holder's)."""
    dawdle = rng.random() < LONG_HOLD_SHARE
    return [0.0, rng.uniform(*(LONG_HOLD_SECS if dawdle else SHORT_HOLD_SECS))]


def heartbeat_pauses(rng: random.Random) -> list[float]:
    """A leader's heartbeats: one at once, then one every HEARTBEAT_SECS; in LONG_HOLD_SHARE
    of the terms the last one comes after a long pause, as a lock's dawdling second write."""
    pauses = [0.0] + [rng.uniform(*HEARTBEAT_SECS) for _ in range(rng.randint(*HEARTBEATS))]
    if rng.random() < LONG_HOLD_SHARE:
        pauses[-1] = rng.uniform(*LONG_HOLD_SECS)
    return pauses


class History:
    """The JSON-lines file, one line per completed operation, flushed as it happens so a
    killed process leaves everything it completed."""

    def __init__(self, path: str, process: str) -> None:
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()  # on_lost runs on the library's threads
        self.process = process

    def record(self, **fields: Any) -> None:
        line = json.dumps({"process": self.process, "lib": "python", **fields})
        with self._lock:
            self._file.write(line + "\n")


def outcome_of(error: Exception) -> str:
    """What an error says about whether the operation happened: a connection error or a
    timeout of the command may have run it (``info``); every other answer says it did not."""
    if isinstance(error, LockConnectionError):
        return "info"
    return "fail"


def connect(sentinels: list[tuple[str, int]], master: str, deadline: float) -> LockClient:
    """The library's client, retried until the Sentinels answer (they may be cut off at the
    start) or the run is over."""
    while True:
        try:
            return LockClient.from_sentinel(sentinels, master, command_timeout=1.0,
                                            failover_timeout=5.0)
        except Exception as e:  # noqa: BLE001 - any failure to connect is retried the same way
            if time.monotonic() > deadline:
                raise SystemExit(f"no master found through the Sentinels: {e}")
            time.sleep(0.5)


def hold_and_write(history: History, handle: Any, key: str, pauses: list[float],
                   counter: list[int], current_tokens: dict[str, int]) -> None:
    """One round: acquire, a fenced write after each of ``pauses``, release."""
    invoke = time.monotonic()
    try:
        guard = handle.acquire()
    except (LockTimeout, NotSafelyAcquired, LockError) as e:
        history.record(op="acquire", key=key, invoke=invoke, complete=time.monotonic(),
                       outcome=outcome_of(e), token=None, error=f"{type(e).__name__}: {e}")
        return
    token = guard.token
    current_tokens[key] = token
    history.record(op="acquire", key=key, invoke=invoke, complete=time.monotonic(),
                   outcome="ok", token=token)
    for pause in pauses:
        time.sleep(pause)
        counter[0] += 1
        entry = f"{history.process}:{token}:{counter[0]}"
        invoke = time.monotonic()
        try:
            guard.execute("RPUSH", f"{key}:log", entry)
            outcome, error = "ok", None
        except (Fenced, NotHeld) as e:
            outcome, error = "fail", f"{type(e).__name__}: {e}"
        except LockError as e:
            outcome, error = outcome_of(e), f"{type(e).__name__}: {e}"
        history.record(op="write", key=key, invoke=invoke, complete=time.monotonic(),
                       outcome=outcome, token=token, entry=entry, error=error)
    invoke = time.monotonic()
    try:
        guard.release()
        outcome, error = "ok", None
    except LockError as e:
        outcome, error = outcome_of(e), f"{type(e).__name__}: {e}"
    history.record(op="release", key=key, invoke=invoke, complete=time.monotonic(),
                   outcome=outcome, token=token, error=error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--sentinels", required=True, help="host:port,host:port,...")
    parser.add_argument("--master", default="lockmaster")
    parser.add_argument("--plain", required=True, help="keys locked with replicas=0")
    parser.add_argument("--acked", required=True, help="keys locked with replicas=1")
    parser.add_argument("--semaphores", default="",
                        help="semaphore keys, one permit of --limit held at a time")
    parser.add_argument("--limit", type=int, default=2, help="the semaphores' permits")
    parser.add_argument("--elections", default="", help="election keys")
    parser.add_argument("--acked-elections", default="",
                        help="election keys campaigned for with replicas=1")
    parser.add_argument("--secs", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease", type=float, default=4.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    end = time.monotonic() + args.secs
    sentinels = [(h, int(p)) for h, p in (s.split(":") for s in args.sentinels.split(","))]
    history = History(args.out, args.name)
    rng = random.Random(f"{args.seed}:{args.name}")
    client = connect(sentinels, args.master, end)

    handles: dict[str, Any] = {}
    current_tokens: dict[str, int] = {}  # the token of each key's last grant, for on_lost

    def on_lost_of(key: str) -> Callable[[Any], None]:
        def on_lost(reason: Any) -> None:
            # The library's word that a hold is gone: the end of the application's belief.
            now = time.monotonic()
            history.record(op="lost", key=key, invoke=now, complete=now, outcome="info",
                           token=current_tokens.get(key),
                           error=str(getattr(reason, "value", reason)))
        return on_lost

    for replicas, keys in ((0, args.plain), (1, args.acked)):
        for key in keys.split(","):
            handles[key] = client.lock(key, lease=args.lease, wait_timeout=WAIT_SECS,
                                       replicas=replicas, replicas_timeout=0.5,
                                       on_lost=on_lost_of(key))
    for key in filter(None, args.semaphores.split(",")):
        handles[key] = client.semaphore(key, args.limit, lease=args.lease,
                                        wait_timeout=WAIT_SECS, on_lost=on_lost_of(key))
    elections = set(filter(None, args.elections.split(",")))
    acked_elections = set(filter(None, args.acked_elections.split(",")))
    for replicas, keys in ((0, elections), (1, acked_elections)):
        for key in keys:
            handles[key] = Candidacy(client.election(key, args.name, lease=args.lease,
                                                     replicas=replicas, replicas_timeout=0.5,
                                                     on_lost=on_lost_of(key)), WAIT_SECS)
    elections |= acked_elections
    counter = [0]
    rounds = 0
    while time.monotonic() < end:
        key = rng.choice(sorted(handles))
        pauses = heartbeat_pauses(rng) if key in elections else lock_pauses(rng)
        hold_and_write(history, handles[key], key, pauses, counter, current_tokens)
        rounds += 1
        time.sleep(rng.uniform(0.0, 0.05))
    print(f"{args.name}: {rounds} rounds", file=sys.stderr)
    client.close()


if __name__ == "__main__":
    main()
