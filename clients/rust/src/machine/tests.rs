//! The machine's rules, one table-driven test each, with an injected clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;

const LEASE: Duration = Duration::from_millis(3_000);

fn identity() -> Identity {
    Identity {
        db: 0,
        keys: vec![Arc::from(&b"k"[..]), Arc::from(&b"{k}:2"[..])].into(),
        owner: "me:1".into(),
        tokens: vec![7, 9].into(),
    }
}

fn terms(renewal: Renewal, binding: Binding) -> Terms {
    Terms {
        lease: LEASE,
        renewal,
        binding,
        form: Form::Many,
        acknowledged: false,
    }
}

fn ms(base: Instant, n: u64) -> Instant {
    base + Duration::from_millis(n)
}

/// A machine granted at `base` after a wait of `wait_ms`.
fn granted(renewal: Renewal, binding: Binding, base: Instant, wait_ms: u64) -> (Machine, Actions) {
    let mut m = Machine::new(identity(), terms(renewal, binding));
    let out = m.step(Event::Granted {
        sent: base,
        replied: ms(base, wait_ms),
    });
    (m, out)
}

fn answered(read: Read, sent: Instant, answer: Answer) -> Event<'static> {
    Event::Answered {
        read,
        sent,
        replied: sent + Duration::from_millis(1),
        answer,
    }
}

#[test]
fn a_short_wait_is_held_at_once_until_the_send_time_plus_the_lease() {
    let base = Instant::now();
    let (m, out) = granted(Renewal::Watchdog, Binding::Lease, base, 10);
    assert!(out.deliver);
    assert!(!out.renew);
    assert_eq!(m.status(), Status::Active);
    // The bound counts from the send, minus a tenth of the lease.
    assert_eq!(m.deadline(), Some(ms(base, 2_700)));
    // Woken for the first renewal, a third of a lease after the send.
    assert_eq!(out.wake, Some(Wake::At(ms(base, 1_000))));
}

#[test]
fn a_long_wait_is_confirmed_before_the_guard_is_handed_out() {
    // (renewal, the confirmation asked for)
    let cases = [
        (Renewal::Watchdog, Read::Renewal),
        (Renewal::Fixed, Read::LeaseLeft),
    ];
    for (renewal, read) in cases {
        let base = Instant::now();
        // Waited 2.9 s of a 3 s lease: the send time's bound is nearly spent.
        let (mut m, out) = granted(renewal, Binding::Lease, base, 2_900);
        assert!(!out.deliver, "{renewal:?}: handed out unconfirmed");
        assert_eq!(out.renew, read == Read::Renewal);
        assert_eq!(out.read_lease, read == Read::LeaseLeft);
        // Time passing while the confirmation is out reports nothing.
        let tick = m.step(Event::Tick {
            now: ms(base, 3_500),
        });
        assert_eq!(tick, Actions::default());
        assert_eq!(m.status(), Status::Active);
        // The confirmation sent at 2.901 s: held from its send time.
        let left = match read {
            Read::Renewal => LEASE,
            _ => Duration::from_millis(2_990),
        };
        let out = m.step(answered(read, ms(base, 2_901), Answer::Holds(Some(left))));
        assert!(out.deliver);
        assert_eq!(m.deadline(), Some(ms(base, 2_901) + left - LEASE / 10));
    }
}

#[test]
fn a_message_naming_a_grant_being_confirmed_leaves_the_confirmation_to_decide() {
    let base = Instant::now();
    let named = LostSignal::parse(b"forcereleased 0 7 1 k me:1").unwrap();
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 2_000);
    assert_eq!(m.step(Event::Signal(&named)), Actions::default());
    assert_eq!(m.state(), State::Confirming { attempts: 1 });
    let out = m.step(answered(
        Read::Renewal,
        ms(base, 2_001),
        Answer::Holds(None),
    ));
    assert!(out.deliver && out.refuse.is_none());
}

