"""The checker of a partition run: the clients' histories, the nemesis's faults and the final
log lists read on the settled master, turned into one count per guarantee and kind of lock.
Pure functions of their input: no server, no clock."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass
class Hold:
    """What one client believed: it held ``key`` with ``token`` from its acquire's answer
    until it began the release or the library reported the hold lost, whichever came first."""

    process: str
    key: str
    token: int
    start: float
    end: float


@dataclass
class Counts:
    limit: int = 1  # how many may hold a key at once: 1, or a semaphore's permits
    acquires: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    writes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    landed: int = 0
    out_of_order: int = 0
    refused_landed: int = 0
    tokens_twice: int = 0
    overlapping: int = 0
    overlapping_surviving: int = 0  # ... of which both holds left a write in the final lists
    overlapping_writes: int = 0  # ... of which both made a kept write while both believed
    over_limit: int = 0  # a semaphore's holds begun while its limit of others were believed
    over_limit_surviving: int = 0  # ... counting only holds that left a write in the lists
    lost_writes: int = 0
    fenced: int = 0
    not_sent: int = 0
    lost_reports: int = 0
    lost_write_times: list[float] = field(default_factory=list)
    rate_faults: float = 0.0
    rate_healthy: float = 0.0
    longest_gap: float = 0.0
    longest_gap_at: float = 0.0
    slowest_call: float = 0.0
    slowest_call_op: str = ""
    outages: list[tuple[str, float]] = field(default_factory=list)  # per fault: kind, seconds
    examples: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))

    @property
    def failed(self) -> list[str]:
        """The guarantees this run broke (each must be 0)."""
        broken = []
        if self.out_of_order:
            broken.append("fenced writes landed out of token order")
        if self.refused_landed:
            broken.append("writes answered as refused that landed")
        return broken


def token_of(entry: str) -> int:
    """An entry is ``<process>:<token>:<seq>``."""
    return int(entry.split(":")[1])


def writer_of(entry: str) -> str:
    return entry.split(":")[0]


def count_out_of_order(log: list[str],
                       writers: set[str] | None = None) -> tuple[int, list[str]]:
    """Entries whose token is lower than one written before them in the same list (with
    ``writers``: only the late entries those processes wrote, whoever wrote the higher one)."""
    highest, count, examples = -1, 0, []
    for i, entry in enumerate(log):
        token = token_of(entry)
        if token < highest and (writers is None or writer_of(entry) in writers):
            count += 1
            examples.append(f"#{i} {entry} after token {highest}")
        highest = max(highest, token)
    return count, examples


def holds_of(history: list[dict[str, Any]], run_end: float) -> list[Hold]:
    """Each ok acquire as a hold, ended by the same process's release of that token, or its
    library's loss report for it, whichever came first (a process killed while holding: the
    end of the run)."""
    ends: dict[tuple[str, str, int], float] = {}
    for op in history:
        if op["op"] in ("release", "lost") and op.get("token") is not None:
            k = (op["process"], op["key"], op["token"])
            ends[k] = min(ends.get(k, run_end), op["invoke"])
    holds = []
    for op in history:
        if op["op"] == "acquire" and op["outcome"] == "ok":
            k = (op["process"], op["key"], op["token"])
            holds.append(Hold(op["process"], op["key"], op["token"], op["complete"],
                              max(op["complete"], ends.get(k, run_end))))
    return holds


def overlapping_pairs(holds: list[Hold]) -> list[tuple[Hold, Hold]]:
    """Pairs of holds of one key by two processes whose believed intervals intersect."""
    pairs = []
    by_key: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        by_key[hold.key].append(hold)
    for key_holds in by_key.values():
        key_holds.sort(key=lambda h: h.start)
        for i, a in enumerate(key_holds):
            for b in key_holds[i + 1:]:
                if b.start >= a.end:
                    break
                if b.process != a.process:
                    pairs.append((a, b))
    return pairs


def surviving_holders(logs: dict[str, list[str]]) -> set[tuple[str, str, int]]:
    """(key, process, token) of every hold that left a write in the final lists: a hold whose
    writes a failover discarded, or that wrote nothing, is not among them."""
    return {(key, writer_of(e), token_of(e)) for key, log in logs.items() for e in log}


def describe_pair(pair: tuple[Hold, Hold]) -> str:
    a, b = pair
    return (f"{a.key}: {a.process} token {a.token} [{a.start:.3f}, {a.end:.3f}] and "
            f"{b.process} token {b.token} [{b.start:.3f}, {b.end:.3f}]")


def kept_writes_inside(pair: tuple[Hold, Hold], history: list[dict[str, Any]],
                       landed: set[str]) -> tuple[list[str], list[str]]:
    """Each hold's writes (of ``pair``) sent while both believed they held the key, that are in
    the final lists: two writers the final state kept side by side when both are non-empty."""
    lo, hi = max(pair[0].start, pair[1].start), min(pair[0].end, pair[1].end)

    def kept(h: Hold) -> list[str]:
        return [op["entry"] for op in history if op["op"] == "write" and op["key"] == h.key
                and op["process"] == h.process and op["token"] == h.token
                and op["entry"] in landed and lo <= op["invoke"] <= hi]
    return kept(pair[0]), kept(pair[1])


def both_survived(pair: tuple[Hold, Hold], survivors: set[tuple[str, str, int]]) -> bool:
    return all((h.key, h.process, h.token) in survivors for h in pair)


def over_limit(holds: list[Hold], limit: int) -> list[tuple[Hold, list[Hold]]]:
    """Holds of a key begun while ``limit`` or more holds of it by other processes were
    believed (each with those others): at that real time more than ``limit`` processes believed
    they held one of its ``limit`` permits. The most holders at once is always reached at some
    hold's start, so the starts are the times to look at."""
    found = []
    by_key: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        by_key[hold.key].append(hold)
    for key_holds in by_key.values():
        key_holds.sort(key=lambda h: h.start)
        for i, b in enumerate(key_holds):
            others = [a for a in key_holds[:i] if a.end > b.start and a.process != b.process]
            if len(others) >= limit:
                found.append((b, others))
    return found


