"""The hold's state machine (redis_lock_client/_lifecycle.py), no server, driven only through
``step``: table cases for each rule, and a model-based test (hypothesis) that drives random
event sequences against a tiny reference model and checks the rules after every step. (The
shared scenarios of clients/vectors/hold-machine.tsv are run by test_vectors.py.)"""

from __future__ import annotations

from typing import Optional

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from redis_lock_client import LostReason, Renewal
from redis_lock_client._lifecycle import (
    DRIFT,
    Actions,
    Answer,
    Answered,
    CheckRead,
    ConnectionLost,
    Fenced,
    Granted,
    HoldMachine,
    Holds,
    MasterReplaced,
    Phase,
    Read,
    Reentered,
    Refusal,
    ReleaseReplied,
    ReleaseRequested,
    Replaced,
    Signal,
    Tick,
)
from redis_lock_client._messages import HoldEnded

LEASE = 3.0
TRUSTED = LEASE - LEASE * DRIFT
INTERVAL = LEASE / 3
KEY, OWNER, TOKEN, DB = b"k", b"me", 42, 0


def machine(sent: float = 0.0, replied: float = 0.0, renewal: Renewal = Renewal.WATCHDOG,
            ephemeral: bool = False) -> tuple[HoldMachine, Actions]:
    m = HoldMachine(db=DB, owner=OWNER, tokens={KEY: TOKEN}, lease=LEASE, renewal=renewal,
                    ephemeral=ephemeral)
    return m, m.step(Granted(sent, replied))


def renewal(sent: float, answer: Holds | Answer = Holds(), replied: Optional[float] = None) -> Answered:
    return Answered(Read.RENEWAL, sent, sent if replied is None else replied, answer)


def check(answer: Holds | Answer, reason: LostReason = LostReason.DELETED, at: float = 0.0) -> Answered:
    return Answered(CheckRead(reason), at, at, answer)


def test_a_grant_after_a_short_wait_is_held_until_its_send_time_plus_the_trusted_lease():
    m, out = machine(sent=10.0, replied=10.5)
    assert out.deliver and not out.renew and m.phase is Phase.HELD
    assert m.deadline == 10.0 + TRUSTED and out.wake == 10.0 + INTERVAL
    assert m.step(Tick(10.0 + TRUSTED - 0.001)).lost is None
    out = m.step(Tick(10.0 + TRUSTED))
    assert out.lost is LostReason.UNREACHABLE and out.abandon and out.wake is None


def test_a_grant_after_a_long_wait_needs_a_confirmation_and_time_alone_never_loses_it():
    m, out = machine(sent=0.0, replied=2 * LEASE)  # waited two leases
    assert m.phase is Phase.CONFIRMING and out.renew and not out.deliver
    out = m.step(Tick(100.0))
    assert out.lost is None and m.active  # no evidence of a loss
    assert out.wake is None  # the watchdog does not run before the confirmation
    out = m.step(renewal(2 * LEASE))
    assert out.deliver and m.phase is Phase.HELD
    assert m.deadline == 2 * LEASE + TRUSTED and out.wake == 2 * LEASE + INTERVAL


def test_a_confirmation_with_no_answer_is_sent_again_then_the_grant_is_refused():
    m, out = machine(sent=0.0, replied=2 * LEASE)
    for _ in range(2):
        out = m.step(renewal(2 * LEASE, Answer.NOTHING))
        assert out.renew and m.phase is Phase.CONFIRMING
    out = m.step(renewal(2 * LEASE, Answer.NOTHING))
    # The server may have it: released in the background.
    assert out.refuse is Refusal.UNANSWERED and m.phase is Phase.REFUSED and out.abandon
    # EPHEMERAL: sent again too (the connection may be alive); refused once the connection
    # fails (and a replica's copy released).
    m, out = machine(sent=0.0, replied=2 * LEASE, ephemeral=True)
    out = m.step(renewal(2 * LEASE, Answer.NOTHING))
    assert out.renew and out.refuse is None
    out = m.step(ConnectionLost())
    assert out.refuse is Refusal.GONE and m.reason is LostReason.CONNECTION_CLOSED
    assert out.abandon
    # Found gone: nothing to release.
    m, out = machine(sent=0.0, replied=2 * LEASE)
    out = m.step(renewal(2 * LEASE, Answer.GONE))
    assert out.refuse is Refusal.GONE and not out.abandon and not out.release


