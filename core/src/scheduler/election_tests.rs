//! Campaigning waiters: a grant to one is announced (with its value) before it is answered; a
//! plain waiter's grant is not.

use super::testing::*;
use super::*;

#[test]
fn a_campaigning_waiter_is_announced_as_elected_when_granted() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = LockKey::new(0, b"leader");
    port.acquire(&k, "first", Mode::Exclusive, 60_000, false)
        .unwrap();
    let keys = [(
        k.clone(),
        Seen::Held {
            next_lease_end: Some(61_000),
        },
    )];
    let campaign = |value: Option<&[u8]>| Campaign {
        value: value.map(Into::into),
    };
    for (handle, owner, c) in [
        (1u32, "second", Some(campaign(Some(b"10.0.0.2:80")))),
        (2, "plain", None),
        (3, "third", Some(campaign(None))),
    ] {
        s.enqueue(
            &mut port,
            NewWait {
                handle: Handle::Blocked(handle),
                keys: &keys,
                owner: owner.as_bytes(),
                lease_ms: 1_000,
                wait: Wait::Forever,
                mode: Mode::Exclusive,
                reentry: crate::kind::Reentry::Once,
                bind: None,
                campaign: c,
            },
            100,
            1_000,
        )
        .unwrap();
    }
    for owner in ["first", "second", "plain"] {
        release_owner(&mut s, &mut port, &k, owner.as_bytes());
    }
    let elected: Vec<(Vec<u8>, Option<Vec<u8>>)> = port
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Elected { owner, value, .. } => Some((owner.clone(), value.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        elected,
        [
            (b"second".to_vec(), Some(b"10.0.0.2:80".to_vec())),
            (b"third".to_vec(), None)
        ]
    );
    // Announced before the answer: an observer never learns of a leader after the leader does.
    let position = |pred: &dyn Fn(&Effect) -> bool| port.effects.iter().position(pred).unwrap();
    let announced = position(&|e| matches!(e, Effect::Elected { owner, .. } if owner == b"second"));
    let answered = position(&|e| matches!(e, Effect::Answered { handle: 1, .. }));
    assert!(announced < answered);
}
