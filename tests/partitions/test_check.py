"""The checker's own test: each count finds what it counts on a history made by hand (no
servers). `target/python-client-venv/bin/python -m pytest tests/partitions/test_check.py`."""

from __future__ import annotations

from typing import Any

import check


def op(process: str, name: str, token: int | None, invoke: float, complete: float,
       outcome: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"process": process, "op": name, "key": "{k}", "token": token, "invoke": invoke,
            "complete": complete, "outcome": outcome, **extra}


def test_a_lower_token_written_after_a_higher_one_is_out_of_order() -> None:
    count, examples = check.count_out_of_order(["a:5:1", "b:7:1", "a:5:2", "c:9:1", "c:9:2"])
    assert count == 1 and examples == ["#2 a:5:2 after token 7"]
    assert check.count_out_of_order(["a:5:1", "a:5:2", "b:7:1"])[0] == 0


def test_holds_of_two_clients_overlap_until_release_or_loss_report() -> None:
    history = [
        op("c1", "acquire", 5, 0.0, 1.0),
        op("c2", "acquire", 7, 1.5, 2.0),
        op("c1", "lost", 5, 2.5, 2.5, outcome="info"),  # c1 believed until 2.5
        op("c1", "release", 5, 3.0, 3.1),
        op("c2", "release", 7, 4.0, 4.1),
        op("c3", "acquire", 9, 4.0, 4.2),  # after c2's release began: no overlap
    ]
    pairs = check.overlapping_pairs(check.holds_of(history, run_end=10.0))
    assert [(a.process, b.process) for a, b in pairs] == [("c1", "c2")]


def test_an_overlapping_pair_survives_only_when_both_holds_left_a_write_in_the_lists() -> None:
    history = [
        op("c1", "acquire", 5, 0.0, 1.0),  # c1 and c2 overlap; both writes kept
        op("c2", "acquire", 7, 1.5, 2.0),
        op("c1", "release", 5, 3.0, 3.1),
        op("c2", "release", 7, 4.0, 4.1),
        op("c3", "acquire", 9, 3.5, 3.6),  # overlaps c2; c3's write was discarded
        op("c3", "release", 9, 5.0, 5.1),
    ]
    logs = {"{k}": ["c1:5:1", "c2:7:1", "c3:8:1"]}  # c3 wrote under token 8, not its 9
    counts = check.check_kind(history, logs, [], (0.0, 10.0))
    assert (counts.overlapping, counts.overlapping_surviving) == (2, 1)
    assert counts.examples["overlapping_surviving"] == [
        "{k}: c1 token 5 [1.000, 3.000] and c2 token 7 [2.000, 4.000]"]
    assert check.check_kind(history, {"{k}": ["c1:5:1"]}, [], (0.0, 10.0)
                            ).overlapping_surviving == 0


def test_a_kept_pair_counts_as_side_by_side_only_when_both_kept_a_write_from_the_overlap() -> None:
    history = [
        op("c1", "acquire", 5, 0.0, 1.0),
        op("c1", "write", 5, 1.0, 1.1, entry="c1:5:1"),  # before c2 held: not inside
        op("c2", "acquire", 7, 1.5, 2.0),  # both believe from 2.0 to 3.0
        op("c2", "write", 7, 2.1, 2.2, entry="c2:7:1"),
        op("c1", "write", 5, 2.5, 2.6, entry="c1:5:2"),  # inside, by the older holder
        op("c1", "release", 5, 3.0, 3.1),
        op("c2", "release", 7, 4.0, 4.1),
    ]
    fenced = check.check_kind(history, {"{k}": ["c1:5:1", "c2:7:1"]}, [], (0.0, 10.0))
    assert (fenced.overlapping_surviving, fenced.overlapping_writes) == (1, 0)
    # c1's late write kept before c2's (a list in token order): side by side all the same.
    both = check.check_kind(history, {"{k}": ["c1:5:1", "c1:5:2", "c2:7:1"]}, [], (0.0, 10.0))
    assert (both.out_of_order, both.overlapping_surviving, both.overlapping_writes) == (0, 1, 1)
    assert both.examples["overlapping_writes"] == [
        "{k}: c1 token 5 [1.000, 3.000] and c2 token 7 [2.000, 4.000]: ['c1:5:2'] and ['c2:7:1']"]


