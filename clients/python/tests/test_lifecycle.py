"""The hold's state machine (redis_lock_client/_lifecycle.py), no server: table cases for each
rule, and a model-based test (hypothesis) that drives random event sequences against a tiny
reference model and checks the rules after every step."""

from __future__ import annotations

from typing import Optional

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from redis_lock_client import LostReason, NotHeld, Renewal
from redis_lock_client._lifecycle import DRIFT, Confirm, HoldMachine, Phase
from redis_lock_client._messages import HoldEnded

LEASE = 3.0
TRUSTED = LEASE - LEASE * DRIFT
INTERVAL = LEASE / 3
KEY, OWNER, TOKEN, DB = b"k", b"me", 42, 0


def machine(sent: float = 0.0, replied: float = 0.0, renewal: Renewal = Renewal.WATCHDOG) -> HoldMachine:
    return HoldMachine(db=DB, owner=OWNER, tokens={KEY: TOKEN}, lease=LEASE, renewal=renewal,
                       sent_at=sent, replied_at=replied)


def test_a_grant_after_a_short_wait_is_held_until_its_send_time_plus_the_trusted_lease():
    m = machine(sent=10.0, replied=10.5)
    assert m.phase is Phase.HELD and m.confirmation is None
    assert m.deadline == 10.0 + TRUSTED
    assert m.renew_at == 10.0 + INTERVAL
    assert m.tick(10.0 + TRUSTED - 0.001) is None
    assert m.tick(10.0 + TRUSTED) is LostReason.UNREACHABLE


def test_a_grant_after_a_long_wait_needs_a_confirmation_and_time_alone_never_loses_it():
    m = machine(sent=0.0, replied=2 * LEASE)  # waited two leases
    assert m.phase is Phase.CONFIRMING and m.confirmation is Confirm.RENEWAL
    assert m.tick(100.0) is None and m.active  # no evidence of a loss
    assert m.next_wake() is None  # the watchdog does not run before the confirmation
    m.confirmed(sent_at=2 * LEASE)
    assert m.phase is Phase.HELD
    assert m.deadline == 2 * LEASE + TRUSTED and m.renew_at == 2 * LEASE + INTERVAL


def test_a_fixed_lease_after_a_long_wait_is_confirmed_by_a_read_of_its_ttl():
    m = machine(sent=0.0, replied=2 * LEASE, renewal=Renewal.FIXED)
    assert m.confirmation is Confirm.READ
    m.confirmed(sent_at=6.0, ttl=2.5)
    assert m.phase is Phase.HELD and m.deadline == 6.0 + 2.5 - LEASE * DRIFT
    assert m.next_wake() == m.deadline and not m.renewal_due(100.0)
    assert m.tick(m.deadline) is LostReason.LEASE_ENDED


def test_the_deadline_moves_only_on_confirmed_renewals_from_their_send_time():
    m = machine()
    m.renewed(sent_at=2.0)
    assert m.deadline == 2.0 + TRUSTED and m.renew_at == 2.0 + INTERVAL
    m.renewed(sent_at=1.0)  # an older renewal answered late: the deadline does not go back
    assert m.deadline == 2.0 + TRUSTED
    m.unanswered(now=3.5)  # no answer: try again soon, the deadline stays
    assert m.deadline == 2.0 + TRUSTED and m.renew_at == 3.5 + 0.1


def test_while_a_renewal_is_under_way_the_watchdog_wakes_only_for_the_deadline():
    m = machine()
    assert m.next_wake() == INTERVAL and m.renewal_due(INTERVAL)
    # Its answer sets the next renewal; until then the renewal time passed stays passed.
    assert m.next_wake(renewing=True) == TRUSTED
    m.renewed(sent_at=INTERVAL)
    assert m.next_wake() == 2 * INTERVAL
    fixed = machine(renewal=Renewal.FIXED)
    assert fixed.next_wake() == fixed.next_wake(renewing=True) == TRUSTED


def test_lost_only_on_evidence_and_nothing_changes_after():
    for event, reason in [
        (lambda m: m.refused(), LostReason.HOLD_GONE),
        (lambda m: m.connection_lost(), LostReason.CONNECTION_CLOSED),
        (lambda m: m.checked(False, LostReason.FLUSHED), LostReason.FLUSHED),
        (lambda m: m.checked(False, LostReason.EXPIRED), LostReason.EXPIRED),
        (lambda m: m.fenced(LostReason.HOLD_GONE), LostReason.HOLD_GONE),
        (lambda m: m.fenced(LostReason.TOKEN_NOT_CURRENT), LostReason.TOKEN_NOT_CURRENT),
    ]:
        m = machine()
        assert event(m) is reason and m.phase is Phase.LOST and m.reason is reason
        # The server said so (or ends it itself): nothing to release.
        assert not m.take_abandon()
        # A late renewal, another signal, the deadline: nothing changes.
        m.renewed(1.0)
        assert m.refused() is None and m.tick(1e9) is None and m.checked(False, LostReason.DELETED) is None
        assert m.phase is Phase.LOST and m.reason is reason and m.next_wake() is None
        error = m.release_requested()
        assert isinstance(error, NotHeld) and error.reason is reason
    m = machine()
    assert m.checked(True, LostReason.DELETED) is None and m.active  # found: nothing


