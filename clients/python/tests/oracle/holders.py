"""What a holder does: a seeded random sequence of acquires (waiting, waiting longer than the
lease, one attempt, a short wait that times out, an asyncio wait cancelled mid-way), critical
sections that write through the fence (``guard.execute``), re-entries, releases, guards
dropped unreleased (for the garbage collector, sometimes only through a cycle), and re-acquires
through the same handle. Each step is recorded with its monotonic time (CLOCK_MONOTONIC: one
clock for every process of the machine).

Events (dicts, one JSON line each in a worker process):

- ``granted``: a guard was handed to the application: ``owner``, ``keys``, ``tokens``,
  ``reentry`` (the same hold again); a new hold also ``asked``, when its acquire began (the
  server granted it between ``asked`` and ``t``);
- ``end``: the application stops believing it holds (``how``: ``release``, ``drop``, ``gc``),
  recorded before the release is sent or the guard dropped;
- ``lost``: the library reported the hold lost (the ``on_lost`` callback), with ``reason`` and
  ``check``: what ``LOCK.CHECK`` answered for each key, asked by the callback itself before it
  returned (so before the library acts on the loss, e.g. closes an EPHEMERAL connection);
- ``fenced``: a write refused ``FENCED`` (a stale write the server stopped); ``wrote``: how many
  writes landed in a critical section; ``busy``, ``timeout``, ``cancelled``, ``acquire-error``,
  ``error`` (anything unexpected).
"""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from redis_lock_client import (
    Fenced,
    LockConnectionError,
    LockError,
    LockServerError,
    LockTimeout,
    LostReason,
    NotHeld,
)

Record = Callable[[dict[str, Any]], None]
Check = Callable[[Sequence[str], str, Sequence[int]], list[int]]


@dataclass
class Spec:
    """One holder: its id, what it takes (``kind``: lock, read, sem, multi, election; its
    keys; a semaphore's limit), EPHEMERAL or not, its lease, its seed."""

    hid: str
    ctx: str
    kind: str
    keys: list[str]
    limit: int = 0
    ephemeral: bool = False
    lease: float = 2.0
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def writes_key(key: str) -> str:
    """The list a critical section on ``key`` appends to (same hash tag as the lock key)."""
    return key + ":writes"


def entry(owner: bytes, token: int, seq: int) -> str:
    return f"{owner.decode()}|{token}|{seq}"


def make_handle(client: Any, spec: Spec, on_lost: Callable[[LostReason], None]) -> Any:
    opts: dict[str, Any] = {"lease": spec.lease, "on_lost": on_lost, "ephemeral": spec.ephemeral}
    if spec.kind == "lock":
        return client.lock(spec.keys[0], **opts)
    if spec.kind == "read":
        return client.read_lock(spec.keys[0], **opts)
    if spec.kind == "sem":
        return client.semaphore(spec.keys[0], spec.limit, **opts)
    if spec.kind == "multi":
        return client.multi_lock(spec.keys, **opts)
    if spec.kind == "election":
        return client.election(spec.keys[0], **opts)
    raise ValueError(spec.kind)


