"""The server's pub/sub messages, parsed (no server needed): every lost-hold and leader format,
what a hold and an observer make of them, and what they refuse."""

from __future__ import annotations

import pytest

from redis_lock_client import Leader, LostReason, Renewal
from redis_lock_client._leaders import LeaderFeed
from redis_lock_client._lifecycle import Answer, Answered, CheckRead, Granted, HoldMachine, Holds, Signal
from redis_lock_client._messages import (
    Flushed,
    HoldEnded,
    LeaderMessage,
)

# What each payload says, and which are ignored: the shared vectors (test_vectors.py).


def test_a_flush_covers_its_database_or_all():
    assert Flushed(None).covers(5) and Flushed(5).covers(5) and not Flushed(4).covers(5)


def _machine(db: int = 0, key: bytes = b"k", token: int = 42, owner: bytes = b"me") -> HoldMachine:
    m = HoldMachine(db=db, owner=owner, tokens={key: token}, lease=30.0, renewal=Renewal.WATCHDOG)
    m.step(Granted(0.0, 0.0))
    return m


@pytest.mark.scenario("lost-forcereleased", "signal-forged")
def test_a_message_naming_a_hold_is_only_a_reason_to_check_it():
    for other in [HoldEnded(LostReason.DELETED, 1, 42, b"k", b"me"),  # another db (COPY ... DB 1)
                  HoldEnded(LostReason.DELETED, 0, 42, b"{k}", b"me"),  # another key, same channel
                  HoldEnded(LostReason.DELETED, 0, 41, b"k", b"me"),  # another token
                  HoldEnded(LostReason.DELETED, 0, 42, b"k", b"you")]:  # another owner
        assert not _machine().names(other)
        assert _machine().step(Signal(other)).check is None
    # The hold's own: anyone allowed to publish on the channel can send it, so it only asks
    # for a check; the check's answer decides.
    machine = _machine()
    assert machine.names(HoldEnded(LostReason.DELETED, 0, 42, b"k", b"me"))
    out = machine.step(Signal(HoldEnded(LostReason.DELETED, 0, 42, b"k", b"me")))
    assert out.check is not None and out.check.reason is LostReason.DELETED
    assert out.lost is None and machine.active
    read = CheckRead(LostReason.DELETED)
    assert machine.step(Answered(read, 1.0, 1.0, Holds())).lost is None and machine.active
    assert machine.step(Answered(read, 1.0, 1.0, Answer.GONE)).lost is LostReason.DELETED
    assert not machine.active and machine.reason is LostReason.DELETED


def test_whole_key_flush_and_move_messages_concern_only_the_holds_db_and_key():
    machine = _machine(db=2)
    assert machine.concerns(2, b"k") and machine.concerns(None, None) and machine.concerns(2, None)
    assert not machine.concerns(0, b"k") and not machine.concerns(2, b"{k}")


@pytest.mark.scenario("election-observe-own", "election-observe-forged")
def test_an_observer_reads_on_its_own_db_and_keys_messages_and_yields_only_its_reads():
    feed = LeaderFeed(db=0, key=b"svc")
    assert feed.read(None) is None
    assert feed.read(Leader(b"a", 10, b"va")) == Leader(b"a", 10, b"va")
    # db 1's election of the same name, and {svc}'s (same channel, same slot: interleaved
    # epochs): neither is this observer's, so neither asks for a read.
    assert not feed.message(LeaderMessage(True, 1, 30, b"svc", b"app1-node"))
    assert not feed.message(LeaderMessage(True, 0, 31, b"{svc}", b"braced"))
    assert not feed.message(None)
    # Its own (real or forged, whatever the epoch): a read, whose answer is what counts.
    assert feed.message(LeaderMessage(False, 0, 10, b"svc", b"va2"))
    assert feed.message(LeaderMessage(True, 0, 9_000_000_000_000_000, b"svc", b"evil-node"))
    assert feed.read(Leader(b"a", 10, b"va")) is None  # unchanged
    assert feed.read(Leader(b"a", 10, b"va2")) == Leader(b"a", 10, b"va2")
    assert feed.read(Leader(b"b", 20, None)) == Leader(b"b", 20, None)
    assert feed.read(Leader(b"old", 15, None)) is None  # below: a server behind the others
    assert feed.read(Leader(b"b", 20, b"vb")) == Leader(b"b", 20, b"vb")