def test_after_a_release_nothing_renews_and_nothing_is_reported():
    m = machine()
    assert m.release_requested() is None and m.phase is Phase.RELEASING
    assert m.next_wake() is None and not m.renewal_due(1e9)
    assert m.checked(False, LostReason.DELETED) is None
    assert m.tick(1e9) is None and not m.take_abandon()
    m.release_replied()
    assert m.phase is Phase.RELEASED
    error = m.release_requested()
    assert isinstance(error, NotHeld) and error.reason is None


def test_a_renewal_answered_0_while_a_named_message_is_checked_gives_the_message_s_reason():
    # A message naming the hold is a hint; the read it asks for and a renewal race. When the
    # renewal answers 0 first, the server confirmed the loss and the message says why.
    m = machine()
    m.hinted(LostReason.FORCE_RELEASED)
    assert m.active  # a hint alone changes nothing
    assert m.refused() is LostReason.FORCE_RELEASED
    # A check that found the hold voids the hint: a later 0 is only HOLD_GONE.
    m = machine()
    m.hinted(LostReason.FORCE_RELEASED)
    assert m.checked(True, LostReason.FORCE_RELEASED) is None
    assert m.refused() is LostReason.HOLD_GONE


def test_a_loss_the_server_may_not_know_of_asks_for_the_release_once():
    # No renewal confirmed for a lease: unreachable, released in the background.
    m = machine()
    m.unanswered(now=1.0)
    assert m.tick(TRUSTED) is LostReason.UNREACHABLE
    assert m.take_abandon() and not m.take_abandon()  # asked once
    # The master answered the last renewal, the replicas did not acknowledge it: unreplicated.
    m = machine()
    m.unanswered(now=1.0, unacknowledged=True)
    assert m.tick(TRUSTED) is LostReason.UNREPLICATED and m.take_abandon()
    # An acknowledged renewal (or one with no answer) after it: unreachable again.
    m = machine()
    m.unanswered(now=1.0, unacknowledged=True)
    m.renewed(sent_at=1.0)
    m.unanswered(now=2.0)
    assert m.tick(1.0 + TRUSTED) is LostReason.UNREACHABLE
    # A fixed lease at its local end.
    m = machine(renewal=Renewal.FIXED)
    assert m.tick(TRUSTED) is LostReason.LEASE_ENDED and m.take_abandon()
    # An EPHEMERAL hold whose master a failover replaced: the new master has it, unbound.
    m = machine()
    assert m.master_replaced() is LostReason.CONNECTION_CLOSED and m.take_abandon()
    assert m.master_replaced() is None and not m.take_abandon()  # lost already: nothing
    # Released, then time passes: nothing.
    m = machine()
    m.release_requested()
    assert m.tick(1e9) is None and m.master_replaced() is None and not m.take_abandon()


class Reference:
    """What the rules say, kept the simplest way: every confirmed send, the first evidence."""

    def __init__(self, sent: float, replied: float, fixed: bool) -> None:
        self.fixed = fixed
        self.needs_confirmation = replied - sent >= INTERVAL
        self.bounds = [sent + TRUSTED]  # every send whose reply set or showed the lease
        self.evidence: Optional[LostReason] = None
        self.released = False
        self.confirmed = not self.needs_confirmation
        self.unacked = False  # the last renewal answered, not acknowledged

    @property
    def deadline(self) -> float:
        return max(self.bounds)

    def alive(self) -> bool:
        return self.evidence is None and not self.released