def tokens_handed_twice(history: list[dict[str, Any]]) -> list[tuple[str, int, list[str]]]:
    """(key, token) pairs that ok acquires of two or more processes got."""
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    for op in history:
        if op["op"] == "acquire" and op["outcome"] == "ok":
            owners[(op["key"], op["token"])].add(op["process"])
    return [(k, t, sorted(p)) for (k, t), p in owners.items() if len(p) > 1]


def intervals_length(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in intervals)


def in_any(t: float, intervals: list[tuple[float, float]]) -> bool:
    return any(s <= t < e for s, e in intervals)


def check_kind(history: list[dict[str, Any]], logs: dict[str, list[str]],
               faults: list[tuple[str, float, float]], window: tuple[float, float],
               processes: set[str] | None = None, limit: int = 1) -> Counts:
    """Every count for the keys of one kind (``history`` and ``logs`` already narrowed to
    them). ``faults`` are (kind, start, end); ``window`` is when the clients ran.

    With ``processes`` (the clients of one library), the counts are theirs, read against
    everyone's history and lists: their calls, the writes they made (landed, lost, refused yet
    landed, and out of order when theirs is the late entry), their grants, and each pair of
    overlapping holds or token handed twice in which one of them took part (a pair of two
    libraries counts in both).

    With ``limit`` above 1 (a semaphore's permits) there is no token order to keep and no
    pair to count: the holds begun over the limit are counted instead (``over_limit``)."""
    c = Counts(limit=limit)
    everyone = history
    if processes is not None:
        history = [op for op in history if op["process"] in processes]
    for op in history:
        if op["op"] == "acquire":
            c.acquires[op["outcome"]] += 1
        elif op["op"] == "write":
            c.writes[op["outcome"]] += 1
            error = op.get("error") or ""
            c.fenced += error.startswith("Fenced")
            c.not_sent += error.startswith("NotHeld")
        elif op["op"] == "lost":
            c.lost_reports += 1
        # How long a call kept its application waiting: a fault must never hang a client.
        if op["op"] != "lost" and op["complete"] - op["invoke"] > c.slowest_call:
            c.slowest_call = op["complete"] - op["invoke"]
            c.slowest_call_op = f"{op['op']} {op['outcome']}"

    landed: set[str] = set()
    for key, log in logs.items():
        landed.update(log)
        c.landed += sum(1 for e in log if processes is None or writer_of(e) in processes)
        if limit == 1:  # a semaphore's holders write side by side, in no token order
            count, examples = count_out_of_order(log, processes)
            c.out_of_order += count
            c.examples["out_of_order"] += [f"{key} {e}" for e in examples[:5]]

    for op in history:
        if op["op"] != "write":
            continue
        if op["outcome"] == "ok" and op["entry"] not in landed:
            c.lost_writes += 1
            c.lost_write_times.append(op["invoke"])
            c.examples["lost_writes"].append(op["entry"])
        if op["outcome"] == "fail" and op["entry"] in landed:
            c.refused_landed += 1
            c.examples["refused_landed"].append(f"{op['entry']}: {op.get('error')}")

    twice = [(k, t, p) for k, t, p in tokens_handed_twice(everyone)
             if processes is None or processes.intersection(p)]
    c.tokens_twice = len(twice)
    c.examples["tokens_twice"] = [f"{k} {t} {p}" for k, t, p in twice[:5]]

    holds = holds_of(everyone, window[1])
    survivors = surviving_holders(logs)
    if limit == 1:
        pairs = [(a, b) for a, b in overlapping_pairs(holds)
                 if processes is None or a.process in processes or b.process in processes]
        c.overlapping = len(pairs)
        kept = [pair for pair in pairs if both_survived(pair, survivors)]
        c.overlapping_surviving = len(kept)
        inside = [(pair, kept_writes_inside(pair, everyone, landed)) for pair in kept]
        side_by_side = [(pair, w) for pair, w in inside if w[0] and w[1]]
        c.overlapping_writes = len(side_by_side)
        c.examples["overlapping_writes"] = [f"{describe_pair(pair)}: {w[0]} and {w[1]}"
                                            for pair, w in side_by_side[:5]]
        c.examples["overlapping"] = [describe_pair(pair) for pair in pairs[:5]]
        c.examples["overlapping_surviving"] = [describe_pair(pair) for pair in kept[:5]]
    else:
        def counted(found: list[tuple[Hold, list[Hold]]]) -> list[tuple[Hold, list[Hold]]]:
            return [(b, others) for b, others in found if processes is None
                    or processes.intersection(h.process for h in [b, *others])]
        crowded = counted(over_limit(holds, limit))
        kept_crowded = counted(over_limit(
            [h for h in holds if (h.key, h.process, h.token) in survivors], limit))
        c.over_limit, c.over_limit_surviving = len(crowded), len(kept_crowded)
        for name, found in (("over_limit", crowded), ("over_limit_surviving", kept_crowded)):
            c.examples[name] = [
                f"{b.key}: {b.process} token {b.token} from {b.start:.3f} while "
                + ", ".join(f"{a.process} token {a.token} [{a.start:.3f}, {a.end:.3f}]"
                            for a in others) for b, others in found[:5]]

    grants = sorted(op["complete"] for op in history
                    if op["op"] == "acquire" and op["outcome"] == "ok"
                    and window[0] <= op["complete"] <= window[1])
    periods = [(start, end) for _, start, end in faults]
    fault_secs = intervals_length(periods, *window)
    healthy_secs = (window[1] - window[0]) - fault_secs
    during = sum(1 for t in grants if in_any(t, periods))
    c.rate_faults = during / fault_secs if fault_secs > 0 else 0.0
    c.rate_healthy = (len(grants) - during) / healthy_secs if healthy_secs > 0 else 0.0
    # The first seconds are the clients connecting: gaps count from the first grant.
    points = grants + [window[1]]
    for a, b in zip(points, points[1:]):
        if b - a > c.longest_gap:
            c.longest_gap, c.longest_gap_at = b - a, a
    c.outages = unavailability(grants, faults, window)
    return c


