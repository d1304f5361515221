#!/usr/bin/env python3
"""Contention on one key, the Python library on three kinds of waiting side by side:

- **module tickets**: the LOCK.* module, waits with tickets (the default), with its lost-hold
  signal (the default there: a subscription per hold), and without it (``lost_signal=False``,
  as on the Functions library, which has none);
- **Functions tickets**: the redislock Functions library (no module), waits with tickets in the
  key's line (the default there too);
- **Functions unlock channel**: the same library, ``wait_with_tickets=False``: each wait listens
  to the unlock message and asks again (no line).

    LOCK_MODULE=target/release/libredis_lock.so python3 scripts/functions-waits.py \\
        [N="2 8 32"] [SECS=5] [REPS=3]

For each N and each kind (a fresh server each run) N asyncio tasks, each with a client of its
own (as N processes would), loop on one key for SECS seconds: ``acquire`` (waiting up to 60 s),
``release``. Reported: acquisitions per second; the commands the clients sent per acquisition,
from INFO commandstats (the lock commands: ``LOCK.*`` or ``FCALL``/``FCALL_RO``; ``BLPOP``; and
the rest the clients send: ``CLIENT UNBLOCK``/``ID``, ``SUBSCRIBE``, ``PING``, ``MULTI``/``EXEC``);
and Jain's fairness index of the tasks' acquisitions (1 = every task as many). Medians over REPS.
"""
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from redis_lock_client.aio import AsyncLockClient

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
MODULE = os.environ.get("LOCK_MODULE") or os.path.join(ROOT, "target", "release", "libredis_lock.so")
LIBRARY = os.path.join(ROOT, "functions", "redislock.lua")
SERVER = os.environ.get("LOCK_SERVER", "redis-server")
SIZES = [int(n) for n in os.environ.get("N", "2 8 32").split()]
SECS = float(os.environ.get("SECS", "5"))
REPS = int(os.environ.get("REPS", "3"))
KINDS = ("module tickets", "module tickets, lost_signal=False", "Functions tickets",
         "Functions unlock channel")
#: What the clients send besides the lock commands and BLPOP (commands a function runs are
#: counted by commandstats too, so those are left out by name).
OTHER = ("client|unblock", "client|id", "client|setname", "subscribe", "unsubscribe", "ping",
         "multi", "exec")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(module: bool) -> tuple[subprocess.Popen, int]:
    port = free_port()
    args = [SERVER, "--port", str(port), "--save", "", "--appendonly", "no", "--dir",
            tempfile.mkdtemp()]
    if module:
        args += ["--loadmodule", MODULE]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    if not module:
                        import redis
                        with open(LIBRARY, "rb") as f:
                            redis.Redis(port=port).execute_command("FUNCTION", "LOAD", "REPLACE", f.read())
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{SERVER} did not start")


async def run(port: int, n: int, kind: str) -> tuple[float, dict[str, float], float]:
    import redis.asyncio as aredis
    admin = aredis.Redis(port=port)
    options = {"wait_with_tickets": not kind.endswith("channel")}
    if kind.endswith("lost_signal=False"):
        options["lost_signal"] = False
    clients = [AsyncLockClient.from_url(f"redis://127.0.0.1:{port}/", **options)
               for _ in range(n)]
    for c in clients:
        await c.backend()
    counts = [0] * n
    await admin.config_resetstat()
    stop = time.monotonic() + SECS

    async def task(i: int) -> None:
        lock = clients[i].lock("contended", wait_timeout=60)
        while time.monotonic() < stop:
            guard = await lock.acquire()
            counts[i] += 1
            await guard.release()

    began = time.monotonic()
    await asyncio.gather(*(task(i) for i in range(n)))
    elapsed = time.monotonic() - began
    stats = await admin.info("commandstats")
    for c in clients:
        await c.aclose()
    await admin.aclose()

    def calls(name: str) -> int:
        return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))

    total = sum(counts)
    lock_commands = sum(calls(c) for c in ("fcall", "fcall_ro", "lock.acquire", "lock.release",
                                          "lock.cancel", "lock.info"))
    per = {
        "lock": lock_commands / total,
        "blpop": calls("blpop") / total,
        "other": sum(calls(c) for c in OTHER) / total,
    }
    fairness = total ** 2 / (n * sum(c * c for c in counts))
    return total / elapsed, per, fairness


def main() -> int:
    rows = []
    for n in SIZES:
        figures: dict[str, list[tuple[float, dict[str, float], float]]] = {k: [] for k in KINDS}
        for rep in range(REPS):
            for kind in KINDS if rep % 2 == 0 else reversed(KINDS):
                proc, port = start_server(module=kind.startswith("module"))
                try:
                    got = asyncio.run(run(port, n, kind))
                finally:
                    proc.kill()
                    proc.wait()
                figures[kind].append(got)
                print(f"N={n} rep {rep + 1} {kind}: {got[0]:,.0f}/s, {got[1]}, Jain {got[2]:.3f}",
                      file=sys.stderr, flush=True)
        for kind in KINDS:
            runs = figures[kind]
            med = lambda xs: statistics.median(xs)  # noqa: E731
            rows.append((n, kind, med([r[0] for r in runs]), med([r[1]["lock"] for r in runs]),
                         med([r[1]["blpop"] for r in runs]), med([r[1]["other"] for r in runs]),
                         med([r[2] for r in runs])))
    print(f"\nOne key, N clients (asyncio), {SECS:g} s a run, {SERVER}; medians over {REPS}:\n")
    print("| N | waiting | acquisitions/s | lock commands / acq. | BLPOP / acq. | other / acq. | Jain |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for n, kind, rate, lock, blpop, other, fair in rows:
        print(f"| {n} | {kind} | {rate:,.0f} | {lock:.2f} | {blpop:.2f} | {other:.2f} | {fair:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