def test_a_semaphore_counts_holds_begun_over_its_limit_not_pairs_or_token_order() -> None:
    history = [
        op("c1", "acquire", 5, 0.0, 1.0),
        op("c2", "acquire", 6, 1.0, 1.5),  # two permits of two: within the limit
        op("c3", "acquire", 7, 1.8, 2.0),  # a third believed holder: over the limit
        op("c1", "release", 5, 3.0, 3.1),
        op("c4", "acquire", 8, 3.2, 3.3),  # c1 has let go: c2, c3, c4 are over it again
        op("c2", "release", 6, 4.0, 4.1),
        op("c3", "release", 7, 4.0, 4.1),
        op("c4", "release", 8, 5.0, 5.1),
    ]
    # Tokens interleave in a semaphore's list; c3's write did not survive.
    logs = {"{k}": ["c1:5:1", "c2:6:1", "c1:5:2", "c4:8:1", "c2:6:2"]}
    counts = check.check_kind(history, logs, [], (0.0, 10.0), limit=2)
    assert (counts.over_limit, counts.over_limit_surviving) == (2, 0)
    assert counts.examples["over_limit"][0] == (
        "{k}: c3 token 7 from 2.000 while c1 token 5 [1.000, 3.000], c2 token 6 [1.500, 4.000]")
    assert (counts.out_of_order, counts.overlapping, counts.failed) == (0, 0, [])
    kept = check.check_kind(history, {"{k}": [*logs["{k}"], "c3:7:1"]}, [], (0.0, 10.0),
                            limit=2)
    assert (kept.over_limit, kept.over_limit_surviving) == (2, 2)
    assert check.check_kind(history, logs, [], (0.0, 10.0), limit=3).over_limit == 0
    # Only c4 is of this library: its own hold counts, c3's (before c4 held) does not.
    assert check.check_kind(history, logs, [], (0.0, 10.0), processes={"c4"},
                            limit=2).over_limit == 1
    table = check.markdown_table({"lock": check.check_kind(history, logs, [], (0.0, 10.0)),
                                  "semaphore": counts}).splitlines()
    assert "| **writes landed out of token order** | **2** | - | must be 0 (checked) |" in table
    assert ("| holds begun over a semaphore's limit: all / writes kept | - | 2 / 0 | "
            "reported: more believed holders than permits |") in table


def test_a_deposed_leaders_heartbeat_after_its_successors_is_out_of_order() -> None:
    # An election's history as client.py writes it: a campaign is an acquire (the epoch its
    # token), a heartbeat a write, a resignation a release.
    history = [
        op("c1", "acquire", 10, 0.0, 0.5),
        op("c1", "write", 10, 0.5, 0.6, entry="c1:10:1"),
        op("c2", "acquire", 12, 1.0, 2.0),  # elected while c1 still believes it leads
        op("c2", "write", 12, 2.0, 2.1, entry="c2:12:1"),
        op("c1", "write", 10, 2.5, 2.6, entry="c1:10:2"),  # acknowledged: must not land
        op("c1", "release", 10, 3.0, 3.1),
        op("c2", "release", 12, 4.0, 4.1),
    ]
    fenced = check.check_kind(history, {"{k}": ["c1:10:1", "c2:12:1"]}, [], (0.0, 10.0))
    assert (fenced.out_of_order, fenced.overlapping, fenced.overlapping_surviving) == (0, 1, 1)
    assert fenced.lost_writes == 1 and fenced.failed == []
    stale = check.check_kind(history, {"{k}": ["c1:10:1", "c2:12:1", "c1:10:2"]}, [],
                             (0.0, 10.0))
    assert stale.out_of_order == 1 and stale.examples["out_of_order"] == [
        "{k} #2 c1:10:2 after token 12"]
    assert stale.failed == ["fenced writes landed out of token order"]


