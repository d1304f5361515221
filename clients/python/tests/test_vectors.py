"""The shared test vectors (``clients/vectors``, see its README): the rules both libraries
share, checked row by row against this library's code (no server needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import pytest

from redis_lock_client import LostReason
from redis_lock_client._commands import fence_refusal, is_final, is_not_yet
from redis_lock_client._common import missing_rule, refused_command
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


@pytest.mark.parametrize(
    "name", ["lost-messages.tsv", "leader-messages.tsv", "channels.tsv", "error-lines.tsv"])
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