#[test]
fn a_confirmation_that_finds_the_hold_gone_or_unanswered_refuses_the_acquire() {
    let base = Instant::now();
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 2_000);
    let out = m.step(answered(Read::Renewal, ms(base, 2_001), Answer::Gone));
    assert_eq!(out.refuse, Some(Refusal::Gone(LostReason::HoldGone)));
    assert_eq!(m.state(), State::Refused);

    // Unanswered: sent again, then given up on after three.
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 2_000);
    for attempt in 1..=3 {
        let out = m.step(answered(
            Read::Renewal,
            ms(base, 2_000 + attempt),
            Answer::Nothing,
        ));
        if attempt < 3 {
            assert!(out.renew && out.refuse.is_none(), "attempt {attempt}");
        } else {
            assert_eq!(out.refuse, Some(Refusal::Unanswered));
        }
    }
    // Bound to its connection: no answer is sent again too (the connection may be alive);
    // the connection failing refuses it, and its copy on a replica is released.
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Connection, base, 2_000);
    let out = m.step(answered(Read::Renewal, ms(base, 2_001), Answer::Nothing));
    assert!(out.renew && out.refuse.is_none());
    let out = m.step(Event::ConnectionLost);
    assert_eq!(
        out.refuse,
        Some(Refusal::Gone(LostReason::ConnectionClosed))
    );
    assert!(out.abandon);
}

#[test]
fn the_deadline_moves_only_on_evidence_from_its_send_time_and_never_back() {
    let base = Instant::now();
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 5);
    // (event, deadline after it, in ms from base)
    let cases: [(Event<'static>, u64); 6] = [
        (
            Event::Tick {
                now: ms(base, 1_000),
            },
            2_700,
        ),
        // A renewal sent at 1 s, answered: 1 s + 2.7 s.
        (
            answered(Read::Renewal, ms(base, 1_000), Answer::Holds(Some(LEASE))),
            3_700,
        ),
        // An older renewal's late answer does not move it back.
        (
            answered(Read::Renewal, ms(base, 500), Answer::Holds(Some(LEASE))),
            3_700,
        ),
        // A renewal with no answer moves nothing.
        (
            answered(Read::Renewal, ms(base, 2_000), Answer::Nothing),
            3_700,
        ),
        // A re-entry sets the lease again.
        (
            Event::Reentered {
                sent: ms(base, 2_500),
            },
            5_200,
        ),
        // A check that read 1 s left at 3 s: 3 s + 1 s - 0.3 s is earlier: kept.
        (
            answered(
                Read::Check(LostReason::Deleted),
                ms(base, 3_000),
                Answer::Holds(Some(Duration::from_secs(1))),
            ),
            5_200,
        ),
    ];
    for (event, want) in cases {
        let shown = format!("{event:?}");
        m.step(event);
        assert_eq!(m.deadline(), Some(ms(base, want)), "after {shown}");
    }
}

#[test]
fn the_watchdog_renews_one_at_a_time_when_due_and_retries_an_unanswered_one() {
    let base = Instant::now();
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 5);
    assert!(!m.step(Event::Tick { now: ms(base, 999) }).renew, "not due");
    let out = m.step(Event::Tick {
        now: ms(base, 1_000),
    });
    assert!(out.renew);
    // While it is out, the wake-up is the deadline only, and nothing more is sent.
    assert_eq!(out.wake, Some(Wake::At(ms(base, 2_700))));
    assert!(
        !m.step(Event::Tick {
            now: ms(base, 1_500)
        })
        .renew
    );
    // No answer: again 100 ms after the failure.
    let out = m.step(answered(Read::Renewal, ms(base, 1_000), Answer::Nothing));
    assert_eq!(out.wake, Some(Wake::At(ms(base, 1_101))));
    assert!(
        m.step(Event::Tick {
            now: ms(base, 1_101)
        })
        .renew
    );
    // A fixed lease never renews.
    let (mut fixed, out) = granted(Renewal::Fixed, Binding::Lease, base, 5);
    assert_eq!(out.wake, Some(Wake::At(ms(base, 2_700))));
    assert!(
        !fixed
            .step(Event::Tick {
                now: ms(base, 2_000)
            })
            .renew
    );
}