class HoldRules(RuleBasedStateMachine):
    @initialize(
        sent=st.floats(0, 100),
        wait=st.floats(0, 3 * LEASE),
        fixed=st.booleans(),
    )
    def grant(self, sent: float, wait: float, fixed: bool) -> None:
        self.now = sent + wait
        self.m = machine(sent, self.now, Renewal.FIXED if fixed else Renewal.WATCHDOG)
        self.ref = Reference(sent, self.now, fixed)
        self.history: list[tuple[Phase, Optional[LostReason]]] = []

    def _final(self) -> bool:
        return self.m.phase in (Phase.LOST, Phase.RELEASED, Phase.RELEASING)

    @rule(dt=st.floats(0, LEASE))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        reported = self.m.tick(self.now)
        if reported is not None:  # rule 2: the backstop only past the evidence's bound
            assert self.ref.alive() and self.ref.confirmed
            assert self.now >= self.ref.deadline
            want = (LostReason.LEASE_ENDED if self.ref.fixed
                    else LostReason.UNREPLICATED if self.ref.unacked else LostReason.UNREACHABLE)
            assert reported is want
            self.ref.evidence = reported
            assert self.m.take_abandon()  # rule 4: the server may still have it
        elif self.ref.alive() and self.ref.confirmed:
            assert self.now < self.ref.deadline

    @rule(age=st.floats(0, LEASE), ttl=st.floats(0, LEASE))
    def confirmation(self, age: float, ttl: float) -> None:
        sent = self.now - age
        self.m.confirmed(sent, ttl if self.ref.fixed else None)
        if self.ref.alive():
            if self.ref.fixed and not self.ref.confirmed:
                # The confirmation of a grant by a read: the read alone (as in Rust).
                self.ref.bounds = [sent + ttl - LEASE * DRIFT]
            else:
                self.ref.bounds.append(sent + ttl - LEASE * DRIFT if self.ref.fixed
                                       else sent + TRUSTED)
            self.ref.confirmed = True
            self.ref.unacked = self.ref.unacked and self.ref.fixed

    @rule(age=st.floats(0, LEASE))
    def renewal_answered_1(self, age: float) -> None:
        sent = self.now - age
        self.m.renewed(sent)  # (the watchdog never sends one for a fixed lease; if it did, the
        # server would have set the lease all the same)
        if self.ref.alive() and self.ref.confirmed:
            self.ref.bounds.append(sent + TRUSTED)
            self.ref.unacked = False

    @rule(age=st.floats(0, LEASE))
    def reentry(self, age: float) -> None:
        sent = self.now - age
        self.m.reentered(sent)
        if self.ref.alive() and self.ref.confirmed:
            self.ref.bounds.append(sent + TRUSTED)

    @rule(unacknowledged=st.booleans())
    def renewal_unanswered(self, unacknowledged: bool) -> None:
        self.m.unanswered(self.now, unacknowledged)
        if self.ref.alive() and self.ref.confirmed:
            self.ref.unacked = unacknowledged

    @rule()
    def master_replaced(self) -> None:
        got = self.m.master_replaced()
        if self.ref.alive():
            assert got is LostReason.CONNECTION_CLOSED and self.m.take_abandon()
            self.ref.evidence = got
        else:
            assert got is None and not self.m.take_abandon()

    @rule(
        event=st.sampled_from(
            ["refused", "connection", "checked-gone", "checked-there", "fenced", "not-current"]
        ),
    )
    def evidence(self, event: str) -> None:
        if event == "refused":
            got, want = self.m.refused(), LostReason.HOLD_GONE
        elif event == "connection":
            got, want = self.m.connection_lost(), LostReason.CONNECTION_CLOSED
        elif event == "fenced":
            got, want = self.m.fenced(LostReason.HOLD_GONE), LostReason.HOLD_GONE
        elif event == "not-current":
            got, want = self.m.fenced(LostReason.TOKEN_NOT_CURRENT), LostReason.TOKEN_NOT_CURRENT
        elif event == "checked-gone":
            got, want = self.m.checked(False, LostReason.DELETED), LostReason.DELETED
        else:
            got, want = self.m.checked(True, LostReason.DELETED), None
        if self.ref.alive() and want is not None:
            assert got is want
            self.ref.evidence = want
        else:
            assert got is None
        assert not self.m.take_abandon()  # the server said so: nothing to release

    @rule(
        db=st.sampled_from([DB, 1]),
        key=st.sampled_from([KEY, b"{k}"]),
        owner=st.sampled_from([OWNER, b"other"]),
        token=st.sampled_from([TOKEN, 0, 43]),
        reason=st.sampled_from([LostReason.DELETED, LostReason.FORCE_RELEASED]),
    )
    def signal(self, db: int, key: bytes, owner: bytes, token: int, reason: LostReason) -> None:
        # A message is never evidence: it only says whether it names this hold (then the shell
        # checks), and changes nothing.
        named = self.m.names(HoldEnded(reason, db, token, key, owner))
        assert named == ((db, key, owner, token) == (DB, KEY, OWNER, TOKEN))

    @rule()
    def release(self) -> None:
        error = self.m.release_requested()
        if self.ref.alive():
            assert error is None
            self.ref.released = True
        else:
            assert isinstance(error, NotHeld) and error.reason is self.ref.evidence

    @invariant()
    def the_rules_hold(self) -> None:
        if not hasattr(self, "m"):
            return
        m, ref = self.m, self.ref
        # Rule 1: held only after the grant and, after a long wait, its confirmation.
        if m.phase is Phase.HELD:
            assert ref.confirmed and ref.alive()
            assert m.deadline == ref.deadline  # only confirmed sends move it
        if m.phase is Phase.CONFIRMING:
            assert not ref.confirmed and ref.alive() and m.next_wake() is None
        # Rule 2: the reason is the first evidence.
        assert m.reason is ref.evidence
        assert (m.phase is Phase.LOST) == (ref.evidence is not None)
        # Rule 3: after lost or released nothing renews, nothing changes.
        if self._final():
            assert m.next_wake() is None and not m.renewal_due(float("inf"))
            if self.history and self.history[-1][0] in (Phase.LOST, Phase.RELEASING):
                assert (m.phase, m.reason) == self.history[-1]
        self.history.append((m.phase, m.reason))


HoldRules.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_the_hold_machine_follows_the_rules = HoldRules.TestCase
