"""Belief against truth: what the holders recorded (``holders.py``) against what the truth
keeper read (``truth.py``)."""

from __future__ import annotations

import bisect
import collections
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from oracle.truth import Disruption, Snap

#: Causes whose end the library hears at once where the signal is on (a message, or the
#: EPHEMERAL connection's own close, or — after SIGCONT — the watchdog's first look at a
#: deadline long past). ``del`` only where the server has key events.
SIGNALLED = {"forcerelease", "flushdb", "client-kill", "sigstop"}


@dataclass
class Belief:
    hid: str
    ctx: str
    owner: str
    keys: list[str]
    tokens: list[int]
    granted: float
    lease: float
    end: Optional[float] = None
    how: Optional[str] = None
    lost: Optional[float] = None
    reason: Optional[str] = None

    @property
    def believed_until(self) -> float:
        ends = [t for t in (self.end, self.lost) if t is not None]
        return min(ends)


@dataclass
class Context:
    """A worker process (or the test process, ``main``): its SIGSTOP intervals, its kill."""

    name: str
    lost_signal: bool = True
    stopped: list[tuple[float, float]] = field(default_factory=list)
    killed: Optional[float] = None

    def running(self, start: float, end: float) -> float:
        """How much of [start, end] this context was not stopped."""
        if end <= start:
            return 0.0
        total = end - start
        for a, b in self.stopped:
            total -= max(0.0, min(b, end) - max(a, start))
        return total

    def stopped_near(self, start: float, end: float) -> bool:
        return any(a < end and b > start for a, b in self.stopped)


@dataclass
class Report:
    label: str
    seed: int
    holds: int = 0
    reentries: int = 0
    late_losses: int = 0
    writes: int = 0
    fenced: int = 0
    disruptions: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    false_lost: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    false_held: list[dict[str, Any]] = field(default_factory=list)
    over_bound: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    regranted: list[str] = field(default_factory=list)
    regranted_after_drop: list[str] = field(default_factory=list)
    token_fell: list[str] = field(default_factory=list)
    #: The token-order check's reach (``token_pairs``): new grants, those checked against at
    #: least one handed out before they were asked for, and such ordered pairs.
    token_checked: tuple[int, int, int] = (0, 0, 0)
    #: Leaders the election's observer yielded, and those the server never elected (named
    #: only by a forged message).
    observed: int = 0
    unelected: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    acquire_errors: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    signal_median_ms: float = 0.0

    def longest(self) -> dict[str, tuple[int, float]]:
        out: dict[str, tuple[int, float]] = {}
        for case in self.false_held:
            n, worst = out.get(case["cause"], (0, 0.0))
            out[case["cause"]] = (n + 1, max(worst, case["ms"]))
        return out

    def summary(self) -> str:
        lines = [
            f"oracle {self.label} seed {self.seed}: {self.holds} holds ({self.reentries} "
            f"re-entries), {self.writes} fenced writes landed, {self.fenced} refused FENCED",
            "  disruptions: " + ", ".join(f"{k} {v}" for k, v in sorted(self.disruptions.items())),
            "  lost reported: " + ", ".join(f"{k} {v}" for k, v in sorted(self.lost.items())),
            "  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
            f"  false lost: {len(self.false_lost)}; stale writes landed: {len(self.stale)}; "
            f"tokens handed out twice: {len(self.regranted)}; "
            f"tokens not above an earlier grant's: {len(self.token_fell)}; "
            f"errors: {len(self.errors)}; "
            f"losses delivered as the hold was let go: {self.late_losses}; "
            f"joined a dropped guard's hold not yet collected: {len(self.regranted_after_drop)}",
            f"  token order: {self.token_checked[0]} new grants, {self.token_checked[1]} "
            f"checked against {self.token_checked[2]} ordered pairs",
            f"  observer: {self.observed} leaders yielded, {len(self.unelected)} the server "
            f"never elected",
            f"  false held: {len(self.false_held)} cases (signalled: median "
            f"{self.signal_median_ms:.1f} ms); longest per cause (ms): "
            + ", ".join(f"{c} {n}x max {w:.0f}" for c, (n, w) in sorted(self.longest().items())),
        ]
        for case in sorted(self.false_held, key=lambda c: -c["ms"]):
            lines.append(
                f"    {case['ms']:7.1f} ms (bound {case['bound_ms']:.0f}) {case['cause']:<28} "
                f"{case['hid']} {case['key']} token {case['token']} -> {case['reason']}")
        for what, items in [("FALSE LOST", self.false_lost), ("OVER BOUND", self.over_bound),
                            ("STALE WRITE", self.stale), ("REGRANTED", self.regranted),
                            ("TOKEN FELL", self.token_fell), ("UNELECTED", self.unelected),
                            ("ERROR", self.errors), ("unchecked lost", self.unchecked)]:
            for item in items[:20]:
                lines.append(f"  {what}: {item}")
        return "\n".join(lines)