#[test]
fn the_hold_is_lost_only_on_evidence_each_with_its_reason() {
    let base = Instant::now();
    let other_db = LostSignal::parse(b"forcereleased 1 7 1 k me:1").unwrap();
    let named = LostSignal::parse(b"forcereleased 0 7 1 k me:1").unwrap();
    let named_second_key = LostSignal::parse(b"expired 0 9 5 {k}:2 me:1").unwrap();
    // (binding, event, reason or None for "still held")
    let cases: Vec<(Binding, Event<'_>, Option<LostReason>)> = vec![
        (
            Binding::Lease,
            answered(Read::Renewal, ms(base, 10), Answer::Gone),
            Some(LostReason::HoldGone),
        ),
        (
            Binding::Lease,
            answered(Read::Renewal, ms(base, 10), Answer::Nothing),
            None,
        ),
        // Bound to its connection, a renewal with no answer or the connection seen closed
        // asks for a read on another connection first (see the next test).
        (
            Binding::Connection,
            answered(Read::Renewal, ms(base, 10), Answer::Nothing),
            None,
        ),
        (Binding::Lease, Event::ConnectionLost, None),
        (Binding::Connection, Event::ConnectionLost, None),
        (
            Binding::Connection,
            answered(
                Read::Check(LostReason::ConnectionClosed),
                ms(base, 10),
                Answer::Gone,
            ),
            Some(LostReason::ConnectionClosed),
        ),
        // A message is a hint (see the next tests): it asks for a check, and only the check's
        // answer is evidence.
        (Binding::Lease, Event::Signal(&named), None),
        (Binding::Lease, Event::Signal(&named_second_key), None),
        (Binding::Lease, Event::Signal(&other_db), None),
        (
            Binding::Lease,
            answered(
                Read::Check(LostReason::ForceReleased),
                ms(base, 10),
                Answer::Gone,
            ),
            Some(LostReason::ForceReleased),
        ),
        (
            Binding::Lease,
            answered(Read::Check(LostReason::Flushed), ms(base, 10), Answer::Gone),
            Some(LostReason::Flushed),
        ),
        (
            Binding::Lease,
            answered(
                Read::Check(LostReason::Flushed),
                ms(base, 10),
                Answer::Nothing,
            ),
            None,
        ),
        (Binding::Lease, Event::Replaced, Some(LostReason::HoldGone)),
        (
            Binding::Lease,
            Event::Fenced(LostReason::HoldGone),
            Some(LostReason::HoldGone),
        ),
        (
            Binding::Connection,
            Event::Fenced(LostReason::TokenNotCurrent),
            Some(LostReason::TokenNotCurrent),
        ),
        (
            Binding::Lease,
            Event::Tick {
                now: ms(base, 2_699),
            },
            None,
        ),
        (
            Binding::Lease,
            Event::Tick {
                now: ms(base, 2_700),
            },
            Some(LostReason::Unreachable),
        ),
    ];
    for (binding, event, want) in cases {
        let (mut m, _) = granted(Renewal::Watchdog, binding, base, 5);
        let shown = format!("{binding:?} {event:?}");
        let out = m.step(event);
        match want {
            Some(reason) => {
                assert_eq!(m.status(), Status::Lost(reason), "{shown}");
                assert!(out.notify, "{shown}");
                assert_eq!(out.wake, Some(Wake::Never), "{shown}");
            }
            None => assert_eq!(m.status(), Status::Active, "{shown}"),
        }
    }
    let (mut fixed, _) = granted(Renewal::Fixed, Binding::Lease, base, 5);
    fixed.step(Event::Tick {
        now: ms(base, 2_700),
    });
    assert_eq!(fixed.status(), Status::Lost(LostReason::LeaseEnded));
}

