"""The shared test vectors (``clients/vectors``, see its README): the rules both libraries
share, checked row by row against this library's code (no server needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import pytest

from redis_lock_client import LostReason, Renewal
from redis_lock_client._commands import fence_refusal, is_final, is_not_yet
from redis_lock_client._common import missing_rule, refused_command
from redis_lock_client._lifecycle import (
    Answer,
    Answered,
    CheckRead,
    ConnectionLost,
    Event,
    Granted,
    HoldMachine,
    Holds,
    MasterReplaced,
    Phase,
    Read,
    Reentered,
    ReleaseReplied,
    ReleaseRequested,
    Replaced,
    Signal,
    Tick,
    Unbound,
)
from redis_lock_client._lifecycle import Fenced as FencedEvent
from redis_lock_client._messages import (
    Flushed,
    HoldEnded,
    KeyEnded,
    KeyMoved,
    LeaderMessage,
    leader_channel,
    lost_signal_channel,
    parse_flush,
    parse_leader_message,
    parse_lost,
    unlock_channel,
)

VECTORS = Path(__file__).resolve().parents[2] / "vectors"


def unescape(text: str) -> bytes:
    r"""A column's bytes: ``\xHH`` is the byte HH, ``\\`` a backslash."""
    return re.sub(
        rb"\\(x[0-9a-fA-F]{2}|\\)",
        lambda m: b"\\" if m.group(1) == b"\\" else bytes([int(m.group(1)[1:], 16)]),
        text.encode(),
    )


def rows(name: str) -> list[list[str]]:
    lines = (VECTORS / name).read_text(encoding="utf-8").split("\n")
    return [line.split("\t") for line in lines if line and not line.startswith("#")]


def column(row: list[str], at: int) -> str:
    return row[at] if at < len(row) else ""


def expected_lost(row: list[str]) -> Optional[object]:
    kind = row[1]
    reason, db, token, key, owner = (column(row, i) for i in range(2, 7))
    if kind == "hold":
        return HoldEnded(LostReason(reason), int(db), int(token), unescape(key), unescape(owner))
    if kind == "key":
        return KeyEnded(LostReason(reason), int(db), unescape(key))
    if kind == "moved":
        return KeyMoved(int(db), unescape(key))
    if kind == "flushed":
        return Flushed(None if db == "all" else int(db))
    assert kind == "none", row
    return None


@pytest.mark.scenario("lost-forcereleased", "lost-disconnected", "lost-deleted",
                      "lost-overwritten", "lost-evicted", "lost-expired", "signal-own-key",
                      "cluster-moved", "lost-flushed")
@pytest.mark.parametrize("row", rows("lost-messages.tsv"), ids=lambda r: r[0] or "(empty)")
def test_lost_messages(row):
    payload, want = unescape(row[0]), expected_lost(row)
    if isinstance(want, Flushed):
        assert (parse_flush(payload), parse_lost(payload)) == (want, None)
    else:
        assert (parse_lost(payload), parse_flush(payload)) == (want, None)


@pytest.mark.parametrize("row", rows("leader-messages.tsv"), ids=lambda r: r[0] or "(empty)")
def test_leader_messages(row):
    want = None
    if row[1] != "none":
        db, epoch, key, data = (column(row, i) for i in range(2, 6))
        want = LeaderMessage(row[1] == "elected", int(db), int(epoch), unescape(key), unescape(data))
    assert parse_leader_message(unescape(row[0])) == want


@pytest.mark.parametrize("row", rows("channels.tsv"), ids=lambda r: r[0])
def test_channels(row):
    key = unescape(row[0])
    assert lost_signal_channel(key) == unescape(row[1])
    assert leader_channel(key) == unescape(row[2])
    assert unlock_channel(key) == unescape(row[3])


@pytest.mark.parametrize(
    "name",
    ["lost-messages.tsv", "leader-messages.tsv", "channels.tsv", "error-lines.tsv",
     "hold-machine.tsv"])
def test_every_file_has_rows(name):
    assert len(rows(name)) > 5


@pytest.mark.parametrize("row", rows("error-lines.tsv"), ids=lambda r: r[0])
def test_error_lines(row):
    line = row[0]
    assert is_final(line) == (column(row, 1) == "final")
    fence = {"gone": LostReason.HOLD_GONE, "token-not-current": LostReason.TOKEN_NOT_CURRENT}
    assert fence_refusal(line) == fence.get(column(row, 2))
    assert is_not_yet(line) == (column(row, 3) == "not-yet")
    if line.startswith("NOPERM"):
        named = refused_command(line)
        assert named == column(row, 4)
        assert missing_rule(named or "LOCK.ACQUIRE", line) == column(row, 5)


def hold_scenarios() -> list[list[list[str]]]:
    """The hold machine's scenarios: the rows with one name (one hold's life), in order."""
    out: dict[str, list[list[str]]] = {}
    for row in rows("hold-machine.tsv"):
        out.setdefault(row[0], []).append(row)
    return list(out.values())


def seconds(ms: str) -> float:
    return int(ms) / 1000


