"""The oracle (tests/oracle/): a seeded, randomized end-to-end test of the library's belief
against the server's truth, on this server (LOCK_SERVER: Redis 7.0.15 by default, or one with
key events) and on a cluster of three masters with slot migrations.

A short run here (make test: ORACLE_SEEDS=2 seeds of ORACLE_SECS=8 s, and one cluster seed);
`make oracle-python SEEDS=10 SECS=60` runs longer on Redis 7.0.15 and Redis 8.2.3.
ORACLE_SEEDS is a count (seeds 1, 2, ...; ORACLE_SEED_BASE moves the first) or a list
(`ORACLE_SEEDS=17,42`). Each run prints its summary and every false-held case.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from conftest import reports_key_events, start_cluster, start_server
from oracle.analysis import Context, analyse, recheck_tokens, token_order, token_pairs
from oracle.run import parse_seeds, run_seed
from oracle.truth import Disruption, Snap

SECS = float(os.environ.get("ORACLE_SECS", "8"))
BASE = int(os.environ.get("ORACLE_SEED_BASE", "1"))
SEEDS = parse_seeds(os.environ.get("ORACLE_SEEDS"), 2, BASE)
CLUSTER_SEEDS = parse_seeds(os.environ.get("ORACLE_CLUSTER_SEEDS"), 1, BASE)
#: The false-held bounds: where the signal is on (a few hundred ms on a loaded machine; and
#: the median of those cases at most 50 ms), after a SIGSTOPped holder resumes 1.5 s, and
#: otherwise the watchdog's period (lease / 3) plus this slack. The signalled and resume bounds
#: are hang catchers, at least 5x the longest case measured on the debug build here (two busy
#: cores): signalled 21.6 ms (of 78), from a resume 5.2 ms. The watchdog's is the library's
#: promise (a guard learns of a loss at its next renewal), the same as the Rust oracle's: its
#: period plus 3 s, twice the longest case measured (1,517 ms of 86: an expiry before the
#: grant's reply reached the library, across a migration; the next 288 ms). Looser, it would
#: miss a false held of several leases.
SIGNAL_BOUND = float(os.environ.get("ORACLE_SIGNAL_BOUND", "0.5"))
SLACK = float(os.environ.get("ORACLE_SLACK", "3.0"))


def _check(report, capsys, dump) -> None:
    with capsys.disabled():
        print("\n" + report.summary() + f"\n  (everything recorded: {dump})")
    assert report.holds > 0 and report.writes > 0
    assert report.false_lost == [], "a guard reported lost while the server held its hold"
    assert report.stale == [], "a write of a superseded hold landed"
    assert report.regranted == [], "a token was handed out twice"
    assert report.token_fell == [], "a key's token fell:\n" + "\n".join(report.token_fell)
    assert report.observed > 0 and report.unelected == [], \
        "an observer followed a leader the server never elected:\n" + "\n".join(report.unelected)
    # Whole: an exception that escaped a holder comes with its traceback.
    assert report.errors == [], "\n\n".join(report.errors)
    assert report.unchecked == [], "\n".join(map(str, report.unchecked))
    assert report.over_bound == [], "a guard believed held past its bound:\n" + "\n".join(
        report.over_bound)


@pytest.mark.scenario("oracle")
@pytest.mark.parametrize("seed", SEEDS)
def test_oracle_standalone(tmp_path, capsys, seed):
    server = start_server(tmp_path)
    try:
        events = reports_key_events(server)
        label = "standalone, " + ("key events" if events else "no key events")
        report = run_seed(label, seed, SECS, [server.port], cluster=False, key_events=events,
                          signal_bound=SIGNAL_BOUND, slack=SLACK,
                          dump=tmp_path / "oracle.jsonl")
    finally:
        server.proc.kill()
        server.proc.wait()
    _check(report, capsys, tmp_path / "oracle.jsonl")


@pytest.mark.scenario("oracle")
@pytest.mark.parametrize("seed", CLUSTER_SEEDS)
def test_oracle_cluster(tmp_path, capsys, seed):
    cluster = start_cluster(tmp_path)
    try:
        events = reports_key_events(cluster.nodes[0])
        label = "cluster, " + ("key events" if events else "no key events")
        report = run_seed(label, seed, SECS, cluster.ports, cluster=True, key_events=events,
                          signal_bound=SIGNAL_BOUND, slack=SLACK,
                          dump=tmp_path / "oracle.jsonl")
    finally:
        for n in cluster.nodes:
            n.proc.kill()
            n.proc.wait()
    _check(report, capsys, tmp_path / "oracle.jsonl")


# -- The token-order check itself, on histories that break it and histories that do not.

#: A history the Python oracle recorded on a cluster (seed 1) before the module refused grants
#: on a node the slot's counter had not reached: two exclusive grants on one key fell by the
#: counter's reservation window during a migration. In ../shared beside the repository.
RECORDED = (Path(__file__).resolve().parents[3].parent / "shared" / "repros" / "review-4"
            / "oracle-cluster-token-regression.jsonl")


def test_token_order_flags_the_recorded_regression():
    if not RECORDED.exists():
        pytest.skip(f"{RECORDED} is not here")
    found = recheck_tokens(RECORDED)
    assert len(found) == 1, found
    line = found[0]
    for part in ("{o1-1132d8faa}:A", "p10.26", "token 1795881753979007 at 5783.473",
                 "token 1795881813979014 that main.1", "60000007 lower",
                 "node 22023->21745 (migrating)", "migrate {'group': 'o1-1132d8faa', "
                 "'from': 22023, 'to': 21745"):
        assert part in line, line


def _grant(h: str, t: float, asked: float, tokens: list[int], keys: list[str] | None = None,
           owner: str | None = None, **more: Any) -> dict[str, Any]:
    return {"e": "granted", "h": h, "ctx": h.split(".")[0], "t": t, "asked": asked,
            "reentry": False, "joined": False, "owner": owner or f"{h}:1",
            "keys": keys or ["K"], "tokens": tokens, **more}


@pytest.mark.parametrize("name, events, flagged", [
    ("a later exclusive grant with a lower token",
     [_grant("a.1", 1.0, 0.9, [200]), _grant("b.2", 2.0, 1.5, [100])], ["b.2"]),
    ("with an equal token, by another owner",
     [_grant("a.1", 1.0, 0.9, [200]), _grant("b.2", 2.0, 1.5, [200])], ["b.2"]),
    ("rising tokens",
     [_grant("a.1", 1.0, 0.9, [100]), _grant("b.2", 2.0, 1.5, [200])], []),
    ("a re-entry repeats its hold's token",
     [_grant("a.1", 1.0, 0.9, [200]), _grant("a.1", 1.5, 1.4, [200], reentry=True)], []),
    ("a guard that joined its dropped guard's hold repeats its token",
     [_grant("a.1", 1.0, 0.9, [200]), _grant("a.1", 3.0, 2.9, [200], joined=True)], []),
    ("shared holds granted at once, recorded out of the server's order",
     [_grant("r.1", 1.00, 0.5, [101]), _grant("r.2", 0.99, 0.5, [102])], []),
    ("a reply held up past a later grant (a paused process): not ordered",
     [_grant("p.1", 5.0, 1.0, [100]), _grant("a.2", 3.0, 2.5, [200])], []),
    ("a shared hold below an earlier writer's token",
     [_grant("w.1", 1.0, 0.9, [300]), _grant("r.2", 2.0, 1.1, [299])], ["r.2"]),
    ("a permit below the highest of several earlier ones",
     [_grant("s.1", 1.0, 0.9, [300]), _grant("s.2", 1.1, 1.0, [100]),
      _grant("s.3", 2.0, 1.9, [250])], ["s.3"]),
    ("per key: a multi-key hold's tokens against each key's own history",
     [_grant("m.1", 1.0, 0.9, [500, 10], keys=["A", "B"]), _grant("b.2", 2.0, 1.5, [20],
                                                                  keys=["B"])], []),
    ("per key: a multi-key hold below one key's history",
     [_grant("a.1", 1.0, 0.9, [500], keys=["A"]),
      _grant("m.2", 2.0, 1.5, [400, 10], keys=["A", "B"])], ["m.2"]),
    ("no asked recorded: the holder's previous event bounds it",
     [_grant("a.1", 1.0, 0.9, [200]), {"e": "busy", "h": "b.2", "ctx": "b", "t": 1.2},
      {**_grant("b.2", 2.0, 0.0, [100]), "asked": None}], ["b.2"]),
])
def test_token_order(name, events, flagged):
    for e in events:
        if e.get("asked", 0) is None:
            del e["asked"]
    found = token_order(events, [])
    assert [line.split(" ")[1] for line in found] == flagged, (name, found)


def test_token_pairs_counts_what_token_order_compares():
    # A: b.2 asked after a.1 came back (1 pair), c.3 after both (2), d.4 before any came back;
    # B: alone.
    events = [_grant("a.1", 1.0, 0.9, [100]), _grant("b.2", 2.0, 1.5, [200]),
              _grant("c.3", 3.0, 2.5, [300]), _grant("d.4", 4.0, 0.5, [400]),
              _grant("e.5", 1.0, 0.5, [10], keys=["B"])]
    assert token_pairs(events) == (5, 2, 3)


def test_a_dropped_guard_s_end_is_its_own_belief_s_not_the_guard_that_joined_its_hold():
    # Seed 1 (cluster) of the REPLACE-removal runs: main.1 dropped its guard, its next acquire
    # joined the same hold (not yet collected), and that guard went to the collector ('gc').
    # Each end is its own guard's: the hold's expiry at 5.0 finds nobody believing in it (the
    # analysis gave both ends to the joined guard, so the dropped one was believed held to
    # the run's end: 'OVER BOUND ... then run-end').
    owner, key = "o:1", "{g}:A"
    held = {"h": "main.1", "ctx": "main", "owner": owner, "keys": [key], "tokens": [7]}
    events = [
        {"e": "spec", "h": "main.1", "ctx": "main", "t": 0.5, "lease": 2.0},
        {"e": "granted", "t": 1.0, "reentry": False, "joined": False, "asked": 0.9, **held},
        {"e": "end", "t": 1.5, "how": "drop", **held},
        {"e": "granted", "t": 1.6, "reentry": False, "joined": True, "asked": 1.55, **held},
        {"e": "end", "t": 2.0, "how": "gc", **held},
    ]
    snaps = [Snap(0, 1.1, 1.1, "plain", None, {key: {(owner, 7)}}, {}),
             Snap(1, 5.0, 5.0, "plain", None, {key: set()}, {})]
    report = analyse("t", 1, events, snaps, [], {"main": Context("main")}, 30.0, False, 0.5,
                     1.5, {key})
    assert report.over_bound == [] and report.false_held == [], report.summary()
    assert report.regranted == [] and len(report.regranted_after_drop) == 1


def test_token_order_names_the_disruptions_between_the_two_grants():
    migrate = Disruption(0, "migrate", 1.5, 1.6, {"group": "g", "from": 7001, "to": 7002})
    kill = Disruption(1, "sigkill", 1.7, 1.7, {"ctx": "p3"})
    later = Disruption(2, "del", 2.5, 2.5, {"key": "{g}:A"})
    found = token_order([_grant("a.1", 1.0, 0.9, [200], keys=["{g}:A"]),
                         _grant("b.2", 2.0, 1.5, [100], keys=["{g}:A"])],
                        [migrate, kill, later])
    assert len(found) == 1
    assert "(asked 1.500, node 7002)" in found[0] and "(node 7001)" in found[0], found
    assert "migrate {'group': 'g', 'from': 7001, 'to': 7002} at 1.500" in found[0], found
    assert "sigkill {'ctx': 'p3'} at 1.700" in found[0] and "del" not in found[0], found