/// An EPHEMERAL hold is reported lost with its connection only once the server no longer holds
/// it: a kill is seen by the server and the library at once, and a close of the library's own
/// reaches the server a moment later. Before, the loss was reported the moment the library saw
/// the connection close (the Rust oracle caught a report while the server still held it).
#[test]
fn a_bound_hold_whose_connection_closed_is_reported_lost_once_a_read_finds_it_gone() {
    let base = Instant::now();
    let closed = Check {
        reason: LostReason::ConnectionClosed,
        moved: false,
        until_gone: true,
    };
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Connection, base, 5);
    let out = m.step(Event::ConnectionLost);
    assert_eq!(out.check, Some(closed));
    assert!(!out.notify);
    assert_eq!(m.status(), Status::Active);
    // Asked once: more errors on the closed connection, or renewals with no answer, ask
    // nothing more while it is read.
    assert_eq!(m.step(Event::ConnectionLost).check, None);
    assert_eq!(
        m.step(answered(Read::Renewal, ms(base, 11), Answer::Nothing))
            .check,
        None
    );
    // The read finds it still there: still held, no deadline moved.
    let out = m.step(answered(
        Read::Check(LostReason::ConnectionClosed),
        ms(base, 10),
        Answer::Holds(None),
    ));
    assert_eq!((out.notify, m.status()), (false, Status::Active));
    let out = m.step(answered(
        Read::Check(LostReason::ConnectionClosed),
        ms(base, 12),
        Answer::Gone,
    ));
    assert!(out.notify);
    assert_eq!(m.status(), Status::Lost(LostReason::ConnectionClosed));

    // A renewal with no answer on the bound connection (an error, a timeout: the connection
    // may be alive) asks for one read, and renews again soon.
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Connection, base, 5);
    let out = m.step(answered(Read::Renewal, ms(base, 10), Answer::Nothing));
    assert_eq!(
        out.check,
        Some(Check {
            until_gone: false,
            ..closed
        })
    );
    assert_eq!(m.status(), Status::Active);
    // A lease-bound hold asks for no read.
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 5);
    let out = m.step(answered(Read::Renewal, ms(base, 10), Answer::Nothing));
    assert_eq!(out.check, None);
    let out = m.step(Event::ConnectionLost);
    assert_eq!(out.check, None);
}

#[test]
fn messages_that_name_the_hold_or_its_key_ask_for_a_check_and_others_are_ignored() {
    let base = Instant::now();
    // (message, the check asked for). A message naming this very hold is a hint too: anyone
    // allowed to publish on the channel can send one, so it is checked with a read.
    let cases: [(&[u8], Option<Check>); 12] = [
        (
            b"forcereleased 0 7 1 k me:1",
            Some(Check {
                reason: LostReason::ForceReleased,
                moved: false,
                until_gone: false,
            }),
        ),
        (
            b"expired 0 9 5 {k}:2 me:1",
            Some(Check {
                reason: LostReason::Expired,
                moved: false,
                until_gone: false,
            }),
        ),
        (
            b"deleted 0 * 1 k",
            Some(Check {
                reason: LostReason::Deleted,
                moved: false,
                until_gone: false,
            }),
        ),
        (
            b"evicted 0 * 5 {k}:2",
            Some(Check {
                reason: LostReason::Evicted,
                moved: false,
                until_gone: false,
            }),
        ),
        (
            b"moved 0 * 1 k",
            Some(Check {
                reason: LostReason::HoldGone,
                moved: true,
                until_gone: false,
            }),
        ),
        (
            b"flushed 0",
            Some(Check {
                reason: LostReason::Flushed,
                moved: false,
                until_gone: false,
            }),
        ),
        (
            b"flushed all",
            Some(Check {
                reason: LostReason::Flushed,
                moved: false,
                until_gone: false,
            }),
        ),
        (b"flushed 1", None),
        (b"deleted 1 * 1 k", None),
        (b"deleted 0 * 3 {k}", None),
        // Another owner's or token's hold on the key.
        (b"forcereleased 0 7 1 k you:1", None),
        (b"forcereleased 0 8 1 k me:1", None),
    ];
    for (payload, want) in cases {
        let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 5);
        let signal = LostSignal::parse(payload).unwrap();
        let out = m.step(Event::Signal(&signal));
        assert_eq!(out.check, want, "{}", String::from_utf8_lossy(payload));
        assert_eq!(m.status(), Status::Active);
    }
}

