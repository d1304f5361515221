#!/usr/bin/env python3
"""Both libraries' waits, with tickets (the default) and blocked in the server, side by side in
one run.

    make bench-waits [CONTENDERS=2,8,32 WAITERS=2000 KEYS=5 WAIT_SECS=3 REPS=3]

Each run starts a fresh server with the release module; ticket and blocked runs alternate
(ABAB, the kind that goes first switching every repetition), for the Python library (asyncio,
one `AsyncLockClient`, in this process) and the Rust library (one `LockClient` on tokio:
clients/rust/examples/library_waits.rs, run when LIBRARY_WAITS_RUST names its binary). Cases:

- **N contenders, 1 key** (N in CONTENDERS): N tasks loop `acquire` (waiting up to 60 s) and
  `release` on one key for SECS seconds; grants per second.
- **WAITERS waiters, KEYS keys**: the same loop, task `i` on key `i % KEYS`.
- **WAITERS waiters queued on KEYS keys**: KEYS locks held, WAITERS tasks (task `i` on key
  `i % KEYS`) each acquiring once then releasing, all queued behind them: the growth of the
  server's `used_memory` per waiter, connections included (a blocked wait holds one of its own;
  ticket waits share the asking and popping connections), read once it holds still; then the
  holds released, and WAITERS over the time until the last waiter released (grants/s draining
  the queues).

Prints one table: the median and the min-max over the repetitions, and tickets ÷ blocked.
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
CONTENDERS = [int(n) for n in os.environ.get("CONTENDERS", "2,8,32").split(",") if n]
SECS = float(os.environ.get("SECS", "3"))
#: The Rust library's twin (``cargo build --release -p redis-lock-client --example
#: library_waits``); unset: the Python library only.
RUST = os.environ.get("LIBRARY_WAITS_RUST", "")
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


async def throughput(port: int, tickets: bool, waiters: int, keys: int, secs: float) -> float:
    """``waiters`` tasks, each looping acquire (waiting up to 60 s) and release on its key
    (``i % keys``) for ``secs``: grants per second."""
    pool, client = new_client(port, tickets)
    grants = 0
    stop = time.monotonic() + secs

    async def waiter(i: int) -> None:
        nonlocal grants
        lock = client.lock(f"waits:{i % keys}", wait_timeout=60)
        while time.monotonic() < stop:
            guard = await lock.acquire()
            grants += 1
            await guard.release()

    began = time.monotonic()
    await asyncio.gather(*(waiter(i) for i in range(waiters)))
    rate = grants / (time.monotonic() - began)
    await client.aclose()
    await pool.aclose()
    return rate


async def once(port: int, tickets: bool, waiters: int, keys: int) -> float:
    """``waiters`` tasks started together, each acquiring its key (``i % keys``) once and
    releasing it at once: ``waiters`` over the time until the last release."""
    pool, client = new_client(port, tickets)

    async def waiter(i: int) -> None:
        guard = await client.lock(f"once:{i % keys}", wait_timeout=120).acquire()
        await guard.release()

    began = time.monotonic()
    await asyncio.gather(*(waiter(i) for i in range(waiters)))
    rate = waiters / (time.monotonic() - began)
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


async def queued(pool: aredis.Redis, keys: int) -> int:
    """The waiters queued on the held keys (LOCK.INFO's ``waiters``: blocked and ticketed)."""
    total = 0
    for k in range(keys):
        reply = await pool.execute_command("LOCK.INFO", f"mem:{k}")
        fields = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))
        total += int(fields.get(b"waiters", fields.get("waiters", 0)) or 0)
    return total


async def queued_then_drained(
    port: int, tickets: bool, waiters: int, keys: int
) -> tuple[float, float]:
    """``keys`` locks held, ``waiters`` tasks each acquiring its key (``i % keys``) once and
    releasing it at once, queued behind them: the growth of the server's ``used_memory`` per
    waiter once all are queued; then the holds released, and ``waiters`` over the time until the
    last waiter released (the queues drained: each grant hands the key to a waiter already
    queued)."""
    pool, client = new_client(port, tickets)
    holder_pool, holder = new_client(port, tickets)
    held = [await holder.lock(f"mem:{k}", lease=120).acquire() for k in range(keys)]
    before = await used_memory(pool)

    async def waiter(i: int) -> None:
        guard = await client.lock(f"mem:{i % keys}", wait_timeout=120).acquire()
        await guard.release()

    tasks = [asyncio.create_task(waiter(i)) for i in range(waiters)]
    deadline = time.monotonic() + 60
    while await queued(pool, keys) < waiters:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {await queued(pool, keys)} of {waiters} waiters queued in 60 s")
        await asyncio.sleep(0.2)
    after = await used_memory(pool)
    began = time.monotonic()
    for guard in held:
        await guard.release()
    await asyncio.gather(*tasks)
    rate = waiters / (time.monotonic() - began)
    await client.aclose()
    await holder.aclose()
    await pool.aclose()
    await holder_pool.aclose()
    return (after - before) / waiters, rate


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