def test_a_fixed_lease_after_a_long_wait_is_confirmed_by_a_read_of_its_lease_left():
    m, out = machine(sent=0.0, replied=2 * LEASE, renewal=Renewal.FIXED)
    assert out.read_lease and not out.renew
    out = m.step(Answered(Read.LEASE_LEFT, 6.0, 6.0, Holds(2.5)))
    assert out.deliver and m.phase is Phase.HELD and m.deadline == 6.0 + 2.5 - LEASE * DRIFT
    assert out.wake == m.deadline and not m.step(Tick(m.deadline - 0.001)).renew
    assert m.step(Tick(m.deadline)).lost is LostReason.LEASE_ENDED
    # A read that shows no lease on the server: nothing ends it locally.
    m, out = machine(sent=0.0, replied=2 * LEASE, renewal=Renewal.FIXED)
    m.step(Answered(Read.LEASE_LEFT, 6.0, 6.0, Holds(float("inf"))))
    assert m.phase is Phase.HELD and m.step(Tick(1e9)).lost is None


def test_the_deadline_moves_only_on_confirmed_renewals_from_their_send_time():
    m, _ = machine()
    out = m.step(renewal(2.0))
    assert m.deadline == 2.0 + TRUSTED and out.wake == 2.0 + INTERVAL
    m.step(renewal(1.0))  # an older renewal answered late: the deadline does not go back
    assert m.deadline == 2.0 + TRUSTED
    out = m.step(renewal(3.0, Answer.NOTHING, replied=3.5))  # no answer: again soon
    assert m.deadline == 2.0 + TRUSTED and out.wake == 3.5 + 0.1


def test_one_renewal_at_a_time_and_meanwhile_the_wake_is_the_deadline():
    m, _ = machine()
    out = m.step(Tick(INTERVAL))
    assert out.renew and out.wake == TRUSTED
    # Its answer sets the next renewal; until then the renewal time passed stays passed.
    assert not m.step(Tick(INTERVAL + 0.1)).renew
    out = m.step(renewal(INTERVAL))
    assert out.wake == 2 * INTERVAL
    fixed, out = machine(renewal=Renewal.FIXED)
    assert out.wake == TRUSTED and not fixed.step(Tick(INTERVAL)).renew


def test_lost_only_on_evidence_and_nothing_changes_after():
    for event, reason in [
        (renewal(1.0, Answer.GONE), LostReason.HOLD_GONE),
        (Replaced(), LostReason.HOLD_GONE),
        (check(Answer.GONE, LostReason.FLUSHED), LostReason.FLUSHED),
        (check(Answer.GONE, LostReason.EXPIRED), LostReason.EXPIRED),
        (Fenced(LostReason.HOLD_GONE), LostReason.HOLD_GONE),
        (Fenced(LostReason.TOKEN_NOT_CURRENT), LostReason.TOKEN_NOT_CURRENT),
    ]:
        m, _ = machine()
        out = m.step(event)
        assert out.lost is reason and m.phase is Phase.LOST and m.reason is reason
        # The server said so (or ends it itself): nothing to release.
        assert not out.abandon and out.wake is None
        # A late renewal, another check, the deadline, a release: nothing changes.
        for later in [renewal(1.0), renewal(1.0, Answer.GONE), Tick(1e9),
                      check(Answer.GONE), ReleaseRequested()]:
            out = m.step(later)
            assert out.lost is None and not out.abandon and not out.release and not out.renew
        assert m.phase is Phase.LOST and m.reason is reason
    m, _ = machine()
    assert m.step(check(Holds())).lost is None and m.active  # found: nothing


def test_an_ephemeral_hold_whose_connection_closed_is_lost_once_a_read_finds_it_gone():
    m, _ = machine(ephemeral=True)
    out = m.step(ConnectionLost())
    assert out.check is not None and out.check.until_gone and out.lost is None and m.active
    assert m.step(ConnectionLost()).check is None  # asked once
    out = m.step(check(Answer.GONE, LostReason.CONNECTION_CLOSED))
    assert out.lost is LostReason.CONNECTION_CLOSED and not out.abandon
    # Not EPHEMERAL: nothing to do with a connection.
    m, _ = machine()
    assert m.step(ConnectionLost()).check is None and m.active


def test_after_a_release_nothing_renews_and_nothing_is_reported():
    m, _ = machine()
    out = m.step(ReleaseRequested())
    assert out.release and m.phase is Phase.RELEASING and out.wake is None
    assert not m.step(Tick(1e9)).renew
    out = m.step(check(Answer.GONE))
    assert out.lost is None and not out.abandon
    m.step(ReleaseReplied())
    assert m.phase is Phase.RELEASED
    assert not m.step(ReleaseRequested()).release