#[test]
fn after_a_release_or_a_loss_nothing_renews_and_nothing_changes() {
    let base = Instant::now();
    let named = LostSignal::parse(b"deleted 0 7 1 k me:1").unwrap();
    let late: Vec<Event<'_>> = vec![
        Event::Tick {
            now: ms(base, 1_000),
        },
        Event::Tick {
            now: ms(base, 9_000),
        },
        answered(Read::Renewal, ms(base, 900), Answer::Holds(Some(LEASE))),
        answered(Read::Renewal, ms(base, 900), Answer::Gone),
        Event::Signal(&named),
        Event::ConnectionLost,
        Event::Reentered { sent: ms(base, 5) },
        Event::Replaced,
        Event::Fenced(LostReason::TokenNotCurrent),
    ];
    // Released.
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Connection, base, 5);
    let out = m.step(Event::ReleaseRequested);
    assert!(out.release && out.notify);
    assert_eq!(out.wake, Some(Wake::Never));
    m.step(Event::ReleaseReplied);
    assert_eq!(m.state(), State::Released);
    for event in late.iter().cloned() {
        assert_eq!(m.step(event), Actions::default());
        assert_eq!(m.state(), State::Released);
    }
    // Lost: a multi-key hold's release is still sent (its other keys); one key's is not.
    for (form, sends) in [(Form::Many, true), (Form::One, false)] {
        let mut m = Machine::new(
            identity(),
            Terms {
                form,
                ..terms(Renewal::Watchdog, Binding::Lease)
            },
        );
        m.step(Event::Granted {
            sent: base,
            replied: base,
        });
        m.step(Event::Replaced);
        for event in late.iter().cloned() {
            assert!(!m.step(event).renew);
            assert_eq!(m.status(), Status::Lost(LostReason::HoldGone));
        }
        assert_eq!(m.step(Event::ReleaseRequested).release, sends, "{form:?}");
        assert_eq!(m.status(), Status::Lost(LostReason::HoldGone));
    }
}

#[test]
fn acknowledged_grants_are_always_confirmed_and_unacknowledged_ones_refused_and_released() {
    for renewal in [Renewal::Watchdog, Renewal::Fixed] {
        let base = Instant::now();
        let terms = Terms {
            acknowledged: true,
            ..terms(renewal, Binding::Lease)
        };
        // A grant at once (5 ms): still confirmed, by a renewal (also for a fixed lease).
        let mut m = Machine::new(identity(), terms);
        let out = m.step(Event::Granted {
            sent: base,
            replied: ms(base, 5),
        });
        assert!(!out.deliver && out.renew && !out.read_lease, "{renewal:?}");
        let out = m.step(answered(Read::Renewal, ms(base, 6), Answer::Unacknowledged));
        assert_eq!(out.refuse, Some(Refusal::Unacknowledged));
        assert!(out.release, "the unacknowledged hold is released");
        assert_eq!(m.status(), Status::Released);
        // Acknowledged: held from the confirmation's send.
        let mut m = Machine::new(identity(), terms);
        m.step(Event::Granted {
            sent: base,
            replied: ms(base, 5),
        });
        let out = m.step(answered(
            Read::Renewal,
            ms(base, 6),
            Answer::Holds(Some(LEASE)),
        ));
        assert!(out.deliver);
        assert_eq!(m.deadline(), Some(ms(base, 2_706)));
    }
}

#[test]
fn only_acknowledged_renewals_move_the_deadline() {
    let base = Instant::now();
    let terms = Terms {
        acknowledged: true,
        ..terms(Renewal::Watchdog, Binding::Connection)
    };
    let mut m = Machine::new(identity(), terms);
    m.step(Event::Granted {
        sent: base,
        replied: base,
    });
    m.step(answered(Read::Renewal, base, Answer::Holds(Some(LEASE))));
    assert_eq!(m.deadline(), Some(ms(base, 2_700)));
    // Renewed on the master, unacknowledged: the deadline stays (and the hold, bound to its
    // connection, is not taken for lost), and the next renewal comes soon.
    let out = m.step(answered(
        Read::Renewal,
        ms(base, 1_000),
        Answer::Unacknowledged,
    ));
    assert_eq!(m.deadline(), Some(ms(base, 2_700)));
    assert_eq!(m.status(), Status::Active);
    assert_eq!(out.wake, Some(Wake::At(ms(base, 1_101))));
    // A re-entry is no acknowledgement either.
    m.step(Event::Reentered {
        sent: ms(base, 1_500),
    });
    assert_eq!(m.deadline(), Some(ms(base, 2_700)));
    // Unacknowledged until the deadline: lost for its own reason (the master answered; the
    // replicas did not), and released, since the master still holds it.
    let out = m.step(Event::Tick {
        now: ms(base, 2_700),
    });
    assert_eq!(m.status(), Status::Lost(LostReason::Unreplicated));
    assert!(out.abandon);
}