#: (label, mode, waiters, keys): ``loop`` cases give grants/s; the ``queued`` case gives the
#: memory per waiter with all queued, then the grants/s of draining the queues.
def cases() -> list[tuple[str, str, int, int]]:
    out = [(f"{n} contenders, 1 key", "loop", n, 1) for n in CONTENDERS]
    out.append((f"{WAITERS} waiters, {KEYS} keys", "loop", WAITERS, KEYS))
    out.append((f"{WAITERS} waiters queued on {KEYS} keys", "queued", WAITERS, KEYS))
    return out


def run_python(port: int, tickets: bool, mode: str, waiters: int, keys: int) -> list[float]:
    if mode == "loop":
        return [asyncio.run(throughput(port, tickets, waiters, keys, SECS))]
    return list(asyncio.run(queued_then_drained(port, tickets, waiters, keys)))


def run_rust(port: int, tickets: bool, mode: str, waiters: int, keys: int) -> list[float]:
    """One run of the Rust library's twin (clients/rust/examples/library_waits.rs): it prints
    ``rate R`` (loop) or ``memory M rate R`` (queued)."""
    kind = "tickets" if tickets else "blocked"
    done = subprocess.run(
        [RUST, str(port), kind, mode, str(waiters), str(keys), str(SECS)],
        capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"library_waits {kind} {mode}: {done.stderr.strip()}")
    return [float(v) for v in done.stdout.split()[1::2]]


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> int:
    libraries = [("Python", run_python)] + ([("Rust", run_rust)] if RUST else [])
    figures: dict[tuple[str, str, bool], list[list[float]]] = {}
    print(f"load average before: {load()} ({os.cpu_count()} CPUs)", file=sys.stderr, flush=True)
    for rep in range(REPS):
        for label, mode, waiters, keys in cases():
            for library, run in libraries:
                # ABAB: the kind that goes first alternates with the repetition.
                order = (True, False) if rep % 2 == 0 else (False, True)
                for tickets in order:
                    for attempt in range(3):
                        proc, port = start_server()
                        try:
                            values = run(port, tickets, mode, waiters, keys)
                            break
                        except Exception as e:  # noqa: BLE001 - a loaded machine: once more
                            if attempt == 2:
                                raise
                            print(f"failed ({e}); again", file=sys.stderr, flush=True)
                        finally:
                            proc.kill()
                            proc.wait()
                    figures.setdefault((library, label, tickets), []).append(values)
                    shown = ", ".join(f"{v:,.0f}" for v in values)
                    print(f"rep {rep + 1}: {library}, {label}, "
                          f"{'tickets' if tickets else 'blocked'}: {shown}",
                          file=sys.stderr, flush=True)
    print(f"load average after: {load()}", file=sys.stderr, flush=True)
    print(f"\nMedians over {REPS} repetitions (min–max); tickets and blocked runs interleaved, "
          f"a fresh {SERVER} for each run; loops run {SECS:g} s; load average at the end "
          f"{load()} on {os.cpu_count()} CPUs.\n")
    print("| library | case | figure | tickets | blocked | tickets ÷ blocked |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for library, _ in libraries:
        for label, mode, _, _ in cases():
            names = ["grants/s"] if mode == "loop" else [
                "server memory per waiter (B)", "grants/s draining the queues"]
            for i, name in enumerate(names):
                t = [v[i] for v in figures[(library, label, True)]]
                b = [v[i] for v in figures[(library, label, False)]]
                ratio = statistics.median(t) / statistics.median(b)
                print(f"| {library} | {label} | {name} | {spread(t)} | {spread(b)} | "
                      f"{ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