class _Base:
    def __init__(self, spec: Spec, check: Check, record: Record, stop: threading.Event) -> None:
        self.spec = spec
        self.check = check
        self.rec = record
        self.stop = stop
        self.rng = random.Random(spec.seed)
        self.handle: Any = None
        self.emit("spec", lease=spec.lease, kind=spec.kind, keys=spec.keys,
                  ephemeral=spec.ephemeral)

    def emit(self, event: str, **fields: Any) -> None:
        self.rec({"e": event, "h": self.spec.hid, "ctx": self.spec.ctx, "t": time.monotonic(),
                  **fields})

    def _inner(self) -> Any:
        return self.handle._candidate if self.spec.kind == "election" else self.handle

    def on_lost(self, reason: LostReason) -> None:
        """The library reports a loss: which hold (the handle's active one: instrumentation
        reads the library's private ``_active``), and what the server says of it right now."""
        t = time.monotonic()
        hold = self._inner()._active
        if hold is None:
            self.rec({"e": "lost", "h": self.spec.hid, "ctx": self.spec.ctx, "t": t,
                      "reason": reason.value, "owner": None})
            return
        keys = [k.decode() for k in hold.keys.keys]
        owner = hold.owner.decode()
        tokens = list(hold.tokens)
        try:
            checks = self.check(keys, owner, tokens)
        except Exception as e:  # noqa: BLE001 - recorded: no answer is no evidence
            checks = [f"error: {e}"]  # type: ignore[list-item]
        self.rec({"e": "lost", "h": self.spec.hid, "ctx": self.spec.ctx, "t": t,
                  "ct": time.monotonic(), "reason": reason.value, "owner": owner, "keys": keys,
                  "tokens": tokens, "check": checks})

    def describe(self, guard: Any) -> dict[str, Any]:
        hold = guard._hold
        return {"owner": hold.owner.decode(), "keys": [k.decode() for k in hold.keys.keys],
                "tokens": list(hold.tokens)}

    def dropped(self, guard: Any) -> None:
        """A guard let go unreleased: remembered (weakly) to tell a later grant that joins its
        hold — the library's, when the collector has not taken the dropped guard yet — from one
        that gets its token anew."""
        self._dropped_hold = weakref.ref(guard._hold)

    def joins_dropped(self, guard: Any) -> bool:
        ref: Optional[weakref.ref[Any]] = getattr(self, "_dropped_hold", None)
        return ref is not None and ref() is guard._hold

    def wait_choice(self) -> tuple[str, Optional[float]]:
        lease = self.spec.lease
        action = self.rng.choices(
            ["wait", "wait-long", "try", "short-wait", "cancel"], weights=[4, 2, 2, 2, 2])[0]
        if action == "wait":
            return action, None
        if action == "wait-long":
            return action, self.rng.uniform(1.2, 2.5) * lease
        if action == "try":
            return action, 0.0
        return action, self.rng.uniform(0.05, 0.5)

    def section_length(self) -> float:
        lease = self.spec.lease
        return self.rng.choice([self.rng.uniform(0.02, 0.3), self.rng.uniform(0.3, 1.0) * lease,
                                self.rng.uniform(1.2, 2.5) * lease])

    def leave_choice(self) -> str:
        if self.stop.is_set() or self.spec.kind == "election":
            return "release"  # a leadership is kept by its election handle: never collected
        return self.rng.choices(["release", "drop", "gc"], weights=[6, 2, 1])[0]

    def write_args(self, guard: Any, seq: int) -> list[tuple[Optional[str], tuple[Any, ...]]]:
        """The fenced commands of one step of a critical section, each with the lock key whose
        writes list it appends to (None: a read)."""
        hold = guard._hold
        if self.spec.kind == "read":
            return [(None, ("LLEN", writes_key(self.spec.keys[0])))]
        if self.spec.kind == "multi":
            return [(k.decode(), (k, "RPUSH", writes_key(k.decode()), entry(hold.owner, t, seq)))
                    for k, t in zip(hold.keys.keys, hold.tokens)]
        key = hold.keys.keys[0].decode()
        return [(key, ("RPUSH", writes_key(key), entry(hold.owner, hold.token, seq)))]


