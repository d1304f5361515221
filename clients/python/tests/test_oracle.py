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

import pytest

from conftest import reports_key_events, start_cluster, start_server
from oracle.run import parse_seeds, run_seed

SECS = float(os.environ.get("ORACLE_SECS", "8"))
BASE = int(os.environ.get("ORACLE_SEED_BASE", "1"))
SEEDS = parse_seeds(os.environ.get("ORACLE_SEEDS"), 2, BASE)
CLUSTER_SEEDS = parse_seeds(os.environ.get("ORACLE_CLUSTER_SEEDS"), 1, BASE)
#: The false-held bounds: where the signal is on (a few hundred ms on a loaded machine; and
#: the median of those cases at most 50 ms), after a SIGSTOPped holder resumes 1.5 s, and
#: otherwise the watchdog's period (lease / 3) plus this slack.
SIGNAL_BOUND = float(os.environ.get("ORACLE_SIGNAL_BOUND", "0.5"))
SLACK = float(os.environ.get("ORACLE_SLACK", "1.5"))


def _check(report, capsys, dump) -> None:
    with capsys.disabled():
        print("\n" + report.summary() + f"\n  (everything recorded: {dump})")
    assert report.holds > 0 and report.writes > 0
    assert report.false_lost == [], "a guard reported lost while the server held its hold"
    assert report.stale == [], "a write of a superseded hold landed"
    assert report.regranted == [], "a token was handed out twice"
    # Whole: an exception that escaped a holder comes with its traceback.
    assert report.errors == [], "\n\n".join(report.errors)
    assert report.unchecked == []
    assert report.over_bound == [], "a guard believed held past its bound"


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
