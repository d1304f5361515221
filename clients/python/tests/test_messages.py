"""The server's pub/sub messages, parsed (no server needed): every lost-hold and leader format,
what a hold and an observer make of them, and what they refuse."""

from __future__ import annotations

import pytest

from redis_lock_client import Leader, LostReason, Renewal
from redis_lock_client._leaders import LeaderFeed
from redis_lock_client._lifecycle import HoldMachine
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

ONE_HOLD = [
    (b"forcereleased", LostReason.FORCE_RELEASED),
    (b"disconnected", LostReason.DISCONNECTED),
    (b"expired", LostReason.EXPIRED),
    (b"deleted", LostReason.DELETED),
    (b"overwritten", LostReason.OVERWRITTEN),
    (b"evicted", LostReason.EVICTED),
]


@pytest.mark.scenario("lost-forcereleased", "lost-disconnected", "lost-deleted",
                      "lost-overwritten", "lost-evicted", "lost-expired")
@pytest.mark.parametrize("word,reason", ONE_HOLD)
def test_a_one_hold_message_names_db_token_key_and_owner(word, reason):
    # <reason> <db> <token> <keylen> <key> <owner>: the key is exactly keylen bytes (spaces
    # too), the owner the rest of the message (spaces too).
    assert parse_lost(word + b" 3 42 9 a key {x} app:1 with space") == HoldEnded(
        reason, 3, 42, b"a key {x}", b"app:1 with space")
    assert parse_lost(word + b" 0 0 1 k o") == HoldEnded(reason, 0, 0, b"k", b"o")  # Redisson's
    assert parse_lost(word + b" 0 7 0  owner") == HoldEnded(reason, 0, 7, b"", b"owner")


@pytest.mark.scenario("signal-own-key", "cluster-moved")
def test_whole_key_and_moved_messages_have_a_star_and_end_with_the_key():
    for word, reason in [(b"deleted", LostReason.DELETED), (b"expired", LostReason.EXPIRED),
                         (b"overwritten", LostReason.OVERWRITTEN),
                         (b"evicted", LostReason.EVICTED)]:
        assert parse_lost(word + b" 1 * 5 {a} b") == KeyEnded(reason, 1, b"{a} b")
    assert parse_lost(b"moved 0 * 3 k k") == KeyMoved(0, b"k k")


@pytest.mark.parametrize("bad", [
    b"", b"deleted", b"deleted 0 42 1", b"deleted 0 42 1 k",  # no owner
    b"deleted x 42 1 k o", b"deleted 0 x 1 k o", b"deleted 0 42 x k o", b"deleted -1 42 1 k o",
    b"deleted 0 42 5 k o",  # keylen past the end
    b"deleted 0 42 1 kowner",  # no space after the key
    b"unknown 0 42 1 k o", b"flushed 0", b"moved 0 42 1 k o",  # moved names no hold
    b"forcereleased 0 * 1 k",  # forcereleased is of one hold only
    b"disconnected 0 * 1 k", b"deleted 0 * 1 k trailing", b"deleted 0 * 3 k",
    b"moved 0 * 1 k x", b"deleted 42 owner",  # the old format is not the new one
])
def test_anything_else_is_not_a_lost_hold_message(bad):
    assert parse_lost(bad) is None


@pytest.mark.scenario("lost-flushed")
def test_flush_messages():
    assert parse_flush(b"flushed 0") == Flushed(0)
    assert parse_flush(b"flushed 12") == Flushed(12)
    assert parse_flush(b"flushed all") == Flushed(None)
    for bad in [b"flushed", b"flushed x", b"flushed 0 1", b"deleted 0", b""]:
        assert parse_flush(bad) is None
    assert Flushed(None).covers(5) and Flushed(5).covers(5) and not Flushed(4).covers(5)


def test_leader_messages_name_db_epoch_key_and_candidate_or_value():
    assert parse_leader_message(b"elected 1 77 5 {s} x node a") == LeaderMessage(
        True, 1, 77, b"{s} x", b"node a")
    assert parse_leader_message(b"proclaimed 0 77 1 s 10.0.0.1:80") == LeaderMessage(
        False, 0, 77, b"s", b"10.0.0.1:80")
    assert parse_leader_message(b"proclaimed 0 77 1 s ") == LeaderMessage(False, 0, 77, b"s", b"")
    for bad in [b"elected 0 77 1 s ", b"elected 0 0 1 s c", b"elected 0 77 2 s c",
                b"elected 77 node", b"proclaimed 77 value", b"other 0 77 1 s c", b""]:
        assert parse_leader_message(bad) is None


def test_channels_are_shared_by_a_key_and_its_braced_form():
    assert lost_signal_channel("a") == lost_signal_channel("{a}") == b"lock.lost:{a}"
    assert lost_signal_channel("x{y}z") == b"lock.lost:x{y}z"
    assert leader_channel("a") == leader_channel(b"{a}") == b"lock.leader:{a}"


def _machine(db: int = 0, key: bytes = b"k", token: int = 42, owner: bytes = b"me") -> HoldMachine:
    return HoldMachine(db=db, owner=owner, tokens={key: token}, lease=30.0,
                       renewal=Renewal.WATCHDOG, sent_at=0.0, replied_at=0.0)


@pytest.mark.scenario("lost-forcereleased", "signal-forged")
def test_a_message_naming_a_hold_is_only_a_reason_to_check_it():
    for other in [HoldEnded(LostReason.DELETED, 1, 42, b"k", b"me"),  # another db (COPY ... DB 1)
                  HoldEnded(LostReason.DELETED, 0, 42, b"{k}", b"me"),  # another key, same channel
                  HoldEnded(LostReason.DELETED, 0, 41, b"k", b"me"),  # another token
                  HoldEnded(LostReason.DELETED, 0, 42, b"k", b"you")]:  # another owner
        assert not _machine().names(other)
    # The hold's own: anyone allowed to publish on the channel can send it, so it only asks
    # for a check (the machine has no event for a message); the check's answer decides.
    machine = _machine()
    assert machine.names(HoldEnded(LostReason.DELETED, 0, 42, b"k", b"me"))
    assert not hasattr(machine, "signal")
    assert machine.checked(True, LostReason.DELETED) is None and machine.active
    assert machine.checked(False, LostReason.DELETED) is LostReason.DELETED
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