class SyncHolder(_Base):
    """A holder on the sync API (a thread of its own)."""

    def __init__(self, client: Any, spec: Spec, check: Check, record: Record,
                 stop: threading.Event) -> None:
        super().__init__(spec, check, record, stop)
        self.handle = make_handle(client, spec, self.on_lost)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                time.sleep(self.rng.uniform(0.0, 0.2))
        except Exception as e:  # noqa: BLE001 - recorded and asserted on
            self.emit("error", what=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")

    def _take(self, wait: Optional[float]) -> Any:
        if self.spec.kind == "election":
            try:
                return self.handle.campaign(timeout=wait)
            except LockTimeout:
                return None
        if wait == 0.0:
            return self.handle.try_acquire()
        self.handle.wait_timeout = wait
        return self.handle.acquire()

    def step(self) -> None:
        action, wait = self.wait_choice()
        if action == "cancel":  # a thread cannot be cancelled: its timeout mid-wait
            action = "short-wait"
        asked = time.monotonic()
        try:
            guard = self._take(wait)
        except LockTimeout:
            self.emit("timeout", action=action)
            return
        except LockError as e:
            self.emit("acquire-error", what=f"{type(e).__name__}: {e}")
            return
        if guard is None:
            self.emit("busy", action=action)
            return
        self.emit("granted", reentry=False, action=action, joined=self.joins_dropped(guard),
                  asked=asked, **self.describe(guard))
        self.section(guard)
        how = self.leave_choice()
        self.emit("end", how=how, **self.describe(guard))
        if how == "release":
            try:
                guard.release()
            except NotHeld:
                pass
            except LockError as e:
                self.emit("release-error", what=f"{type(e).__name__}: {e}")
            return
        self.dropped(guard)
        if how == "gc":  # only the collector can take it: a cycle holds it
            cycle: list[Any] = [guard]
            cycle.append(cycle)
            del cycle
        del guard
        if how == "gc":
            gc.collect()

    def section(self, guard: Any) -> None:
        until = time.monotonic() + self.section_length()
        seq = wrote = 0
        acked: list[tuple[str, int]] = []  # (key, seq) of each write the server answered
        reentered = False
        # Not stopped by ``guard.lost``: a holder paused past its lease writes on when it wakes,
        # and only the fence (or the library's own knowledge of the loss) stops the write.
        while time.monotonic() < until and not self.stop.is_set():
            try:
                for key, args in self.write_args(guard, seq):
                    guard.execute(*args)
                    wrote += 1
                    if key is not None:
                        acked.append((key, seq))
            except Fenced as e:
                self.emit("fenced", reason=e.reason.value if e.reason else None,
                          **self.describe(guard))
                break
            except NotHeld:
                break
            except LockConnectionError as e:
                self.emit("write-error", what=str(e))
            except LockServerError as e:
                if not str(e).startswith(("TRYAGAIN", "MOVED", "ASK", "LOADING")):
                    self.emit("error", what=f"execute: {e}")
                    break
            seq += 1
            if not reentered and self.spec.kind != "election" and self.rng.random() < 0.1:
                reentered = True
                self.reenter(guard)
            time.sleep(self.rng.uniform(0.02, 0.15))
        self.emit("wrote", n=wrote, acked=acked, **self.describe(guard))

    def reenter(self, guard: Any) -> None:
        asked = time.monotonic()
        try:
            inner = self.handle.try_acquire()
        except LockError as e:
            self.emit("acquire-error", what=f"re-entry: {e}")
            return
        if inner is None:
            return  # lost meanwhile, and the key is someone else's
        if inner._hold is guard._hold:
            self.emit("granted", reentry=True, **self.describe(inner))
        elif guard.lost.is_set():  # lost meanwhile: this acquire took a new hold
            self.emit("granted", reentry=False, action="reenter", asked=asked,
                      **self.describe(inner))
            self.emit("end", how="release", **self.describe(inner))
        else:
            self.emit("error", what="a re-entry of a live hold returned another hold")
        try:
            inner.release()
        except LockError:
            pass


class AsyncHolder(_Base):
    """A holder on the asyncio API (a task of the test process's loop)."""

    def __init__(self, client: Any, spec: Spec, check: Check, record: Record,
                 stop: threading.Event) -> None:
        super().__init__(spec, check, record, stop)
        self.handle = make_handle(client, spec, self.on_lost)

    async def run(self) -> None:
        try:
            while not self.stop.is_set():
                await self.step()
                await asyncio.sleep(self.rng.uniform(0.0, 0.2))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - recorded and asserted on
            self.emit("error", what=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")

    async def _take(self, wait: Optional[float]) -> Any:
        if self.spec.kind == "election":
            try:
                return await self.handle.campaign(timeout=wait)
            except LockTimeout:
                return None
        if wait == 0.0:
            return await self.handle.try_acquire()
        self.handle.wait_timeout = wait
        return await self.handle.acquire()

    async def step(self) -> None:
        action, wait = self.wait_choice()
        asked = time.monotonic()
        try:
            if action == "cancel":  # cancelled mid-wait (or granted first)
                task = asyncio.ensure_future(self._take(None))
                await asyncio.sleep(wait or 0.0)
                if not task.done():
                    task.cancel()
                try:
                    guard = await task
                except asyncio.CancelledError:
                    if self.stop.is_set() and asyncio.current_task().cancelling():  # type: ignore[union-attr]
                        raise
                    self.emit("cancelled")
                    return
            else:
                guard = await self._take(wait)
        except LockTimeout:
            self.emit("timeout", action=action)
            return
        except LockError as e:
            self.emit("acquire-error", what=f"{type(e).__name__}: {e}")
            return
        if guard is None:
            self.emit("busy", action=action)
            return
        self.emit("granted", reentry=False, action=action, joined=self.joins_dropped(guard),
                  asked=asked, **self.describe(guard))
        await self.section(guard)
        how = self.leave_choice()
        self.emit("end", how=how, **self.describe(guard))
        if how == "release":
            try:
                await guard.release()
            except NotHeld:
                pass
            except LockError as e:
                self.emit("release-error", what=f"{type(e).__name__}: {e}")
            return
        self.dropped(guard)
        if how == "gc":
            cycle: list[Any] = [guard]
            cycle.append(cycle)
            del cycle
        del guard
        if how == "gc":
            gc.collect()

    async def section(self, guard: Any) -> None:
        until = time.monotonic() + self.section_length()
        seq = wrote = 0
        acked: list[tuple[str, int]] = []  # (key, seq) of each write the server answered
        reentered = False
        # Not stopped by ``guard.lost``: a holder paused past its lease writes on when it wakes,
        # and only the fence (or the library's own knowledge of the loss) stops the write.
        while time.monotonic() < until and not self.stop.is_set():
            try:
                for key, args in self.write_args(guard, seq):
                    await guard.execute(*args)
                    wrote += 1
                    if key is not None:
                        acked.append((key, seq))
            except Fenced as e:
                self.emit("fenced", reason=e.reason.value if e.reason else None,
                          **self.describe(guard))
                break
            except NotHeld:
                break
            except LockConnectionError as e:
                self.emit("write-error", what=str(e))
            except LockServerError as e:
                if not str(e).startswith(("TRYAGAIN", "MOVED", "ASK", "LOADING")):
                    self.emit("error", what=f"execute: {e}")
                    break
            seq += 1
            if not reentered and self.spec.kind != "election" and self.rng.random() < 0.1:
                reentered = True
                await self.reenter(guard)
            await asyncio.sleep(self.rng.uniform(0.02, 0.15))
        self.emit("wrote", n=wrote, acked=acked, **self.describe(guard))

    async def reenter(self, guard: Any) -> None:
        asked = time.monotonic()
        try:
            inner = await self.handle.try_acquire()
        except LockError as e:
            self.emit("acquire-error", what=f"re-entry: {e}")
            return
        if inner is None:
            return  # lost meanwhile, and the key is someone else's
        if inner._hold is guard._hold:
            self.emit("granted", reentry=True, **self.describe(inner))
        elif guard.lost.is_set():  # lost meanwhile: this acquire took a new hold
            self.emit("granted", reentry=False, action="reenter", asked=asked,
                      **self.describe(inner))
            self.emit("end", how="release", **self.describe(inner))
        else:
            self.emit("error", what="a re-entry of a live hold returned another hold")
        try:
            await inner.release()
        except LockError:
            pass


def redis_check(raw: Any) -> Check:
    """``LOCK.CHECK key owner token`` for each key, on a raw (sync) client of the truth's own."""

    def check(keys: Sequence[str], owner: str, tokens: Sequence[int]) -> list[int]:
        return [int(raw.execute_command("LOCK.CHECK", k, owner, t)) for k, t in zip(keys, tokens)]

    return check