def hold_machine(grant: list[str]) -> HoldMachine:
    """The machine a scenario's first row (``grant``) makes, on the terms its argument names:
    the lease in ms, then any of ``fixed``, ``ephemeral``, ``replicated``, ``multi``."""
    assert grant[3] == "grant", grant
    lease, *words = grant[4].split()
    assert set(words) <= {"fixed", "ephemeral", "replicated", "multi"}, grant
    return HoldMachine(
        db=0, owner=b"o", tokens={b"k": 1}, lease=seconds(lease),
        renewal=Renewal.FIXED if "fixed" in words else Renewal.WATCHDOG,
        replicated="replicated" in words, ephemeral="ephemeral" in words, multi="multi" in words)


def check_answer(argument: str) -> tuple[CheckRead, Optional[float]]:
    """A check's argument: the reason the check was asked with, then the lease left in ms, if
    the read showed it."""
    reason, *left = argument.split()
    return CheckRead(LostReason(reason)), seconds(left[0]) if left else None


def hold_events(row: list[str]) -> list[Event]:
    """The machine's event for one row."""
    now = seconds(row[1])
    sent = seconds(column(row, 2) or row[1])
    event, argument = row[3], column(row, 4)

    def renewal(answer: Holds | Answer) -> Answered:
        return Answered(Read.RENEWAL, sent, now, answer)

    if event == "grant":
        return [Granted(0.0, now)]
    if event == "tick":
        return [Tick(now)]
    if event == "confirmed":
        if argument:  # the lease left (``none``: the server has no lease on the hold)
            left = float("inf") if argument == "none" else seconds(argument)
            return [Answered(Read.LEASE_LEFT, sent, now, Holds(left))]
        return [renewal(Holds())]
    simple: dict[str, Event] = {
        "renewed": renewal(Holds()),
        "renewal-gone": renewal(Answer.GONE),
        "renewal-unanswered": renewal(Answer.NOTHING),
        "renewal-unacknowledged": renewal(Answer.UNACKNOWLEDGED),
        "renewal-denied": renewal(Answer.REFUSED),
        "reentered": Reentered(sent),
        "replaced": Replaced(),
        "connection-lost": ConnectionLost(),
        "master-replaced": MasterReplaced(),
        "unbound": Unbound(),
        "release": ReleaseRequested(),
        "release-replied": ReleaseReplied(),
    }
    if event in simple:
        return [simple[event]]
    if event == "hint":  # a message naming this very hold (database, key, owner, token)
        return [Signal(HoldEnded(LostReason(argument), 0, 1, b"k", b"o"))]
    if event == "key-message":  # a message about the whole key (deleted, overwritten, ...)
        return [Signal(KeyEnded(LostReason(argument), 0, b"k"))]
    if event in ("check-present", "check-gone", "check-denied", "check-unanswered"):
        read, left = check_answer(argument)
        answer: Holds | Answer = {
            "check-present": Holds(left), "check-gone": Answer.GONE,
            "check-denied": Answer.REFUSED, "check-unanswered": Answer.NOTHING}[event]
        return [Answered(read, sent, now, answer)]
    if event == "fenced":
        return [FencedEvent(LostReason(argument))]
    raise AssertionError(f"unknown event {event!r}: {row}")


@pytest.mark.parametrize("steps", hold_scenarios(), ids=lambda steps: steps[0][0])
def test_hold_machine(steps):
    m = hold_machine(steps[0])
    for at, row in enumerate(steps):
        assert (row[3] == "grant") == (at == 0), row
        # What the machine asks the shell to do, over the row's events: only through ``step``.
        asks: set[str] = set()
        abandon = False
        for event in hold_events(row):
            out = m.step(event)
            asks |= {word for word, asked in [
                ("renew", out.renew), ("read", out.read_lease), ("check", out.check is not None),
                ("release", out.release)] if asked}
            abandon = abandon or out.abandon
        ended = m.phase in (Phase.LOST, Phase.REFUSED)
        deadline = "" if m.phase is not Phase.HELD else (
            "never" if m.deadline == float("inf") else str(round(m.deadline * 1000)))
        got = (m.phase.value, m.reason.value if ended and m.reason else "", asks,
               "abandon" if abandon else "", deadline)
        want = (row[5], column(row, 6), set(column(row, 7).split()), column(row, 8),
                column(row, 9))
        assert want[0] in {p.value for p in Phase} - {"acquiring"}, row
        assert not want[1] or LostReason(want[1]), row
        assert want[2] <= {"renew", "read", "check", "release"}, row
        assert want[3] in ("", "abandon"), row
        assert got == want, row


def _gone_reply(text: str) -> object:
    if text == "nil":
        return None
    if text == "OK":
        return b"OK"
    if text.startswith("["):
        return [int(n) for n in text.strip("[]").split(" ")]
    return int(text)


@pytest.mark.parametrize("row", rows("gone-answers.tsv"), ids=lambda r: f"{r[0]}-{r[1]}")
def test_the_answers_that_ask_the_sentinels_afresh_are_the_shared_ones(row: list[str]) -> None:
    from redis_lock_client._sync._connection import says_gone

    assert says_gone([row[0]], _gone_reply(row[1])) is (column(row, 2) == "afresh")