def test_a_message_asks_for_a_check_and_a_renewal_answered_0_meanwhile_gives_its_reason():
    # A message naming the hold is a hint; the read it asks for and a renewal race. When the
    # renewal answers 0 first, the server confirmed the loss and the message says why.
    m, _ = machine()
    out = m.step(Signal(HoldEnded(LostReason.FORCE_RELEASED, DB, TOKEN, KEY, OWNER)))
    assert out.check is not None and out.check.named and m.active  # a hint changes nothing
    assert m.step(renewal(1.0, Answer.GONE)).lost is LostReason.FORCE_RELEASED
    # A check that found the hold voids the hint: a later 0 is only HOLD_GONE.
    m, _ = machine()
    m.step(Signal(HoldEnded(LostReason.FORCE_RELEASED, DB, TOKEN, KEY, OWNER)))
    assert m.step(check(Holds(), LostReason.FORCE_RELEASED)).lost is None
    assert m.step(renewal(1.0, Answer.GONE)).lost is LostReason.HOLD_GONE
    # A message about another hold asks nothing.
    m, _ = machine()
    assert m.step(Signal(HoldEnded(LostReason.DELETED, DB, TOKEN + 1, KEY, OWNER))).check is None


def test_a_loss_the_server_may_not_know_of_asks_for_the_release():
    # No renewal confirmed for a lease: unreachable, released in the background.
    m, _ = machine()
    m.step(renewal(0.5, Answer.NOTHING, replied=1.0))
    out = m.step(Tick(TRUSTED))
    assert out.lost is LostReason.UNREACHABLE and out.abandon
    assert not m.step(Tick(TRUSTED + 1)).abandon  # asked once
    # The master answered the last renewal, the replicas did not acknowledge it: unreplicated.
    m, _ = machine()
    m.step(renewal(0.5, Answer.UNACKNOWLEDGED, replied=1.0))
    out = m.step(Tick(TRUSTED))
    assert out.lost is LostReason.UNREPLICATED and out.abandon
    # An acknowledged renewal (or one with no answer) after it: unreachable again.
    m, _ = machine()
    m.step(renewal(0.5, Answer.UNACKNOWLEDGED, replied=1.0))
    m.step(renewal(1.0))
    m.step(renewal(1.5, Answer.NOTHING, replied=2.0))
    assert m.step(Tick(1.0 + TRUSTED)).lost is LostReason.UNREACHABLE
    # A fixed lease at its local end.
    m, _ = machine(renewal=Renewal.FIXED)
    out = m.step(Tick(TRUSTED))
    assert out.lost is LostReason.LEASE_ENDED and out.abandon
    # An EPHEMERAL hold whose master a failover replaced: the new master has it, unbound.
    m, _ = machine(ephemeral=True)
    out = m.step(MasterReplaced())
    assert out.lost is LostReason.CONNECTION_CLOSED and out.abandon
    out = m.step(MasterReplaced())
    assert out.lost is None and not out.abandon  # lost already: nothing
    # The ACL refused a renewal: this side cannot keep it.
    m, _ = machine()
    out = m.step(renewal(1.0, Answer.REFUSED))
    assert out.lost is LostReason.NO_PERMISSION and out.abandon
    # Released, then time passes: nothing.
    m, _ = machine(ephemeral=True)
    m.step(ReleaseRequested())
    assert not m.step(Tick(1e9)).abandon and not m.step(MasterReplaced()).abandon


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
        #: The reason of a message naming the hold that no check has answered present.
        self.hint: Optional[LostReason] = None

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
        self.m, self.out = machine(sent, self.now, Renewal.FIXED if fixed else Renewal.WATCHDOG)
        self.ref = Reference(sent, self.now, fixed)
        self.history: list[tuple[Phase, Optional[LostReason]]] = []

    def _final(self) -> bool:
        return self.m.phase in (Phase.LOST, Phase.RELEASED, Phase.RELEASING)

    def _held(self) -> bool:
        return self.ref.alive() and self.ref.confirmed

    @rule(dt=st.floats(0, LEASE))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.out = self.m.step(Tick(self.now))
        reported = self.out.lost
        if reported is not None:  # rule 3: the backstop only past the evidence's bound
            assert self._held()
            assert self.now >= self.ref.deadline
            want = (LostReason.LEASE_ENDED if self.ref.fixed
                    else LostReason.UNREPLICATED if self.ref.unacked else LostReason.UNREACHABLE)
            assert reported is want
            self.ref.evidence = reported
            assert self.out.abandon  # rule 5: the server may still have it
        elif self._held():
            assert self.now < self.ref.deadline

    @rule(age=st.floats(0, LEASE), ttl=st.floats(0, LEASE))
    def confirmation(self, age: float, ttl: float) -> None:
        sent = self.now - age
        if self.ref.fixed:
            event = Answered(Read.LEASE_LEFT, sent, self.now, Holds(ttl))
        else:
            event = renewal(sent, replied=self.now)
        self.out = self.m.step(event)
        if self.ref.alive() and not self.ref.confirmed:
            # The confirmation of a grant: the read (or renewal) alone, as in Rust.
            self.ref.bounds = [sent + max(ttl - LEASE * DRIFT, 0.0) if self.ref.fixed
                               else sent + TRUSTED]
            self.ref.confirmed = True
            assert self.out.deliver
        elif self._held() and not self.ref.fixed:
            # (A read of the lease left says nothing once held: only a confirmation's does.)
            self.ref.bounds.append(sent + TRUSTED)
            self.ref.unacked = False

    @rule(age=st.floats(0, LEASE))
    def renewal_answered_1(self, age: float) -> None:
        sent = self.now - age
        self.out = self.m.step(renewal(sent, replied=self.now))
        if self.ref.alive() and not self.ref.confirmed:
            self.ref.bounds = [sent + TRUSTED]
            self.ref.confirmed = True
        elif self._held():
            # (The watchdog never sends one for a fixed lease; if it did, the server would
            # have set the lease all the same.)
            self.ref.bounds.append(sent + TRUSTED)
            self.ref.unacked = False

    @rule(age=st.floats(0, LEASE))
    def reentry(self, age: float) -> None:
        sent = self.now - age
        self.out = self.m.step(Reentered(sent))
        if self._held():
            self.ref.bounds.append(sent + TRUSTED)

    @rule(unacknowledged=st.booleans())
    def renewal_unanswered(self, unacknowledged: bool) -> None:
        if not self.ref.confirmed:
            return  # (a confirmation with no answer is sent again: another test)
        answer = Answer.UNACKNOWLEDGED if unacknowledged else Answer.NOTHING
        self.out = self.m.step(renewal(self.now, answer))
        if self._held():
            self.ref.unacked = unacknowledged

    @rule(
        event=st.sampled_from(
            ["replaced", "checked-gone", "checked-there", "fenced", "not-current"]
        ),
    )
    def evidence(self, event: str) -> None:
        want: Optional[LostReason]
        if event == "replaced":
            # The server says it is gone: a message's reason not yet checked says why.
            self.out, want = self.m.step(Replaced()), self.ref.hint or LostReason.HOLD_GONE
        elif event == "fenced":
            self.out, want = self.m.step(Fenced(LostReason.HOLD_GONE)), LostReason.HOLD_GONE
        elif event == "not-current":
            self.out = self.m.step(Fenced(LostReason.TOKEN_NOT_CURRENT))
            want = LostReason.TOKEN_NOT_CURRENT
        elif event == "checked-gone":
            self.out, want = self.m.step(check(Answer.GONE)), LostReason.DELETED
        else:
            self.out, want = self.m.step(check(Holds())), None
            if self.ref.alive():
                self.ref.hint = None
        if self._held() and want is not None:
            assert self.out.lost is want
            self.ref.evidence = want
        else:
            assert self.out.lost is None
        assert not self.out.abandon  # the server said so: nothing to release

    @rule(
        db=st.sampled_from([DB, 1]),
        key=st.sampled_from([KEY, b"{k}"]),
        owner=st.sampled_from([OWNER, b"other"]),
        token=st.sampled_from([TOKEN, 0, 43]),
        reason=st.sampled_from([LostReason.DELETED, LostReason.FORCE_RELEASED]),
    )
    def signal(self, db: int, key: bytes, owner: bytes, token: int, reason: LostReason) -> None:
        # A message is never evidence: one naming this hold, while held, asks for a check;
        # nothing changes.
        self.out = self.m.step(Signal(HoldEnded(reason, db, token, key, owner)))
        named = (db, key, owner, token) == (DB, KEY, OWNER, TOKEN)
        if named and self.ref.alive():
            self.ref.hint = reason
        assert (self.out.check is not None) == (named and self._held())
        assert self.out.lost is None and not self.out.abandon

    @rule()
    def release(self) -> None:
        self.out = self.m.step(ReleaseRequested())
        if self._held():
            assert self.out.release
            self.ref.released = True
        else:
            assert not self.out.release

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
            assert not ref.confirmed and ref.alive() and self.out.wake is None
        # Rule 3: the reason is the first evidence.
        assert (m.reason if m.phase is Phase.LOST else None) is ref.evidence
        # Rule 4: after lost or released nothing renews, nothing changes.
        if self._final():
            assert self.out.wake is None and not self.out.renew
            if self.history and self.history[-1][0] in (Phase.LOST, Phase.RELEASING):
                assert (m.phase, m.reason) == self.history[-1]
        self.history.append((m.phase, m.reason))


HoldRules.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_the_hold_machine_follows_the_rules = HoldRules.TestCase