def test_one_token_acquired_by_two_clients_is_counted_once() -> None:
    history = [op("c1", "acquire", 5, 0, 1), op("c2", "acquire", 5, 2, 3),
               op("c2", "acquire", 6, 4, 5)]
    assert check.tokens_handed_twice(history) == [("{k}", 5, ["c1", "c2"])]


def test_lost_and_refused_writes_are_read_against_the_final_list() -> None:
    history = [
        op("c1", "acquire", 5, 0, 1),
        op("c1", "write", 5, 1, 1.1, entry="c1:5:1"),  # acknowledged, kept
        op("c1", "write", 5, 2, 2.1, entry="c1:5:2"),  # acknowledged, lost
        op("c2", "write", 4, 3, 3.1, outcome="fail", entry="c2:4:1",
           error="Fenced: ..."),  # refused, yet in the list: broken
    ]
    counts = check.check_kind(history, {"{k}": ["c1:5:1", "c2:4:1"]}, [], (0.0, 10.0))
    assert counts.lost_writes == 1 and counts.refused_landed == 1 and counts.fenced == 1
    assert counts.out_of_order == 1
    assert counts.failed == ["fenced writes landed out of token order",
                             "writes answered as refused that landed"]


def test_grant_rates_split_between_faults_and_health() -> None:
    history = [op("c1", "acquire", t, t - 0.1, t) for t in (1, 2, 3, 6.5, 7)]
    counts = check.check_kind(history, {}, [("isolate-master", 5.0, 10.0)], (0.0, 10.0))
    assert (counts.rate_healthy, counts.rate_faults) == (3 / 5, 2 / 5)
    assert counts.longest_gap == 3.5
    # The fault's longest stretch without a grant: from the last one (7) to the run's end.
    assert counts.outages == [("isolate-master", 3.0)]


def test_a_library_counts_its_own_calls_and_writes_and_every_pair_it_is_in() -> None:
    python, rust = {"c1", "c2"}, {"c5"}
    history = [
        op("c1", "acquire", 5, 0.0, 1.0),
        op("c1", "write", 5, 1.0, 1.1, entry="c1:5:1"),
        op("c5", "acquire", 7, 1.5, 2.0),  # overlaps c1's hold: a pair of both libraries
        op("c5", "write", 7, 2.0, 2.1, entry="c5:7:1"),
        op("c1", "write", 5, 2.5, 2.6, entry="c1:5:2"),  # landed after token 7: c1's fault
        op("c1", "release", 5, 3.0, 3.1),
        op("c5", "write", 7, 3.2, 3.3, outcome="fail", entry="c5:7:2", error="NotHeld: ..."),
        op("c5", "release", 7, 4.0, 4.1),
        op("c2", "acquire", 9, 5.0, 5.1),
        op("c2", "release", 9, 6.0, 6.1),
    ]
    logs = {"{k}": ["c1:5:1", "c5:7:1", "c1:5:2"]}
    everyone = check.check_kind(history, logs, [], (0.0, 10.0))
    py = check.check_kind(history, logs, [], (0.0, 10.0), processes=python)
    rs = check.check_kind(history, logs, [], (0.0, 10.0), processes=rust)
    assert (py.acquires["ok"], rs.acquires["ok"]) == (2, 1)
    assert (py.writes["ok"], rs.writes["ok"], rs.writes["fail"]) == (2, 1, 1)
    assert (py.not_sent, rs.not_sent) == (0, 1)
    assert (py.landed, rs.landed, everyone.landed) == (2, 1, 3)
    assert (py.out_of_order, rs.out_of_order, everyone.out_of_order) == (1, 0, 1)
    assert (py.overlapping, rs.overlapping, everyone.overlapping) == (1, 1, 1)
    assert py.failed == ["fenced writes landed out of token order"] and rs.failed == []


def test_a_token_two_libraries_got_counts_for_both_and_not_for_a_third() -> None:
    history = [op("c1", "acquire", 5, 0, 1), op("c5", "acquire", 5, 2, 3),
               op("c2", "acquire", 6, 4, 5)]
    counts = {name: check.check_kind(history, {}, [], (0.0, 10.0), processes=procs).tokens_twice
              for name, procs in (("c1", {"c1"}), ("c5", {"c5"}), ("c2", {"c2"}))}
    assert counts == {"c1": 1, "c5": 1, "c2": 0}