def unavailability(grants: list[float], faults: list[tuple[str, float, float]],
                   window: tuple[float, float]) -> list[tuple[str, float]]:
    """For each fault (kind, start, end), its kind and the longest time no grant came (to any
    client, ``grants`` sorted) within its period: from its start to the next fault's start (or
    the window's end), the fault and the healthy pause after it, where a failover it began may
    finish. The periods do not overlap: a stretch that began before a fault counts for it from
    its start, and one that runs into the next fault counts for each its own part."""
    points = (grants or [window[0]]) + [window[1]]
    gaps = list(zip(points, points[1:]))
    ordered = sorted(faults, key=lambda f: f[1])
    outages = []
    for i, (kind, start, _end) in enumerate(ordered):
        until = ordered[i + 1][1] if i + 1 < len(ordered) else window[1]
        longest = max((min(b, until) - max(a, start) for a, b in gaps
                       if b > start and a < until), default=0.0)
        outages.append((kind, longest))
    return outages


def median(values: list[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count); 0 for none."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def unavailability_by_kind(
        outages: list[tuple[str, float]]) -> dict[str, tuple[int, float, float]]:
    """Per kind of fault: how many, and the median and the longest of their unavailability."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    for kind, secs in outages:
        by_kind[kind].append(secs)
    return {kind: (len(v), median(v), max(v)) for kind, v in sorted(by_kind.items())}


def markdown_table(by_kind: dict[str, Counts]) -> str:
    """One column per entry of ``by_kind`` (a kind of lock, or a kind and a library)."""
    kinds = list(by_kind)
    header = "| guarantee | " + " | ".join(kinds) + " | meaning |"
    rule = "|---|" + "---|" * len(kinds) + "---|"

    def row(name: str, values: list[str], meaning: str) -> str:
        return f"| {name} | " + " | ".join(values) + f" | {meaning} |"

    def each(fn: Any) -> list[str]:
        return [fn(by_kind[k]) for k in kinds]

    def exclusive(fn: Any) -> Any:
        """A count only an exclusive kind has: "-" in a semaphore's column."""
        return lambda c: fn(c) if c.limit == 1 else "-"

    semaphores = any(c.limit > 1 for c in by_kind.values())

    rows = [
        header, rule,
        row("acquires ok / fail / info", each(lambda c: f"{c.acquires['ok']:,} / "
            f"{c.acquires['fail']:,} / {c.acquires['info']:,}"), "fail: refused or timed out; "
            "info: no answer"),
        row("fenced writes ok / fail / info", each(lambda c: f"{c.writes['ok']:,} / "
            f"{c.writes['fail']:,} / {c.writes['info']:,}"), "fail: FENCED, NotHeld or refused"),
        row("writes refused FENCED / not sent (hold lost)",
            each(lambda c: f"{c.fenced} / {c.not_sent}"), "the fence at work"),
        row("holds the library reported lost", each(lambda c: str(c.lost_reports)), ""),
        row("writes in the final lists", each(lambda c: f"{c.landed:,}"), ""),
        row("**writes landed out of token order**",
            each(exclusive(lambda c: f"**{c.out_of_order}**")),
            "must be 0 (checked)"),
        row("**writes answered refused that landed**", each(lambda c: f"**{c.refused_landed}**"),
            "must be 0 (checked)"),
        row("tokens handed out twice for a key", each(lambda c: str(c.tokens_twice)),
            "reported"),
        row("believed-overlapping holds (pairs)", each(exclusive(lambda c: str(c.overlapping))),
            "reported: the limit of a lease"),
        row("... of which both holds' writes are in the final lists",
            each(exclusive(lambda c: str(c.overlapping_surviving))),
            "reported: two writers the final state kept"),
        row("... of which both holders' writes from inside the overlap are kept",
            each(exclusive(lambda c: str(c.overlapping_writes))),
            "reported: written side by side"),
        *([row("holds begun over a semaphore's limit: all / writes kept",
               each(lambda c: f"{c.over_limit} / {c.over_limit_surviving}" if c.limit > 1
                    else "-"), "reported: more believed holders than permits")]
          if semaphores else []),
        row("acknowledged writes lost by a failover", each(lambda c: str(c.lost_writes)),
            "reported"),
        row("acquires/s during faults / healthy", each(
            lambda c: f"{c.rate_faults:.1f} / {c.rate_healthy:.1f}"), "availability"),
        row("longest gap with no grant (s)", each(lambda c: f"{c.longest_gap:.1f}"),
            "availability"),
        row("unavailability per fault p50 / max (s)", each(
            lambda c: f"{median([s for _, s in c.outages]):.1f} / "
                      f"{max((s for _, s in c.outages), default=0.0):.1f}"),
            "longest time without a grant in a fault or the pause after it"),
        row("slowest call (s)", each(lambda c: f"{c.slowest_call:.1f} ({c.slowest_call_op})"),
            "acquire waits 1 s at most"),
    ]
    return "\n".join(rows) + "\n"


