"""One seed of the oracle: holders in the test process (threads on the sync API, tasks on the
asyncio one) and in worker processes, a disruptor ending holds from outside at random moments,
the truth keeper, then the analysis (``analysis.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from oracle.analysis import Context, Report, analyse
from oracle.holders import AsyncHolder, Spec, SyncHolder, redis_check
from oracle.truth import Truth, parse_holds
from redis_lock_client import AsyncLockClient, LockClient, leader_channel, lost_signal_channel

TESTS = Path(__file__).resolve().parents[1]


class Events:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.items.append(event)


class Worker:
    """A worker process (``worker.py``) and the thread that reads its events."""

    def __init__(self, ctx: str, config: dict[str, Any], events: Events) -> None:
        self.ctx = ctx
        env = {**os.environ, "PYTHONPATH": str(TESTS), "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oracle.worker", json.dumps({**config, "ctx": ctx})],
            cwd=TESTS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stopped = False
        self.dead = False
        self.stderr = b""
        self._events = events
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._events(json.loads(line))
            except ValueError:
                self._events({"e": "error", "h": self.ctx, "ctx": self.ctx, "t": time.monotonic(),
                              "what": f"unreadable line {line!r}"})

    def kill(self) -> float:
        os.kill(self.proc.pid, signal.SIGKILL)
        t = time.monotonic()
        self.dead = True
        self.proc.wait()
        self.reader.join(10)
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        return t


class Oracle:
    """One seed on one server (``ports`` one port) or one cluster (its masters' ports)."""

    def __init__(self, label: str, seed: int, secs: float, ports: list[int], cluster: bool,
                 key_events: bool, lease: float = 2.0, signal_bound: float = 0.5,
                 slack: float = 1.5, dump: Optional[Path] = None) -> None:
        self.label = label
        self.seed = seed
        self.secs = secs
        self.ports = ports
        self.cluster = cluster
        self.key_events = key_events
        self.lease = lease
        self.signal_bound = signal_bound
        self.slack = slack
        self.dump = dump
        self.rng = random.Random(seed)
        self.events = Events()
        self.contexts: dict[str, Context] = {"main": Context("main"), "aio": Context("aio")}
        self.workers: list[Worker] = []
        self.next_worker = 1
        self.stop = threading.Event()
        run = f"{seed}-{self.rng.randrange(1 << 30):x}"
        if cluster:
            # Two hash tags: A and B (and the multi-key holds of both) in one slot, S and E in
            # another, each moved between masters by the migrations.
            t1, t2 = f"o{run}a", f"o{run}b"
            self.a, self.b = f"{{{t1}}}:A", f"{{{t1}}}:B"
            self.s, self.e = f"{{{t2}}}:S", f"{{{t2}}}:E"
            self.groups = {t1: [self.a, self.b], t2: [self.s, self.e]}
        else:
            self.a, self.b = f"oracle:{run}:A", f"oracle:{run}:B"
            self.s, self.e = f"oracle:{run}:S", f"oracle:{run}:E"
            self.groups = {"db0": [self.a, self.b, self.s, self.e]}
        self.targets: list[tuple[str, list[str], int]] = [
            ("lock", [self.a], 0), ("lock", [self.b], 0), ("read", [self.a], 0),
            ("sem", [self.s], 2), ("multi", [self.a, self.b], 0), ("election", [self.e], 0),
        ]
        self.nodes = {p: redis.Redis(host="127.0.0.1", port=p, protocol=2,
                                     client_name="oracle-truth") for p in ports}
        where = {g: self._port_of(keys[0]) for g, keys in self.groups.items()}
        self.truth = Truth(self.nodes, self.groups, where, {self.s: 2})
        self._hid = 0
        self.observer: Any = None

    # -- set up ----------------------------------------------------------------------------

    def _port_of(self, key: str) -> int:
        if not self.cluster:
            return self.ports[0]
        slot = key_slot(key.encode())
        for p, conn in self.nodes.items():
            for lo, hi, *_ in conn.execute_command("CLUSTER", "SLOTS"):
                if lo <= slot <= hi:
                    port: int = _[0][1]
                    return port
        raise RuntimeError(f"no node serves {key}")

    def _specs(self, ctx: str, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            kind, keys, limit = self.rng.choice(self.targets)
            self._hid += 1
            ephemeral = kind == "election" or self.rng.random() < 0.3
            if kind == "election":
                ephemeral = self.rng.random() < 0.7
            out.append({"hid": f"{ctx}.{self._hid}", "ctx": ctx, "kind": kind, "keys": keys,
                        "limit": limit, "ephemeral": ephemeral, "lease": self.lease,
                        "seed": self.rng.randrange(1 << 30)})
        return out

    def _all_targets_first(self) -> list[dict[str, Any]]:
        """Every kind of target at least once among the test process's six holders."""
        specs = self._specs("main", 3) + self._specs("aio", 3)
        for spec, (kind, keys, limit) in zip(specs, self.targets):
            spec.update(kind=kind, keys=keys, limit=limit,
                        ephemeral=spec["ephemeral"] if kind != "election" else True)
        return specs

    def _worker_config(self) -> dict[str, Any]:
        if self.cluster:
            return {"cluster": self.ports}
        return {"url": f"redis://127.0.0.1:{self.ports[0]}/"}

    def _start_worker(self) -> None:
        ctx = f"p{self.next_worker}"
        self.next_worker += 1
        lost_signal = self.rng.random() >= 0.25
        self.contexts[ctx] = Context(ctx, lost_signal=lost_signal)
        config = {**self._worker_config(), "lost_signal": lost_signal,
                  "specs": self._specs(ctx, 2)}
        self.workers.append(Worker(ctx, config, self.events))

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> Report:
        self.truth.start()
        main_specs = self._all_targets_first()
        if self.cluster:
            client: Any = LockClient(redis.cluster.RedisCluster(
                host="127.0.0.1", port=self.ports[0], client_name="oracle-main"))
            raw: Any = redis.cluster.RedisCluster(host="127.0.0.1", port=self.ports[0],
                                                  client_name="oracle-check")
        else:
            url = f"redis://127.0.0.1:{self.ports[0]}/"
            client = LockClient.from_url(url, client_name="oracle-main")
            raw = redis.Redis.from_url(url, client_name="oracle-check")
        check = redis_check(raw)
        threads = [threading.Thread(target=SyncHolder(client, Spec(**s), check, self.events,
                                                      self.stop).run, daemon=True,
                                    name=s["hid"])
                   for s in main_specs[:3]]
        loop = asyncio.new_event_loop()
        loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
        loop_thread.start()
        aio = asyncio.run_coroutine_threadsafe(self._run_async(main_specs[3:], check), loop)
        for t in threads:
            t.start()
        for _ in range(2):
            self._start_worker()
        self.observer = client.election(self.e).observe()
        threading.Thread(target=self._observe, args=(self.observer,), daemon=True).start()
        started = time.monotonic()
        try:
            self._disrupt(started + self.secs)
        finally:
            self.stop.set()
            self._finish(threads, aio, loop, loop_thread, client)
        run_end = time.monotonic()
        time.sleep(0.1)
        self.truth.close()
        raw.close()
        report = analyse(self.label, self.seed, self.events.items, self.truth.snaps,
                         self.truth.disruptions, self.contexts, run_end, self.key_events,
                         self.signal_bound, self.slack, {self.a, self.b, self.e})
        report.errors += [f"truth: {e}" for e in self.truth.errors]
        report.stale += self.truth.violations
        for w in self.workers:
            text = w.stderr.decode(errors="replace").strip()
            if text:
                report.errors.append(f"worker {w.ctx} stderr: {text[-2000:]}")
        if self.dump is not None:
            self._dump(self.dump)
        return report

    def _dump(self, path: Path) -> None:
        """Everything recorded, one JSON line each (events, disruptions, reads with a change),
        for a look after a failure."""
        with path.open("w") as f:
            for e in sorted(self.events.items, key=lambda e: e["t"]):
                f.write(json.dumps(e) + "\n")
            for d in self.truth.disruptions:
                f.write(json.dumps({"e": "disruption", "t": d.t0, "t1": d.t1, "kind": d.kind,
                                    "detail": d.detail, "error": d.error}, default=str) + "\n")
            last: dict[str, Any] = {}
            for s in self.truth.snaps:
                for k, holds in s.holds.items():
                    if last.get(k) != holds or s.writes.get(k) or s.phase != "plain":
                        last[k] = holds
                        f.write(json.dumps({"e": "read", "t": s.t0, "t1": s.t1, "key": k,
                                            "phase": s.phase, "holds": sorted(holds),
                                            "writes": len(s.writes.get(k, []))}) + "\n")

    def _observe(self, observer: Any) -> None:
        """Records every leader the election key's observer yields (the analysis checks each
        against the leaders the server elected: never one only a forged message named)."""
        try:
            for leader in observer:
                self.events({"e": "observed", "h": "observer", "ctx": "main",
                             "t": time.monotonic(), "key": self.e,
                             "candidate": leader.candidate.decode(errors="replace"),
                             "epoch": leader.epoch})
        except Exception as e:  # noqa: BLE001 - recorded, asserted on
            self.events({"e": "error", "h": "observer", "ctx": "main", "t": time.monotonic(),
                         "what": f"the observer: {type(e).__name__}: {e}"})

    async def _run_async(self, specs: list[dict[str, Any]], check: Any) -> None:
        if self.cluster:
            rc = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=self.ports[0],
                                                    client_name="oracle-aio")
            client = AsyncLockClient(rc)
        else:
            client = AsyncLockClient.from_url(f"redis://127.0.0.1:{self.ports[0]}/",
                                              client_name="oracle-aio")
        holders = [AsyncHolder(client, Spec(**s), check, self.events, self.stop) for s in specs]
        tasks = [asyncio.ensure_future(h.run()) for h in holders]
        while not self.stop.is_set():
            await asyncio.sleep(0.05)
        done, pending = await asyncio.wait(tasks, timeout=3 * self.lease)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await client.aclose()

    def _finish(self, threads: list[threading.Thread], aio: Any, loop: Any,
                loop_thread: threading.Thread, client: Any) -> None:
        for w in self.workers:
            if not w.dead:
                self.contexts[w.ctx].killed = w.kill()
                self._cont(w)
        for t in threads:
            t.join(4 * self.lease + 5)
            if t.is_alive():
                frame = sys._current_frames().get(t.ident or 0)
                stack = "".join(traceback.format_stack(frame)) if frame else "(no frame)\n"
                stack += self._ticket_state(frame)
                self.events({"e": "error", "h": "main", "ctx": "main", "t": time.monotonic(),
                             "what": f"a holder thread ({t.name}) did not finish; it is at:\n"
                                     f"{stack}"})
        try:
            aio.result(4 * self.lease + 10)
        except Exception as e:  # noqa: BLE001
            self.events({"e": "error", "h": "aio", "ctx": "aio", "t": time.monotonic(),
                         "what": f"the asyncio holders: {type(e).__name__}: {e}"})
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
        if self.observer is not None:
            self.observer.close()
        client.close()

    def _ticket_state(self, frame: Any) -> str:
        """For a thread stuck waiting on a ticket: the ticket, its group's state in the desk,
        and what every node has of its slot (keys, the slot's state, the lock's waiters)."""
        ticket = None
        while frame is not None and ticket is None:
            ticket = frame.f_locals.get("ticket")
            frame = frame.f_back
        if ticket is None or not hasattr(ticket, "name"):
            return ""
        group = ticket.group
        waiting = group.waiting
        out = [f"ticket {ticket.name!r}: answer {ticket.answer!r} lost {ticket.lost} "
               f"abandoned {ticket.abandoned}; group slot {group.slot} round {group.round} "
               f"read {group.read} blocked {group.blocked} away {group.away} "
               f"waiting home={getattr(waiting, 'home', None)} "
               f"tickets {list(group.tickets)}"]
        slot = key_slot(ticket.name)
        for port, conn in self.nodes.items():
            try:
                keys = conn.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                mine = [ln for ln in conn.execute_command("CLUSTER", "NODES").decode().splitlines()
                        if "myself" in ln]
                out.append(f"  node {port}: keys {keys} myself {mine}")
            except redis.RedisError as e:
                out.append(f"  node {port}: {e}")
        frames = sys._current_frames()
        for t in threading.enumerate():
            if t.name.startswith("redis-lock") and t.ident in frames:
                out.append(f"  thread {t.name}:\n" + "".join(traceback.format_stack(frames[t.ident])[-6:]))
        return "\n".join(out) + "\n"

    def _cont(self, w: Worker) -> None:
        ctx = self.contexts[w.ctx]
        if w.stopped:
            w.stopped = False
            t = time.monotonic()
            try:
                os.kill(w.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            a, _ = ctx.stopped[-1]
            ctx.stopped[-1] = (a, t)

    def _live(self) -> list[Worker]:
        return [w for w in self.workers if not w.dead and not w.stopped]

    def _disrupt(self, until: float) -> None:
        kinds = {"sigkill": 1.0, "sigstop": 1.5, "client-kill": 1.5, "forcerelease": 1.5,
                 "del": 1.5, "copy-same": 1.0, "flushdb": 0.6, "forge": 1.5}
        if self.cluster:
            kinds["migrate"] = 2.0
        else:
            kinds["copy-db"] = 1.0
        pending: list[tuple[float, str, Any]] = []  # (when, what, action): SIGCONT, restart
        next_at = time.monotonic() + self.rng.uniform(0.3, 0.8)
        while True:
            now = time.monotonic()
            for when, _, action in sorted(pending, key=lambda p: p[0]):
                if when <= now:
                    action()
            pending = [p for p in pending if p[0] > now]
            if now >= until:
                for _, what, action in pending:
                    if what == "cont":
                        action()
                return
            if now < next_at:
                time.sleep(min(0.02, next_at - now))
                continue
            next_at = now + self.rng.uniform(0.25, 0.8)
            kind = self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
            self._one(kind, pending)

    def _one(self, kind: str, pending: list[tuple[float, str, Any]]) -> None:
        rng = self.rng
        key = rng.choice([self.a, self.b, self.s, self.e])
        group = self._group(key)
        if kind in ("sigkill", "sigstop"):
            live = self._live()
            if not live:
                return
            holding = [w for w in live if self._holding(w.ctx)]
            w = rng.choice(holding or live)  # one that holds something, if one does
            ctx = self.contexts[w.ctx]
            if kind == "sigkill":
                t = w.kill()
                ctx.killed = t
                self.truth.disruptions.append(self._mark("sigkill", t, ctx=w.ctx))
                pending.append((time.monotonic() + rng.uniform(0.1, 0.5), "restart",
                                self._start_worker))
            else:
                os.kill(w.proc.pid, signal.SIGSTOP)
                t = time.monotonic()
                w.stopped = True
                ctx.stopped.append((t, float("inf")))
                self.truth.disruptions.append(self._mark("sigstop", t, ctx=w.ctx))
                pending.append((t + self.lease + rng.uniform(0.3, 0.9), "cont",
                                lambda: self._cont(w)))
        elif kind == "client-kill":
            port = rng.choice(self.ports)
            self.truth.submit("client-kill", group, call=lambda truth: self._client_kill(port))
        elif kind == "forcerelease":
            self.truth.submit(kind, group, [["LOCK.FORCERELEASE", key]], key=key)
        elif kind == "del":
            self.truth.submit(kind, group, [["DEL", key]], key=key)
        elif kind == "copy-same":
            copy = key + ":copy" if self.cluster else "{" + key + "}"
            self.truth.submit("copy-same", group, [["COPY", key, copy, "REPLACE"]], key=key)
            time.sleep(rng.uniform(0.05, 0.4))
            self.truth.submit("copy-same-del", group, [["DEL", copy]], key=copy)
        elif kind == "copy-db":
            # SELECT 0 after: Valkey 8.1 leaves the connection on database 1 (docs/guarantees.md).
            self.truth.submit("copy-db", group,
                              [["COPY", key, key, "DB", 1, "REPLACE"], ["SELECT", 0]], key=key)
            time.sleep(rng.uniform(0.05, 0.4))
            self.truth.submit("copy-db-del", group,
                              [["SELECT", 1], ["DEL", key], ["SELECT", 0]], key=key)
        elif kind == "flushdb":
            # In a cluster FLUSHDB empties every slot of the node: only a node that serves
            # this group alone, so that the reads around it see everything it removed.
            port = self.truth.where[group]
            if list(self.truth.where.values()).count(port) == 1:
                self.truth.submit(kind, group, [["FLUSHDB"]])
        elif kind == "migrate":
            self.truth.submit(kind, group, call=lambda truth: self._migrate(group))
        elif kind == "forge":
            self.truth.submit(kind, group, call=lambda truth: self._forge(key))

    def _holding(self, ctx: str) -> bool:
        """Whether a holder of ``ctx`` believes it holds something now (from its events)."""
        last: dict[str, str] = {}
        with self.events._lock:
            for e in self.events.items:
                if e.get("ctx") == ctx and e["e"] in ("granted", "end", "lost"):
                    if e["e"] != "granted" or not e.get("reentry"):
                        last[e["h"]] = e["e"]
        return "granted" in last.values()

    def _mark(self, kind: str, t: float, **detail: Any) -> Any:
        from oracle.truth import Disruption

        return Disruption(len(self.truth.disruptions), kind, t, t, detail)

    def _group(self, key: str) -> str:
        return next(g for g, keys in self.groups.items() if key in keys)

    def _client_kill(self, port: int) -> dict[str, Any]:
        """CLIENT KILL of one of the library's connections, at random: a pooled one, a wait's or
        an EPHEMERAL hold's (named ``oracle-<ctx>:<owner>``) or a signal listener."""
        conn = self.nodes[port]
        found = []
        for line in conn.execute_command("CLIENT", "LIST").decode().splitlines():
            entry = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
            name = entry.get("name", "")
            if not name.startswith("oracle-") or name.startswith(("oracle-truth", "oracle-check")):
                continue
            found.append(entry)
        if not found:
            return {"conn": "none"}
        entry = self.rng.choice(found)
        name = entry["name"]
        ctx, _, owner = name[len("oracle-"):].partition(":")
        subscribed = any(int(entry.get(f, "0") or 0) > 0 for f in ("sub", "psub", "ssub"))
        kind = "pubsub" if subscribed else "bound" if owner else "pool"
        conn.execute_command("CLIENT", "KILL", "ID", entry["id"])
        return {"conn": kind, "ctx": ctx, "owner": owner or None, "cmd": entry.get("cmd")}

    def _forge(self, key: str) -> dict[str, Any]:
        """Messages nobody may believe, as anyone allowed to publish on the channels can send
        them: a lost message naming each live hold of ``key`` exactly (database, key, owner and
        token, as LOCK.INFO shows them), and sometimes the whole key; leader messages of the
        election key naming a candidate the server never elected, with a huge epoch or the
        next one. The holds are alive: a loss reported for one is a false lost, and a leader
        the observer yields that the server never elected is counted (``unelected``)."""
        publish = "SPUBLISH" if self.cluster else "PUBLISH"
        conn = self.nodes[self.truth.where[self._group(key)]]
        holds, _ = parse_holds(conn.execute_command("LOCK.INFO", key))
        reason = self.rng.choice([b"forcereleased", b"disconnected", b"expired", b"deleted",
                                  b"overwritten", b"evicted"])
        k = key.encode()
        for owner, token in holds:
            conn.execute_command(publish, lost_signal_channel(key), b"%s 0 %d %d %s %s" % (
                reason, token, len(k), k, owner.encode()))
        whole = self.rng.random() < 0.3
        if whole:
            conn.execute_command(publish, lost_signal_channel(key),
                                 b"%s 0 * %d %s" % (reason, len(k), k))
        e = self.e.encode()
        econn = self.nodes[self.truth.where[self._group(self.e)]]
        leader = parse_holds(econn.execute_command("LOCK.INFO", self.e))[0]
        epoch = self.rng.choice([9_000_000_000_000_000_000,
                                 max((t for _, t in leader), default=1) + 1])
        econn.execute_command(publish, leader_channel(self.e),
                              b"elected 0 %d %d %s forged-node" % (epoch, len(e), e))
        econn.execute_command(publish, leader_channel(self.e),
                              b"proclaimed 0 %d %d %s 6.6.6.6:66" % (epoch, len(e), e))
        return {"key": key, "holds": len(holds), "whole": whole,
                "reason": reason.decode(), "epoch": epoch}

    def _migrate(self, group: str) -> dict[str, Any]:
        """The group's slot moves to another master, as a reshard moves it, in two batches of
        keys with a pause between (commands caught between them are answered ASK or TRYAGAIN)."""
        truth = self.truth
        _wait_for_agreed_epochs(list(self.nodes.values()))
        slot = key_slot(group.encode())
        src_port = truth.where[group]
        dst_port = self.rng.choice([p for p in self.ports if p != src_port])
        src, dst = self.nodes[src_port], self.nodes[dst_port]
        src_id = src.execute_command("CLUSTER", "MYID").decode()
        dst_id = dst.execute_command("CLUSTER", "MYID").decode()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0

        def migrate(keys: list[bytes]) -> None:
            # No REPLACE, as a reshard: a key the target made of its own in the slot while it
            # was importing (BUSYKEY) is a failure, named with what it is on both nodes.
            try:
                src.execute_command("MIGRATE", "127.0.0.1", dst_port, "", 0, 5000, "KEYS", *keys)
            except redis.ResponseError as e:
                if "BUSYKEY" not in str(e):
                    raise
                try:
                    busy = _busy_keys(src, dst, slot, keys)
                except Exception as look:  # noqa: BLE001 - the BUSYKEY is the finding
                    busy = f"(could not look at the keys: {look!r})"
                raise RuntimeError(f"{e} moving slot {slot} ({group}) {src_port}->{dst_port}: "
                                   f"{busy}") from e

        def drain() -> None:
            # Until the source has no key of the slot left (keys may arrive meanwhile).
            nonlocal moved
            for _ in range(20):
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
                if not keys:
                    return
                migrate(keys)
                moved += len(keys)
                if closing:
                    late.extend(k.decode(errors="replace") for k in keys)
            raise RuntimeError(f"slot {slot} ({group}) {src_port}->{dst_port}: the source "
                               "still had keys after 20 rounds")

        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        first = keys[: len(keys) // 2]
        if first:
            migrate(first)
            moved += len(first)
            time.sleep(self.rng.uniform(0.01, 0.05))
        closing = False
        late: list[str] = []
        drain()
        closing = True
        # As `redis-cli --cluster reshard` then `--cluster fix` close a slot: the target first,
        # then the source, whose refusal while a key arrived after the last round ("still hold
        # keys") is answered by moving that key too; then the other masters.
        dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for attempt in range(5):
            try:
                src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
                break
            except redis.ResponseError as e:
                if "still hold keys" not in str(e) or attempt == 4:
                    raise
                drain()
        for p in self.ports:
            if p not in (src_port, dst_port):
                self.nodes[p].execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        # The new owner's config epoch the highest: gossip sent before the move cannot take
        # the slot back (moves here come faster than a reshard's).
        dst.execute_command("CLUSTER", "BUMPEPOCH")
        truth.where[group] = dst_port
        return {"group": group, "from": src_port, "to": dst_port, "keys": moved,
                **({"late": late} if late else {})}


def _wait_for_agreed_epochs(nodes: list[Any]) -> None:
    """Until every node knows the same config epoch for each master and no two masters share
    one (conftest's Cluster.epochs_agreed): only then does the target's bump at the end of a
    move give it an epoch no other master has, so gossip from before the move cannot take the
    slot back. Raises after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        views = []
        for conn in nodes:
            lines = conn.execute_command("CLUSTER", "NODES").decode().splitlines()
            views.append({f[0]: int(f[6]) for f in (line.split() for line in lines)
                          if "master" in f[2].split(",")})
        if all(v == views[0] for v in views) and len(set(views[0].values())) == len(views[0]):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the nodes do not agree on the config epochs: {views}")
        time.sleep(0.01)


def _show(conn: Any, key: bytes, asking: bool) -> str:
    """A key's type, TTL and value (a lock key's ``LOCK.INFO``) on ``conn``; ``asking`` for
    the importing node."""
    pipe = conn.pipeline(transaction=False)
    for cmd in (["TYPE", key], ["PTTL", key]):
        if asking:
            pipe.execute_command("ASKING")
        pipe.execute_command(*cmd)
    replies = pipe.execute(raise_on_error=False)[1::2] if asking else \
        pipe.execute(raise_on_error=False)
    kind = replies[0].decode() if isinstance(replies[0], bytes) else repr(replies[0])
    reads: dict[str, list[Any]] = {
        "string": ["GET", key], "hash": ["HGETALL", key], "list": ["LRANGE", key, 0, 9],
        "set": ["SMEMBERS", key], "zset": ["ZRANGE", key, 0, 9, "WITHSCORES"]}
    read = reads.get(kind)
    if read is None and kind not in ("none", "stream"):
        read = ["LOCK.INFO", key]  # the module's lock type
    value: Any = "-"
    if read is not None:
        pipe = conn.pipeline(transaction=False)
        if asking:
            pipe.execute_command("ASKING")
        pipe.execute_command(*read)
        value = pipe.execute(raise_on_error=False)[-1]
    return f"type {kind}, pttl {replies[1]!r}, value {value!r}"


def _busy_keys(src: Any, dst: Any, slot: int, keys: list[bytes]) -> str:
    """Which of ``keys`` the target already has in ``slot`` (the cause of a BUSYKEY), each
    with what it is on both nodes."""
    there = set(dst.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000))
    busy = [k for k in keys if k in there]
    if not busy:
        return f"no key of {keys!r} found on the target (it has {sorted(there)!r})"
    return "; ".join(f"{k.decode(errors='replace')}: source {_show(src, k, False)}, "
                     f"target {_show(dst, k, True)}" for k in busy)


def run_seed(label: str, seed: int, secs: float, ports: list[int], cluster: bool,
             key_events: bool, **options: Any) -> Report:
    return Oracle(label, seed, secs, ports, cluster, key_events, **options).run()


def parse_seeds(text: Optional[str], default: int, base: int = 1) -> list[int]:
    """``SEEDS``: a count (seeds ``base``, ``base + 1``, ...) or a comma-separated list."""
    if not text:
        return list(range(base, base + default))
    if "," in text or text.startswith("="):
        return [int(s) for s in text.strip("=").split(",") if s]
    return list(range(base, base + int(text)))
