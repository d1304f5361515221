#!/usr/bin/env python3
"""The Python library's waits, with tickets (the default) and blocked in the server, side by
side in one run: many asyncio waiters on a few keys.

    make bench-waits [WAITERS=2000 KEYS=5 WAIT_SECS=10 REPS=3]

For each repetition (the two kinds in turn, the first alternating) it starts a fresh server with
the release module and measures, on one `AsyncLockClient`:

- **throughput**: WAITERS tasks, each looping on its key (`i % KEYS`): `acquire` (waiting up to
  60 s), `release`, for SECS seconds; grants per second;
- **memory**: WAITERS waits queued behind KEYS held locks: the growth of the server's
  `used_memory` per waiter, with the connections each kind needs (a blocked wait holds one of its
  own; ticket waits share the asking and popping connections), read once it holds still.

Prints one table per figure: the median and the min-max over the repetitions.
"""
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import redis.asyncio as aredis

from redis_lock_client.aio import AsyncLockClient

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.environ.get("LOCK_MODULE") or os.path.join(
    HERE, "..", "target", "release", "libredis_lock.so")
SERVER = os.environ.get("LOCK_SERVER", "redis-server")
WAITERS = int(os.environ.get("WAITERS", "2000"))
KEYS = int(os.environ.get("KEYS", "5"))
SECS = float(os.environ.get("SECS", "10"))
REPS = int(os.environ.get("REPS", "3"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [SERVER, "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", tempfile.mkdtemp(), "--maxclients", str(WAITERS + 1000),
         "--loadmodule", MODULE],
        stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{SERVER} did not start")


def new_client(port: int, tickets: bool) -> tuple[aredis.Redis, AsyncLockClient]:
    pool = aredis.Redis(port=port, max_connections=WAITERS + 100)
    return pool, AsyncLockClient(pool, wait_with_tickets=tickets)


async def throughput(port: int, tickets: bool) -> float:
    pool, client = new_client(port, tickets)
    grants = 0
    stop = time.monotonic() + SECS

    async def waiter(i: int) -> None:
        nonlocal grants
        lock = client.lock(f"waits:{i % KEYS}", wait_timeout=60)
        while time.monotonic() < stop:
            guard = await lock.acquire()
            grants += 1
            await guard.release()

    began = time.monotonic()
    await asyncio.gather(*(waiter(i) for i in range(WAITERS)))
    rate = grants / (time.monotonic() - began)
    await client.aclose()
    await pool.aclose()
    return rate


async def used_memory(pool: aredis.Redis) -> int:
    """used_memory once it holds still (the server trims idle connections' buffers and
    rehashes in the background)."""
    last = -1
    for _ in range(50):
        now = int((await pool.info("memory"))["used_memory"])
        if now == last:
            return now
        last = now
        await asyncio.sleep(0.2)
    return last


async def queued(pool: aredis.Redis) -> int:
    """The waiters queued on the held keys (LOCK.INFO's ``waiters``: blocked and ticketed)."""
    total = 0
    for k in range(KEYS):
        reply = await pool.execute_command("LOCK.INFO", f"mem:{k}")
        fields = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))
        total += int(fields.get(b"waiters", fields.get("waiters", 0)) or 0)
    return total


async def memory(port: int, tickets: bool) -> float:
    pool, client = new_client(port, tickets)
    holder_pool, holder = new_client(port, tickets)
    held = [await holder.lock(f"mem:{k}", lease=120).acquire() for k in range(KEYS)]
    before = await used_memory(pool)
    tasks = [asyncio.create_task(client.lock(f"mem:{i % KEYS}", wait_timeout=120).acquire())
             for i in range(WAITERS)]
    deadline = time.monotonic() + 60
    while await queued(pool) < WAITERS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {await queued(pool)} of {WAITERS} waiters queued in 60 s")
        await asyncio.sleep(0.2)
    after = await used_memory(pool)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for guard in held:
        await guard.release()
    await client.aclose()
    await holder.aclose()
    await pool.aclose()
    await holder_pool.aclose()
    return (after - before) / WAITERS


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def main() -> int:
    figures: dict[tuple[str, bool], list[float]] = {}
    for rep in range(REPS):
        order = (True, False) if rep % 2 == 0 else (False, True)
        for tickets in order:
            proc, port = start_server()
            try:
                rate = asyncio.run(throughput(port, tickets))
                per_waiter = asyncio.run(memory(port, tickets))
            finally:
                proc.kill()
                proc.wait()
            figures.setdefault(("rate", tickets), []).append(rate)
            figures.setdefault(("memory", tickets), []).append(per_waiter)
            print(f"rep {rep + 1}: {'tickets' if tickets else 'blocked'}: {rate:,.0f} grants/s, "
                  f"{per_waiter:,.0f} B per waiter", file=sys.stderr, flush=True)
    print(f"\nPython library (asyncio), {WAITERS} waiters on {KEYS} keys, {SECS:g} s a run, "
          f"{SERVER}; medians over {REPS} repetitions (min–max):\n")
    print("| waiting | grants/s | server memory per waiter, connections included (B) |")
    print("| --- | ---: | ---: |")
    for tickets, name in ((True, "ticket (default)"), (False, "blocked in the server")):
        print(f"| {name} | {spread(figures[('rate', tickets)])} | "
              f"{spread(figures[('memory', tickets)])} |")
    ratio = statistics.median(figures[("rate", True)]) / statistics.median(figures[("rate", False)])
    print(f"\nticket / blocked throughput: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