def by_fault(times: list[float], faults: list[tuple[str, float, float]],
             after: float = 15.0) -> dict[str, int]:
    """How many of ``times`` fell in each kind of fault, or within ``after`` seconds of its
    heal (a failover the fault began may end after it): which fault a loss came with."""
    counts: dict[str, int] = defaultdict(int)
    for t in times:
        kinds = [kind for kind, start, end in faults if start <= t <= end + after]
        counts[kinds[-1] if kinds else "none"] += 1
    return dict(counts)


def matrix_table(runs: list[dict[str, Any]]) -> str:
    """One row per run and kind of lock, from each run's summary.json (run.py ``run_summary``)
    with ``exit`` (its exit status) added; a run that wrote no summary (its set-up failed, or
    it was interrupted) is one row saying so."""
    rows = [
        "| min-replicas | down-after (ms) | lock | believed-overlapping holds (pairs): all / "
        "both writes kept / both kept from inside | "
        "**out of order / refused yet landed** | tokens handed twice | acknowledged writes "
        "lost | unavailability p50 / max (s) | faults (cuts) | failovers | exit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        config = f"| {run['min_replicas']} | {run['down_after']} |"
        if "locks" not in run:
            rows.append(f"{config} - | no summary: the run ended before its check | | | | "
                        f"| | | {run['exit']} |")
            continue
        applied = sum(run["faults_applied"].values())
        for kind, c in run["locks"].items():
            exclusive = c.get("limit", 1) == 1
            overlaps = (f"{c['overlapping']} / {c.get('overlapping_surviving', '-')} / "
                        f"{c.get('overlapping_writes', '-')}" if exclusive else
                        f"over the limit: {c['over_limit']} / {c['over_limit_surviving']}")
            rows.append(
                f"{config} {kind} | {overlaps} | "
                f"**{c['out_of_order'] if exclusive else '-'} / "
                f"{c['refused_landed']}** | {c['tokens_twice']} | {c['lost_writes']} | "
                f"{c['unavailability_p50']:.1f} / {c['unavailability_max']:.1f} | "
                f"{applied} ({run['cuts']}) | {run['failovers']} | {run['exit']} |")
    return "\n".join(rows) + "\n"