#[test]
fn a_loss_the_server_may_not_know_of_asks_for_the_release_and_one_it_told_does_not() {
    let base = Instant::now();
    let held = |binding| {
        let mut m = Machine::new(identity(), terms(Renewal::Watchdog, binding));
        m.step(Event::Granted {
            sent: base,
            replied: base,
        });
        m
    };
    // No renewal answered for a lease: unreachable, and released in the background.
    let mut m = held(Binding::Lease);
    m.step(answered(Read::Renewal, ms(base, 1_000), Answer::Nothing));
    let out = m.step(Event::Tick {
        now: ms(base, 2_700),
    });
    assert_eq!(m.status(), Status::Lost(LostReason::Unreachable));
    assert!(out.abandon);
    // An EPHEMERAL hold whose master was replaced: the new master has it, bound to nothing.
    let mut m = held(Binding::Connection);
    let out = m.step(Event::MasterReplaced);
    assert_eq!(m.status(), Status::Lost(LostReason::ConnectionClosed));
    assert!(out.abandon);
    // The server said it is gone: nothing to release.
    let mut m = held(Binding::Lease);
    let out = m.step(answered(Read::Renewal, ms(base, 1_000), Answer::Gone));
    assert_eq!(m.status(), Status::Lost(LostReason::HoldGone));
    assert!(!out.abandon);
    let mut m = held(Binding::Lease);
    let out = m.step(Event::Fenced(LostReason::TokenNotCurrent));
    assert!(!out.abandon);
}

#[test]
fn an_unbound_hold_is_a_lease_from_then_on() {
    let base = Instant::now();
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Connection, base, 5);
    assert_eq!(m.binding(), Binding::Connection);
    let out = m.step(Event::Unbound);
    assert_eq!(out, Actions::default());
    assert_eq!(m.binding(), Binding::Lease);
    // Its old connection closing, or a renewal unanswered, no longer ends it.
    m.step(Event::ConnectionLost);
    m.step(answered(Read::Renewal, ms(base, 1_000), Answer::Nothing));
    assert_eq!(m.status(), Status::Active);
    // Before the grant is handed out nothing unbinds.
    let mut m = Machine::new(identity(), terms(Renewal::Watchdog, Binding::Connection));
    m.step(Event::Unbound);
    assert_eq!(m.binding(), Binding::Connection);
}

#[test]
fn a_read_the_acl_refuses_ends_the_hold_at_once_and_never_as_unreachable() {
    let base = Instant::now();
    // Held: a renewal or a check refused (NOPERM) ends it at once, released in the background;
    // the deadline never gets to say UNREACHABLE.
    for read in [Read::Renewal, Read::Check(LostReason::Deleted)] {
        let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 10);
        let out = m.step(answered(read, ms(base, 1_000), Answer::Refused));
        assert_eq!(
            m.status(),
            Status::Lost(LostReason::NoPermission),
            "{read:?}"
        );
        assert!(out.abandon && out.notify, "{read:?}");
        assert_eq!(out.wake, Some(Wake::Never), "{read:?}");
        let later = m.step(Event::Tick {
            now: ms(base, 10_000),
        });
        assert_eq!(later, Actions::default(), "{read:?}");
        assert_eq!(
            m.status(),
            Status::Lost(LostReason::NoPermission),
            "{read:?}"
        );
    }
    // Being confirmed: the acquire is refused with the refusal (the caller releases it).
    let (mut m, _) = granted(Renewal::Watchdog, Binding::Lease, base, 2_000);
    let out = m.step(answered(Read::Renewal, ms(base, 2_001), Answer::Refused));
    assert_eq!(out.refuse, Some(Refusal::Denied));
    assert_eq!(m.state(), State::Refused);
}