def test_a_faults_unavailability_counts_from_its_start_into_the_pause_after_it() -> None:
    grants = [1.0, 2.0, 9.0, 10.0, 14.0, 15.0]
    faults = [("isolate-master", 3.0, 6.0),  # no grant from 2 to 9: 6 s counted from 3
              ("flapping-master", 11.0, 12.0),  # 10 to 14, past its heal: 3 s from 11
              ("master-cannot-send", 16.0, 17.0)]  # 15 to the end (20): 4 s from 16 for it,
    # and 1 s (15 to 16) for flapping-master, whose 3 s stay its longest
    assert check.unavailability(grants, faults, (0.0, 20.0)) == [
        ("isolate-master", 6.0), ("flapping-master", 3.0), ("master-cannot-send", 4.0)]


def test_a_stretch_without_grants_over_two_faults_is_split_where_the_second_began() -> None:
    faults = [("client-cannot-receive", 5.0, 6.0), ("isolate-replica", 3.0, 4.0)]
    # Sorted by start: isolate-replica's period is 3 to 5, the other's 5 to the end (10).
    assert check.unavailability([1.0, 2.0, 8.0], faults, (0.0, 10.0)) == [
        ("isolate-replica", 2.0), ("client-cannot-receive", 3.0)]
    assert check.unavailability([], faults, (0.0, 10.0)) == [
        ("isolate-replica", 2.0), ("client-cannot-receive", 5.0)]


def test_unavailability_by_kind_of_fault_gives_count_median_and_longest() -> None:
    outages = [("flapping-master", 1.0), ("isolate-master", 4.0), ("flapping-master", 3.0),
               ("flapping-master", 2.0), ("isolate-master", 6.0)]
    assert check.unavailability_by_kind(outages) == {
        "flapping-master": (3, 2.0, 3.0), "isolate-master": (2, 5.0, 6.0)}
    assert check.median([]) == 0.0


def test_lost_writes_are_told_by_the_kind_of_the_fault_they_came_with() -> None:
    faults = [("master-cannot-send", 10.0, 12.0), ("flapping-master", 40.0, 45.0)]
    assert check.by_fault([11.0, 30.0, 44.0, 70.0], faults) == {
        "master-cannot-send": 1, "flapping-master": 1, "none": 2}


def test_the_matrix_table_has_a_row_per_run_and_kind_of_lock() -> None:
    lock = {"overlapping": 3, "overlapping_surviving": 1, "overlapping_writes": 0,
            "out_of_order": 0, "refused_landed": 0, "tokens_twice": 1,
            "lost_writes": 2, "unavailability_p50": 1.25, "unavailability_max": 7.0}
    runs: list[dict[str, Any]] = [
        {"min_replicas": 0, "down_after": 1000, "faults_applied": {"isolate-master": 2,
         "flapping-master": 1}, "cuts": 6, "failovers": 2, "exit": 0,
         "locks": {"plain": lock, "replicas=1": {**lock, "lost_writes": 0}}},
        {"min_replicas": 1, "down_after": 3000, "exit": 2},  # its set-up failed
    ]
    semaphore = {**lock, "limit": 2, "over_limit": 4, "over_limit_surviving": 1}
    runs[0]["locks"]["semaphore"] = semaphore
    rows = check.matrix_table(runs).splitlines()
    assert len(rows) == 2 + 3 + 1
    assert rows[2] == (
        "| 0 | 1000 | plain | 3 / 1 / 0 | **0 / 0** | 1 | 2 | 1.2 / 7.0 | 3 (6) | 2 | 0 |")
    assert rows[3].startswith("| 0 | 1000 | replicas=1 | 3 / 1 / 0 | **0 / 0** | 1 | 0 |")
    assert rows[4].startswith("| 0 | 1000 | semaphore | over the limit: 4 / 1 | **- / 0** |")
    assert rows[5].startswith("| 1 | 3000 | - | no summary") and rows[5].endswith("| 2 |")