def analyse(
    label: str,
    seed: int,
    events: list[dict[str, Any]],
    snaps: list[Snap],
    disruptions: list[Disruption],
    contexts: dict[str, Context],
    run_end: float,
    key_events: bool,
    signal_bound: float,
    slack: float,
    exclusive_keys: set[str],
    resume_bound: float = 1.5,
    signal_median: float = 0.05,
) -> Report:
    report = Report(label, seed)
    events = sorted(events, key=lambda e: e["t"])
    leases = {e["h"]: e.get("lease", 0.0) for e in events if e["e"] == "spec"}

    # Beliefs: from each grant to the first of its loss, its end, its process's kill, the end.
    beliefs: dict[tuple[str, tuple[int, ...]], list[Belief]] = collections.defaultdict(list)
    dropped_at: dict[tuple[str, tuple[int, ...]], float] = {}
    for e in events:
        # Let go unreleased: dropped, or left in a cycle for the collector ("gc"); either way
        # the library counts the guard until its hold object is let go.
        if e["e"] == "end" and e.get("how") in ("drop", "gc") and e.get("owner") is not None:
            dropped_at.setdefault((e["owner"], tuple(e["tokens"])), e["t"])
    for e in events:
        kind = e["e"]
        report.outcomes[kind] = report.outcomes.get(kind, 0) + 1
        if kind == "granted":
            if e["reentry"]:
                report.reentries += 1
                continue
            ident = (e["owner"], tuple(e["tokens"]))
            if beliefs[ident]:
                case = f"{e['h']} {ident} at {e['t']:.3f}"
                # The same hold again after its guard was dropped: legitimate only when the new
                # guard joined the very hold object the dropped guard had (the collector had not
                # taken the dropped guard yet, so the library still counted it and the acquire
                # was a re-entry; the dropped guard, collected later, only counts down). A
                # token handed out anew to a second hold is a defect.
                dropped = dropped_at.get(ident)
                if e.get("joined") and dropped is not None and dropped <= e["t"]:
                    report.regranted_after_drop.append(case)
                else:
                    report.regranted.append(case)
            beliefs[ident].append(Belief(e["h"], e["ctx"], e["owner"], e["keys"], e["tokens"],
                                         e["t"], leases.get(e["h"], 0.0)))
            report.holds += 1
        elif kind in ("error", "release-error"):
            report.errors.append(f"{e['h']}: {e['what']}")
        elif kind == "acquire-error":
            report.acquire_errors += 1
        elif kind == "fenced":
            report.fenced += 1
    for e in events:
        if e["e"] not in ("lost", "end") or e.get("owner") is None:
            # A loss the library delivers (from its signal thread) as the handle lets its hold
            # go: the handle has no active hold to name by then. It misleads nobody (no guard
            # is left to believe in), so it is counted, not an error.
            if e["e"] == "lost":
                report.late_losses += 1
            continue
        found = beliefs.get((e["owner"], tuple(e["tokens"])))
        if not found:
            report.errors.append(f"{e['h']}: {e['e']} of a hold never granted: {e}")
            continue
        # The belief this end or loss is of: the latest grant of the hold before it. A guard
        # that joined its dropped guard's hold makes a second belief of one (owner, token); the
        # dropped guard's end is the first one's (taking the last made the first believed held
        # to the run's end, and the second ended before it was granted).
        b = next((b for b in reversed(found) if b.granted <= e["t"]), found[0])
        if e["e"] == "end":
            if b.end is None:
                b.end, b.how = e["t"], e["how"]
            continue
        report.lost[e["reason"]] = report.lost.get(e["reason"], 0) + 1
        if b.lost is None:
            b.lost, b.reason = e["t"], e["reason"]
        checks = e.get("check", [])
        if not checks or not all(isinstance(c, int) for c in checks):
            report.unchecked.append(f"{e['h']} {e['owner']} {e['tokens']}: {checks}")
        elif all(c == 1 for c in checks):
            report.false_lost.append(
                f"{e['h']} {e['keys']} owner {e['owner']} tokens {e['tokens']}: reported "
                f"{e['reason']} at {e['t']:.3f}, LOCK.CHECK answered {checks} "
                f"{(e['ct'] - e['t']) * 1000:.1f} ms later")
    all_beliefs = [b for bs in beliefs.values() for b in bs]
    for b in all_beliefs:
        ctx = contexts.get(b.ctx)
        if b.end is None and b.lost is None:
            if ctx is not None and ctx.killed is not None and ctx.killed >= b.granted:
                b.end, b.how = ctx.killed, "killed"
            else:
                b.end, b.how = run_end, "run-end"
        elif ctx is not None and ctx.killed is not None and b.granted <= ctx.killed < b.believed_until:
            b.end, b.how = ctx.killed, "killed"

    # Truth: per key, the reads of it in order; when each hold was seen and when it was gone.
    per_key: dict[str, list[Snap]] = collections.defaultdict(list)
    for s in snaps:
        for k in s.holds:
            per_key[k].append(s)
    gone: dict[tuple[str, str, int], Snap] = {}  # (key, owner, token) -> first read without it
    ended_by: dict[tuple[str, str, int], int] = {}  # -> the disruption that removed it
    landed: set[tuple[str, str, int, int]] = set()
    for key, reads in per_key.items():
        alive: set[tuple[str, int]] = set()
        ended: set[tuple[str, int]] = set()
        top = 0
        for s in reads:
            for w in s.writes.get(key, []):
                owner, token_text, seq_text = w.split("|")
                token = int(token_text)
                landed.add((key, owner, token, int(seq_text)))
                report.writes += 1
                if (owner, token) in ended:
                    report.stale.append(
                        f"{key}: a write of {owner} token {token} landed after the hold ended "
                        f"(read at {s.t0:.3f})")
                if key in exclusive_keys and token < top:
                    report.stale.append(
                        f"{key}: a write of token {token} landed after one of token {top}")
                top = max(top, token)
            now = s.holds[key]
            for h in alive - now:
                gone[(key, *h)] = s
                if s.phase == "after" and s.dis is not None:
                    ended_by[(key, *h)] = s.dis
            ended |= alive - now
            back = ended & now
            if back:
                report.errors.append(f"{key}: holds seen again after they ended: {back}")
            alive = set(now)

    # Every write the server answered landed.
    for e in events:
        if e["e"] != "wrote":
            continue
        for key, seq in e.get("acked", []):
            token = e["tokens"][e["keys"].index(key)]
            if (key, e["owner"], token, seq) not in landed:
                report.stale.append(f"{key}: write {seq} of {e['owner']} token {token} was "
                                    f"answered but never landed")

    # False held: believed held while the server no longer held it.
    dis = {d.idx: d for d in disruptions}
    pubsub_kills = [d for d in disruptions
                    if d.kind == "client-kill" and d.detail.get("conn") == "pubsub"]
    migrations = [d for d in disruptions if d.kind == "migrate"]
    for b in all_beliefs:
        ends = []
        for k, token in zip(b.keys, b.tokens):
            s = gone.get((k, b.owner, token))
            if s is not None:
                d_idx = ended_by.get((k, b.owner, token))
                ends.append((s.t0, k, token, d_idx))
        if not ends:
            continue
        end_est, key, token, d_idx = min(ends)
        until = b.believed_until
        ctx = contexts.get(b.ctx, Context(b.ctx))
        start = max(end_est, b.granted)
        ms = ctx.running(start, until) * 1000
        if ms <= 0:
            continue
        if d_idx is not None:
            cause = dis[d_idx].kind
        elif ctx.stopped_near(end_est - b.lease - 0.5, end_est + 0.01):
            cause = "sigstop"
        elif any(d.kind == "client-kill" and d.detail.get("owner") == b.owner
                 and end_est - 1.0 <= d.t0 <= end_est + 0.05 for d in disruptions):
            cause = "client-kill"
        else:
            cause = "expired"
        heard = cause in SIGNALLED or (cause == "del" and key_events) or cause.startswith("copy")
        notes = []
        if not ctx.lost_signal and cause not in ("client-kill", "sigstop"):
            heard = False
            notes.append("signal-off")
        if any(d.detail.get("ctx") == b.ctx and end_est - 0.1 <= d.t0 <= end_est + 1.0
               for d in pubsub_kills):
            heard = False
            notes.append("lost-message")
        if end_est < b.granted:
            heard = False
            notes.append("before-grant")
        if any(m.t0 - 0.1 <= end_est <= m.t1 + 1.0 for m in migrations):
            heard = False
            notes.append("migration")
        if cause == "del" and not key_events:
            notes.append("no-key-events")
        if cause == "sigstop" and not notes:
            bound = resume_bound  # counted from the resume: the watchdog's first look
        else:
            bound = signal_bound if heard else b.lease / 3 + slack
        label = cause + "".join(f"+{n}" for n in notes)
        case = {"cause": label, "ms": ms, "bound_ms": bound * 1000, "hid": b.hid, "key": key,
                "token": token, "reason": b.reason or b.how}
        report.false_held.append(case)
        if ms > bound * 1000:
            report.over_bound.append(
                f"{b.hid} {key} token {token}: {ms:.0f} ms believed held after the server "
                f"ended it ({label}; bound {bound * 1000:.0f} ms; then {b.reason or b.how})")
    signalled = sorted(c["ms"] for c in report.false_held if c["bound_ms"] == signal_bound * 1000)
    if signalled:
        report.signal_median_ms = signalled[len(signalled) // 2]
        if len(signalled) >= 6 and report.signal_median_ms > signal_median * 1000:
            report.over_bound.append(
                f"the median false held of the {len(signalled)} signalled cases is "
                f"{report.signal_median_ms:.0f} ms (over {signal_median * 1000:.0f} ms)")
    for d in disruptions:
        report.disruptions[d.kind] = report.disruptions.get(d.kind, 0) + 1
        if d.error and d.kind not in ("client-kill",):
            report.errors.append(f"disruption {d.kind}: {d.error}")
    report.token_fell = token_order(events, disruptions)
    report.token_checked = token_pairs(events)
    report.observed, report.unelected = unelected(events, snaps)
    return report


def unelected(events: list[dict[str, Any]], snaps: list[Snap]) -> tuple[int, list[str]]:
    """The leaders observers yielded (``observed`` events), and those the server never elected:
    a (candidate, epoch) neither granted to a holder of that key nor seen held there by the
    truth keeper's reads."""
    elected: set[tuple[str, str, int]] = set()
    for e in events:
        if e["e"] == "granted" and e.get("owner") is not None:
            for key, token in zip(e.get("keys", []), e.get("tokens", [])):
                elected.add((key, e["owner"], token))
    for s in snaps:
        for key, holds in s.holds.items():
            for owner, token in holds:
                elected.add((key, owner, token))
    # A campaign cancelled as it was granted: the server elected the candidate, and the library
    # released that grant without handing it out, so no holder recorded it (make test, seed 1:
    # observed at .458, the campaign cancelled at .464). Its epoch is known to no event; a
    # leader observed within CANCELLED_WINDOW of its candidate's cancelled campaign counts.
    owner_of = {e["h"]: e["owner"] for e in events if e.get("owner") is not None}
    cancelled = [(owner_of.get(e["h"]), e["t"]) for e in events if e["e"] == "cancelled"]

    def just_cancelled(e: dict[str, Any]) -> bool:
        return any(owner == e["candidate"] and abs(t - e["t"]) <= CANCELLED_WINDOW
                   for owner, t in cancelled)

    observed = [e for e in events if e["e"] == "observed"]
    out = [f"{e['h']} followed {e['candidate']} epoch {e['epoch']} on {e['key']} at "
           f"{e['t']:.3f}: never elected" for e in observed
           if (e["key"], e["candidate"], e["epoch"]) not in elected and not just_cancelled(e)]
    return len(observed), out


#: How close to a candidate's cancelled campaign a leader it was observed as counts as that
#: campaign's (released) grant.
CANCELLED_WINDOW = 1.0


# -- Token order -----------------------------------------------------------------------------


@dataclass
class Grant:
    """A new hold of one key as its holder recorded it: asked for at ``asked`` (before its
    request went out), handed out at ``t`` (after the reply came back). The server granted it,
    and chose its token, somewhere in between."""

    key: str
    token: int
    asked: float
    t: float
    hid: str
    ctx: str
    owner: str


def new_grants(events: Iterable[dict[str, Any]]) -> list[Grant]:
    """Every new hold of every key. A re-entry (``reentry``) is not new, nor is a grant of an
    (owner, token) a key was granted before: a guard that joined its own dropped guard's hold
    (``joined``) re-entered that hold, and any other such grant is a token handed out twice,
    which ``Report.regranted`` reports. ``asked``: recorded by the holder; in a history recorded
    without it, the holder's previous event (a holder does one thing at a time, so it asked
    after that)."""
    out: list[Grant] = []
    seen: set[tuple[str, str, int]] = set()
    last_of: dict[str, float] = {}  # holder -> the time of its latest event so far
    for e in sorted(events, key=lambda e: e["t"]):
        before = last_of.get(e.get("h", ""))
        last_of[e.get("h", "")] = e["t"]
        if e["e"] != "granted" or e.get("reentry"):
            continue
        asked = e.get("asked", before)
        for key, token in zip(e["keys"], e["tokens"]):
            ident = (key, e["owner"], token)
            if ident in seen:
                continue
            seen.add(ident)
            out.append(Grant(key, token, asked if asked is not None else float("-inf"), e["t"],
                             e["h"], e["ctx"], e["owner"]))
    return out


def _group_of(key: str) -> str:
    """The hash tag of a cluster key (the oracle's group); ``db0`` for a standalone key."""
    open_at = key.find("{")
    close_at = key.find("}", open_at + 1)
    return key[open_at + 1:close_at] if 0 <= open_at < close_at else "db0"


def node_at(key: str, t: float, disruptions: list[Disruption]) -> Optional[str]:
    """The port of the master that served ``key`` at ``t``, as the migrations recorded it
    (``from->to`` while one ran); None where no migration of its slot says."""
    moves = sorted((d for d in disruptions
                    if d.kind == "migrate" and not d.error
                    and d.detail.get("group") == _group_of(key) and "to" in d.detail),
                   key=lambda d: d.t0)
    for d in moves:
        if d.t0 <= t <= d.t1:
            return f"{d.detail['from']}->{d.detail['to']} (migrating)"
    done = [d for d in moves if d.t1 < t]
    if done:
        return str(done[-1].detail["to"])
    if moves:
        return str(moves[0].detail["from"])
    return None


def _describe(d: Disruption) -> str:
    detail = {k: v for k, v in d.detail.items() if k != "replies"}
    return f"{d.kind} {detail} at {d.t0:.3f}" + (f" (error: {d.error})" if d.error else "")


def token_order(events: Iterable[dict[str, Any]], disruptions: list[Disruption]) -> list[str]:
    """Fencing tokens rise per key: the module gives every new hold — exclusive, shared,
    permit, a leadership — a token above every token it handed out before for that key.

    The rule checked: for two new grants ``g1``, ``g2`` of one key (``new_grants``), when
    ``g1`` was handed out before ``g2`` was asked for (``g1.t < g2.asked``), the server
    granted ``g1`` first, so ``g2.token > g1.token``. Grants whose intervals overlap (shared
    holds or permits granted at once, a reply held up by a paused process) are not ordered,
    and not compared. One line per ``g2`` that fails, naming the highest earlier token."""
    per_key: dict[str, list[Grant]] = collections.defaultdict(list)
    for g in new_grants(events):
        per_key[g.key].append(g)
    out = []
    for key, grants in sorted(per_key.items()):
        grants.sort(key=lambda g: g.t)
        times = [g.t for g in grants]
        top: list[Grant] = []  # top[i]: the highest token among grants[:i + 1]
        for g in grants:
            top.append(g if not top or g.token > top[-1].token else top[-1])
        for g2 in grants:
            n = bisect.bisect_left(times, g2.asked)  # grants handed out before g2 was asked
            if n == 0:
                continue
            g1 = top[n - 1]
            if g2.token > g1.token:
                continue
            between = [_describe(d) for d in sorted(disruptions, key=lambda d: d.t0)
                       if d.t1 >= g1.t and d.t0 <= g2.t]
            where1, where2 = node_at(key, g1.t, disruptions), node_at(key, g2.t, disruptions)
            out.append(
                f"{key}: {g2.hid} ({g2.owner}) got token {g2.token} at {g2.t:.3f} "
                f"(asked {g2.asked:.3f}{f', node {where2}' if where2 else ''}), not above "
                f"token {g1.token} that {g1.hid} ({g1.owner}) got at {g1.t:.3f}"
                f"{f' (node {where1})' if where1 else ''}: {g1.token - g2.token} lower; "
                f"between them: {'; '.join(between) if between else 'no disruption'}")
    return out


def token_pairs(events: Iterable[dict[str, Any]]) -> tuple[int, int, int]:
    """What ``token_order`` compares: the new grants, those with at least one grant of their
    key handed out before they were asked for, and the number of such (earlier, later) pairs
    (each later grant must be above every earlier one)."""
    per_key: dict[str, list[Grant]] = collections.defaultdict(list)
    for g in new_grants(events):
        per_key[g.key].append(g)
    grants_n = checked = pairs = 0
    for grants in per_key.values():
        times = sorted(g.t for g in grants)
        for g in grants:
            n = bisect.bisect_left(times, g.asked)
            grants_n += 1
            checked += n > 0
            pairs += n
    return grants_n, checked, pairs


def load_dump(path: Path) -> tuple[list[dict[str, Any]], list[Disruption]]:
    """The holders' events and the disruptions of a run's dump (``run.py`` ``Oracle._dump``)."""
    events: list[dict[str, Any]] = []
    disruptions: list[Disruption] = []
    with path.open() as f:
        for line in f:
            item = json.loads(line)
            if item["e"] == "disruption":
                disruptions.append(Disruption(len(disruptions), item["kind"], item["t"],
                                              item["t1"], item.get("detail") or {},
                                              item.get("error")))
            elif item["e"] != "read":
                events.append(item)
    return events, disruptions


def recheck_tokens(path: Path) -> list[str]:
    """``token_order`` of a recorded run: ``python -m oracle.analysis <dump.jsonl>...``."""
    return token_order(*load_dump(path))


if __name__ == "__main__":
    import sys

    found = 0
    for arg in sys.argv[1:]:
        for line in recheck_tokens(Path(arg)):
            found += 1
            print(f"{arg}: TOKEN FELL: {line}")
    sys.exit(1 if found else 0)
