use super::*;

const NOW: UnixMs = 1_700_000_000_000;

fn hold(owner: &str, kind: HoldKind, count: u64, expires_at: UnixMs, token: u64) -> Hold {
    Hold {
        owner: owner.as_bytes().to_vec().into(),
        kind,
        count,
        expires_at: Some(expires_at),
        token: Some(token),
    }
}

fn rw(holds: Vec<Hold>) -> Lock {
    Lock {
        family: Family::ReadWrite,
        holds: holds.into(),
    }
}

fn sem(limit: u64, holds: Vec<Hold>) -> Lock {
    Lock {
        family: Family::Semaphore { limit },
        holds: holds.into(),
    }
}

fn fields(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs
        .iter()
        .map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

/// Field names and values as stored.
type Stored = Vec<(Vec<u8>, Vec<u8>)>;

/// A case of `decide`: name, lock, owner, request, re-entry rule, queue, what it decides.
type DecideCase = (
    &'static str,
    Lock,
    &'static str,
    Mode,
    Reentry,
    Queue,
    Result<Decision, LockError>,
);

fn fence(owner: &str, count: &str, token: &str) -> Stored {
    fields(&[(owner, count), ("__fence__", token)])
}

/// The lock's holds in one order, for comparing locks whose field order differs.
fn sorted(mut lock: Lock) -> Lock {
    lock.holds.sort_by_key(|h| (h.kind, h.owner.clone()));
    lock
}

fn set(pairs: &[(&str, &str)]) -> Write {
    Write::Set(fields(pairs))
}

fn remove(names: &[&str]) -> Write {
    Write::Remove(names.iter().map(|n| n.as_bytes().to_vec()).collect())
}

fn value(count: u64, expires_at: UnixMs, token: u64) -> String {
    format!("{count}:{expires_at}:{token}")
}

fn grant(how: How, kind: HoldKind, count: u64, token: Option<u64>) -> Decision {
    Decision::Grant(Granted {
        how,
        kind,
        count,
        expires_at: NOW + LEASE,
        token,
    })
}

const LEASE: u64 = 30_000;
const END: UnixMs = NOW + 10_000;

// ---- decode ----

#[test]
fn decode_reads_the_redisson_rlock_layout_with_the_key_expiry_as_lease() {
    let cases = [
        (
            "module-written hold",
            fence("worker-1", "3", "1732370000123004"),
            Some(END),
            hold(
                "worker-1",
                HoldKind::Exclusive,
                3,
                END,
                1_732_370_000_123_004,
            ),
        ),
        (
            "Redisson's own script: no fence field",
            fields(&[("worker-1", "1")]),
            Some(END),
            Hold {
                token: None,
                ..hold("worker-1", HoldKind::Exclusive, 1, END, 0)
            },
        ),
        (
            "made outside the module: no expiry",
            fence("worker-1", "1", "9"),
            None,
            Hold {
                expires_at: None,
                ..hold("worker-1", HoldKind::Exclusive, 1, 0, 9)
            },
        ),
        (
            "fence field first",
            fields(&[("__fence__", "4"), ("w", "2")]),
            Some(END),
            hold("w", HoldKind::Exclusive, 2, END, 4),
        ),
    ];
    for (case, stored, expires_at, want) in cases {
        let lock = decode(&stored, expires_at).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(lock, rw(vec![want]), "{case}");
        assert!(lock.is_rlock_layout(), "{case}");
        assert_eq!(lock.mode_name(), ModeName::Exclusive, "{case}");
    }
}

#[test]
fn decode_reads_the_multi_hold_layout() {
    let cases = [
        (
            "shared holders",
            fields(&[
                ("__mode__", "rw"),
                ("s:a", &value(1, END, 5)),
                ("s:b", &value(2, END + 1, 6)),
            ]),
            rw(vec![
                hold("a", HoldKind::Shared, 1, END, 5),
                hold("b", HoldKind::Shared, 2, END + 1, 6),
            ]),
            ModeName::Shared,
        ),
        (
            "a downgrade: exclusive and shared of one owner",
            fields(&[
                ("x:a", &value(2, END, 5)),
                ("__mode__", "rw"),
                ("s:a", &value(1, END + 5, 7)),
            ]),
            rw(vec![
                hold("a", HoldKind::Exclusive, 2, END, 5),
                hold("a", HoldKind::Shared, 1, END + 5, 7),
            ]),
            ModeName::Exclusive,
        ),
        (
            "a semaphore",
            fields(&[
                ("__mode__", "semaphore:3"),
                ("p:a", &value(1, END, 5)),
                ("p:b", &value(4, END, 8)),
            ]),
            sem(
                3,
                vec![
                    hold("a", HoldKind::Permit, 1, END, 5),
                    hold("b", HoldKind::Permit, 4, END, 8),
                ],
            ),
            ModeName::Semaphore,
        ),
        (
            "a full semaphore of the largest limit",
            fields(&[("__mode__", "semaphore:10000"), ("p:a", &value(1, END, 5))]),
            sem(10_000, vec![hold("a", HoldKind::Permit, 1, END, 5)]),
            ModeName::Semaphore,
        ),
        (
            "an owner name with colons",
            fields(&[("__mode__", "rw"), ("s:a:b", &value(1, END, 5))]),
            rw(vec![hold("a:b", HoldKind::Shared, 1, END, 5)]),
            ModeName::Shared,
        ),
        (
            "counts and tokens up to i64::MAX",
            fields(&[
                ("__mode__", "rw"),
                (
                    "s:a",
                    "9223372036854775807:9223372036854775807:9223372036854775807",
                ),
            ]),
            rw(vec![hold(
                "a",
                HoldKind::Shared,
                i64::MAX as u64,
                i64::MAX as u64,
                i64::MAX as u64,
            )]),
            ModeName::Shared,
        ),
    ];
    for (case, stored, want, mode_name) in cases {
        // The key's own expiry plays no part: every hold carries its lease end.
        let lock = decode(&stored, Some(1)).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(lock, want, "{case}");
        assert!(!lock.is_rlock_layout(), "{case}");
        assert_eq!(lock.mode_name(), mode_name, "{case}");
    }
}

#[test]
fn decode_reads_a_multi_key_with_only_its_mode_as_a_lock_with_no_holds() {
    for (mode, family) in [
        ("rw", Family::ReadWrite),
        ("semaphore:2", Family::Semaphore { limit: 2 }),
    ] {
        let lock = decode(&fields(&[("__mode__", mode)]), Some(END)).unwrap();
        assert_eq!(
            lock,
            Lock {
                family,
                holds: smallvec::smallvec![]
            },
            "{mode}"
        );
        assert_eq!(lock.next_lease_end(), None);
    }
}

#[test]
fn decode_refuses_every_malformed_lock_as_not_a_lock() {
    let ok = value(1, END, 5);
    let cases: Vec<(&str, Stored)> = vec![
        // The mode field.
        ("unknown mode", fields(&[("__mode__", "ro"), ("s:a", &ok)])),
        (
            "mode in capitals",
            fields(&[("__mode__", "RW"), ("s:a", &ok)]),
        ),
        ("empty mode", fields(&[("__mode__", ""), ("s:a", &ok)])),
        // Not an RLock hold by an owner named `__mode__`: a mode that is not valid.
        ("a count as mode", fields(&[("__mode__", "5")])),
        (
            "a count as mode, with a fence",
            fields(&[("__mode__", "5"), ("__fence__", "7")]),
        ),
        (
            "semaphore:0",
            fields(&[("__mode__", "semaphore:0"), ("p:a", &ok)]),
        ),
        (
            "semaphore:10001",
            fields(&[("__mode__", "semaphore:10001"), ("p:a", &ok)]),
        ),
        (
            "semaphore without limit",
            fields(&[("__mode__", "semaphore:"), ("p:a", &ok)]),
        ),
        (
            "semaphore negative",
            fields(&[("__mode__", "semaphore:-1"), ("p:a", &ok)]),
        ),
        (
            "semaphore leading zero",
            fields(&[("__mode__", "semaphore:02"), ("p:a", &ok)]),
        ),
        (
            "semaphore bare",
            fields(&[("__mode__", "semaphore"), ("p:a", &ok)]),
        ),
        // A hold's value.
        (
            "hold value one part",
            fields(&[("__mode__", "rw"), ("s:a", "1")]),
        ),
        (
            "hold value two parts",
            fields(&[("__mode__", "rw"), ("s:a", "1:5")]),
        ),
        (
            "hold value extra colon",
            fields(&[("__mode__", "rw"), ("s:a", "1:5:7:")]),
        ),
        (
            "hold value four parts",
            fields(&[("__mode__", "rw"), ("s:a", "1:5:7:9")]),
        ),
        (
            "hold count 0",
            fields(&[("__mode__", "rw"), ("s:a", "0:5:7")]),
        ),
        (
            "hold lease end 0",
            fields(&[("__mode__", "rw"), ("s:a", "1:0:7")]),
        ),
        (
            "hold token 0",
            fields(&[("__mode__", "rw"), ("s:a", "1:5:0")]),
        ),
        (
            "hold count negative",
            fields(&[("__mode__", "rw"), ("s:a", "-1:5:7")]),
        ),
        (
            "hold count not a number",
            fields(&[("__mode__", "rw"), ("s:a", "x:5:7")]),
        ),
        (
            "hold empty part",
            fields(&[("__mode__", "rw"), ("s:a", "1::7")]),
        ),
        (
            "hold empty value",
            fields(&[("__mode__", "rw"), ("s:a", "")]),
        ),
        (
            "hold count past i64::MAX",
            fields(&[("__mode__", "rw"), ("s:a", "9223372036854775808:5:7")]),
        ),
        // A hold's field name.
        (
            "empty owner after prefix",
            fields(&[("__mode__", "rw"), ("s:", &ok)]),
        ),
        (
            "unknown prefix",
            fields(&[("__mode__", "rw"), ("q:a", &ok)]),
        ),
        (
            "bare owner in a multi key",
            fields(&[("__mode__", "rw"), ("a", &ok)]),
        ),
        (
            "fence field in a multi key",
            fields(&[("__mode__", "rw"), ("__fence__", "5")]),
        ),
        (
            "prefix without colon",
            fields(&[("__mode__", "rw"), ("sa", &ok)]),
        ),
        // Kinds that do not mix.
        ("permit in rw", fields(&[("__mode__", "rw"), ("p:a", &ok)])),
        (
            "shared in semaphore",
            fields(&[("__mode__", "semaphore:2"), ("s:a", &ok)]),
        ),
        (
            "exclusive in semaphore",
            fields(&[("__mode__", "semaphore:2"), ("x:a", &ok)]),
        ),
        (
            "more permits than the limit",
            fields(&[
                ("__mode__", "semaphore:2"),
                ("p:a", &ok),
                ("p:b", &value(1, END, 6)),
                ("p:c", &value(1, END, 7)),
            ]),
        ),
        (
            "two exclusive holds",
            fields(&[("__mode__", "rw"), ("x:a", &ok), ("x:b", &value(1, END, 6))]),
        ),
        (
            "exclusive and another owner's shared",
            fields(&[("__mode__", "rw"), ("x:a", &ok), ("s:b", &value(1, END, 6))]),
        ),
        (
            "exclusive, its own shared and another owner's shared",
            fields(&[
                ("__mode__", "rw"),
                ("x:a", &ok),
                ("s:a", &value(1, END, 6)),
                ("s:b", &value(1, END, 7)),
            ]),
        ),
        // The RLock layout.
        (
            "RLock with two holders",
            fence("a", "1", "5")
                .into_iter()
                .chain(fields(&[("b", "1")]))
                .collect(),
        ),
        ("RLock count 0", fence("a", "0", "5")),
        ("RLock count not a number", fence("a", "one", "5")),
        ("RLock count negative", fence("a", "-1", "5")),
        ("RLock count with hold value", fence("a", &ok, "5")),
        ("RLock fence 0", fence("a", "1", "0")),
        ("RLock fence not a number", fence("a", "1", "x")),
        ("RLock with only the fence", fields(&[("__fence__", "5")])),
        ("empty hash", fields(&[])),
    ];
    for (case, stored) in cases {
        assert_eq!(
            decode(&stored, Some(END)),
            Err(LockError::NotALock),
            "{case}"
        );
    }
}

#[test]
fn decode_reads_the_token_from_the_mode_field_and_the_old_names_too() {
    let cases = [
        (
            "mode carries the token",
            fields(&[("w", "2"), ("mode", "exclusive:4")]),
            FieldNames::Current,
            rw(vec![hold("w", HoldKind::Exclusive, 2, END, 4)]),
        ),
        (
            "the old layout: the token in the fence field",
            fields(&[("w", "2"), ("__fence__", "4")]),
            FieldNames::Legacy,
            rw(vec![hold("w", HoldKind::Exclusive, 2, END, 4)]),
        ),
        (
            "shared holders under mode",
            fields(&[("mode", "rw"), ("s:a", &value(1, END, 5))]),
            FieldNames::Current,
            rw(vec![hold("a", HoldKind::Shared, 1, END, 5)]),
        ),
        (
            "shared holders under the old mode field",
            fields(&[("__mode__", "rw"), ("s:a", &value(1, END, 5))]),
            FieldNames::Legacy,
            rw(vec![hold("a", HoldKind::Shared, 1, END, 5)]),
        ),
        (
            "Redisson's own hold: no token, nothing to rename",
            fields(&[("w", "1")]),
            FieldNames::Current,
            rw(vec![Hold {
                token: None,
                ..hold("w", HoldKind::Exclusive, 1, END, 0)
            }]),
        ),
    ];
    for (case, stored, names, lock) in cases {
        let read = decode_stored(&stored, Some(END)).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!((read.lock, read.names), (lock, names), "{case}");
    }
    let ok = value(1, END, 5);
    let refused = [
        (
            "a token in mode and in the fence",
            fields(&[("w", "1"), ("mode", "exclusive:4"), ("__fence__", "4")]),
        ),
        (
            "mode and the old mode field",
            fields(&[("mode", "rw"), ("__mode__", "rw"), ("s:a", &ok)]),
        ),
        (
            "exclusive mode on a multi-hold key",
            fields(&[("mode", "exclusive:4"), ("s:a", &ok), ("s:b", &ok)]),
        ),
        (
            "exclusive mode without a holder",
            fields(&[("mode", "exclusive:4")]),
        ),
        (
            "exclusive mode in the old field",
            fields(&[("w", "1"), ("__mode__", "exclusive:4")]),
        ),
        (
            "token not a number",
            fields(&[("w", "1"), ("mode", "exclusive:abc")]),
        ),
        (
            "token missing",
            fields(&[("w", "1"), ("mode", "exclusive:")]),
        ),
        ("token 0", fields(&[("w", "1"), ("mode", "exclusive:0")])),
        ("a bare token in mode", fields(&[("w", "1"), ("mode", "4")])),
        ("unknown mode", fields(&[("w", "1"), ("mode", "bogus")])),
        (
            "Redisson's read mode",
            fields(&[("mode", "read"), ("w", "1")]),
        ),
    ];
    for (case, stored) in refused {
        assert_eq!(
            decode(&stored, Some(END)),
            Err(LockError::NotALock),
            "{case}"
        );
    }
}

#[test]
fn a_write_to_a_key_with_the_old_names_renames_them() {
    let x = hold("a", HoldKind::Exclusive, 1, END, 4);
    let x2 = hold("a", HoldKind::Exclusive, 2, END + 10, 4);
    let s = hold("b", HoldKind::Shared, 1, END, 5);
    let s2 = hold("c", HoldKind::Shared, 1, END, 6);
    let cases = [
        (
            "a re-entry of the old RLock layout: mode set, fence removed",
            rw(vec![x.clone()]),
            rw(vec![x2.clone()]),
            vec![
                set(&[("a", "2"), ("mode", "exclusive:4")]),
                remove(&["__fence__"]),
                Write::ExpireAt(END + 10),
            ],
        ),
        (
            "a second shared holder: its field, and mode renamed",
            rw(vec![s.clone()]),
            rw(vec![s.clone(), s2.clone()]),
            vec![
                set(&[("s:c", &value(1, END, 6)), ("mode", "rw")]),
                remove(&["__mode__"]),
            ],
        ),
    ];
    for (case, old, new, want) in cases {
        let w = writes(Some(&old), Some(END), FieldNames::Legacy, &new);
        assert_eq!(w, want, "{case}");
    }
}

/// A key may hold more than [`MAX_HOLDERS`] holds if an earlier version (whose bound was
/// [`MAX_STORED_HOLDERS`]) wrote it: it is still a lock, up to that bound.
#[test]
fn decode_refuses_more_shared_holders_than_a_lock_may_have() {
    let mut stored = fields(&[("__mode__", "rw")]);
    for i in 0..MAX_STORED_HOLDERS {
        stored.push((format!("s:{i}").into_bytes(), value(1, END, 1).into_bytes()));
    }
    assert_eq!(
        decode(&stored, None).map(|l| l.holds.len()),
        Ok(MAX_STORED_HOLDERS)
    );
    stored.push((b"s:one-too-many".to_vec(), value(1, END, 1).into_bytes()));
    assert_eq!(decode(&stored, None), Err(LockError::NotALock));
}

// ---- encode and writes ----

#[test]
fn encode_then_decode_gives_the_lock_back() {
    let cases = [
        (
            "RLock layout",
            rw(vec![hold("a", HoldKind::Exclusive, 3, END, 9)]),
        ),
        (
            "RLock layout without token",
            rw(vec![Hold {
                token: None,
                ..hold("a", HoldKind::Exclusive, 1, END, 0)
            }]),
        ),
        (
            "shared holders",
            rw(vec![
                hold("a", HoldKind::Shared, 1, END, 4),
                hold("b", HoldKind::Shared, 7, END + 3, 5),
            ]),
        ),
        (
            "a downgrade",
            rw(vec![
                hold("a", HoldKind::Exclusive, 2, END, 4),
                hold("a", HoldKind::Shared, 1, END + 9, 6),
            ]),
        ),
        (
            "a semaphore",
            sem(
                3,
                vec![
                    hold("a", HoldKind::Permit, 1, END, 4),
                    hold("b", HoldKind::Permit, 2, END + 1, 5),
                    hold("c", HoldKind::Permit, 1, END + 2, 6),
                ],
            ),
        ),
    ];
    for (case, lock) in cases {
        let stored: Vec<_> = encode(&lock).into_iter().collect();
        let back = decode(&stored, lock.last_lease_end()).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(sorted(back), sorted(lock.clone()), "{case}");
        assert_eq!(
            stored
                .iter()
                .any(|(f, v)| f.as_slice() == MODE_FIELD && !v.starts_with(b"exclusive:")),
            !lock.is_rlock_layout(),
            "{case}: the mode field names a multi-hold key"
        );
        assert!(
            !stored
                .iter()
                .any(|(f, _)| f.as_slice() == FENCE_FIELD || f.as_slice() == LEGACY_MODE_FIELD),
            "{case}: the old names are never written"
        );
    }
}

#[test]
fn encode_writes_the_rlock_layout_byte_for_byte() {
    let lock = rw(vec![hold(
        "worker-1",
        HoldKind::Exclusive,
        1,
        END,
        1_732_370_000_123_004,
    )]);
    let stored: Vec<_> = encode(&lock).into_iter().collect();
    assert_eq!(
        stored,
        fields(&[("mode", "exclusive:1732370000123004"), ("worker-1", "1")])
    );
    assert!(encode(&rw(vec![])).is_empty(), "no holds: nothing stored");
}

#[test]
fn writes_turn_the_stored_lock_into_the_new_one_with_only_what_changed() {
    let a = hold("a", HoldKind::Shared, 1, END, 4);
    let b = hold("b", HoldKind::Shared, 1, END + 100, 5);
    let a_again = hold("a", HoldKind::Shared, 2, END + 50, 4);
    let a_x = hold("a", HoldKind::Exclusive, 1, END, 4);
    let a_s = hold("a", HoldKind::Shared, 1, END + 200, 6);
    let cases = [
        (
            "a new RLock-layout lock: every field and the expiry",
            None,
            None,
            rw(vec![a_x.clone()]),
            vec![
                set(&[("a", "1"), ("mode", "exclusive:4")]),
                Write::ExpireAt(END),
            ],
        ),
        (
            "a new shared lock: mode, hold and expiry",
            None,
            None,
            rw(vec![a.clone()]),
            vec![
                set(&[("mode", "rw"), ("s:a", &value(1, END, 4))]),
                Write::ExpireAt(END),
            ],
        ),
        (
            "a new semaphore",
            None,
            None,
            sem(2, vec![hold("a", HoldKind::Permit, 1, END, 4)]),
            vec![
                set(&[("mode", "semaphore:2"), ("p:a", &value(1, END, 4))]),
                Write::ExpireAt(END),
            ],
        ),
        (
            "a second shared holder: only its field, and the expiry it moves",
            Some(rw(vec![a.clone()])),
            Some(END),
            rw(vec![a.clone(), b.clone()]),
            vec![
                set(&[("s:b", &value(1, END + 100, 5))]),
                Write::ExpireAt(END + 100),
            ],
        ),
        (
            "a re-entry before the latest lease end: its field only, no expiry",
            Some(rw(vec![a.clone(), b.clone()])),
            Some(END + 100),
            rw(vec![a_again.clone(), b.clone()]),
            vec![set(&[("s:a", &value(2, END + 50, 4))])],
        ),
        (
            "nothing changed: nothing written",
            Some(rw(vec![a.clone(), b.clone()])),
            Some(END + 100),
            rw(vec![a.clone(), b.clone()]),
            vec![],
        ),
        (
            "a holder gone: its field removed, the expiry moves back",
            Some(rw(vec![a.clone(), b.clone()])),
            Some(END + 100),
            rw(vec![a.clone()]),
            vec![remove(&["s:b"]), Write::ExpireAt(END)],
        ),
        (
            "an earlier holder gone: its field removed, the expiry stays",
            Some(rw(vec![a.clone(), b.clone()])),
            Some(END + 100),
            rw(vec![b.clone()]),
            vec![remove(&["s:a"])],
        ),
        (
            "the last hold gone: the key is deleted",
            Some(rw(vec![a.clone()])),
            Some(END),
            rw(vec![]),
            vec![Write::Delete],
        ),
        (
            "nothing stored, nothing held: nothing written",
            None,
            None,
            rw(vec![]),
            vec![],
        ),
        (
            "downgrade: RLock layout to multi",
            Some(rw(vec![a_x.clone()])),
            Some(END),
            rw(vec![a_x.clone(), a_s.clone()]),
            vec![
                set(&[
                    ("mode", "rw"),
                    ("s:a", &value(1, END + 200, 6)),
                    ("x:a", &value(1, END, 4)),
                ]),
                remove(&["a"]),
                Write::ExpireAt(END + 200),
            ],
        ),
        (
            "the shared part of a downgrade gone: multi back to RLock layout",
            Some(rw(vec![a_x.clone(), a_s.clone()])),
            Some(END + 200),
            rw(vec![a_x.clone()]),
            vec![
                set(&[("a", "1"), ("mode", "exclusive:4")]),
                remove(&["s:a", "x:a"]),
                Write::ExpireAt(END),
            ],
        ),
        (
            "an RLock key without expiry gets one with its first lease",
            Some(rw(vec![Hold {
                expires_at: None,
                ..a_x.clone()
            }])),
            None,
            rw(vec![a_x.clone()]),
            vec![Write::ExpireAt(END)],
        ),
    ];
    for (case, old, old_expires_at, new, want) in cases {
        let w = writes(old.as_ref(), old_expires_at, FieldNames::Current, &new);
        assert_eq!(w, want, "{case}");
        let stored = old.as_ref().map(encode).unwrap_or_default();
        let after = run_writes(stored, &w).unwrap_or_default();
        assert_eq!(
            after,
            encode(&new),
            "{case}: the key holds exactly the new lock"
        );
    }
}

// ---- decide and apply ----

const MAX: u64 = i64::MAX as u64;

fn held_exclusively(count: u64) -> Lock {
    rw(vec![hold("a", HoldKind::Exclusive, count, END, 5)])
}

fn shared_by_a_and_b() -> Lock {
    rw(vec![
        hold("a", HoldKind::Shared, 1, END, 5),
        hold("b", HoldKind::Shared, 1, END, 6),
    ])
}

fn downgraded_by_a() -> Lock {
    rw(vec![
        hold("a", HoldKind::Exclusive, 1, END, 5),
        hold("a", HoldKind::Shared, 1, END, 6),
    ])
}

fn semaphore_of_2(owners: &[&str]) -> Lock {
    sem(
        2,
        owners
            .iter()
            .zip(5..)
            .map(|(o, t)| hold(o, HoldKind::Permit, 1, END, t))
            .collect(),
    )
}

#[test]
fn decide_applies_the_one_acquire_rule_to_every_kind() {
    use HoldKind::{Exclusive as X, Permit as P, Shared as S};
    use Queue::{Empty, Waiting};
    use Reentry::{Counted, Once};
    let busy = Ok(Decision::Busy);
    let cases: Vec<DecideCase> = vec![
        // A free key takes whatever is asked.
        (
            "free: exclusive",
            Lock::free(),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Ok(grant(How::New, X, 1, None)),
        ),
        (
            "free: shared",
            Lock::free(),
            "a",
            Mode::Shared,
            Counted,
            Empty,
            Ok(grant(How::New, S, 1, None)),
        ),
        (
            "free: permit",
            Lock::free(),
            "a",
            Mode::Limit(3),
            Counted,
            Empty,
            Ok(grant(How::New, P, 1, None)),
        ),
        (
            "free: ONCE is a new hold too",
            Lock::free(),
            "a",
            Mode::Exclusive,
            Once,
            Empty,
            Ok(grant(How::New, X, 1, None)),
        ),
        (
            "free semaphore key taken exclusively",
            sem(2, vec![]),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Ok(grant(How::New, X, 1, None)),
        ),
        (
            "free semaphore key taken with another limit",
            sem(2, vec![]),
            "a",
            Mode::Limit(5),
            Counted,
            Empty,
            Ok(grant(How::New, P, 1, None)),
        ),
        (
            "free read-write key taken as a semaphore",
            rw(vec![]),
            "a",
            Mode::Limit(1),
            Counted,
            Empty,
            Ok(grant(How::New, P, 1, None)),
        ),
        // No barging, even on a free key.
        (
            "free, waiters: exclusive queues",
            Lock::free(),
            "a",
            Mode::Exclusive,
            Counted,
            Waiting,
            busy.clone(),
        ),
        (
            "free, waiters: shared queues",
            Lock::free(),
            "a",
            Mode::Shared,
            Counted,
            Waiting,
            busy.clone(),
        ),
        (
            "free, waiters: permit queues",
            Lock::free(),
            "a",
            Mode::Limit(2),
            Counted,
            Waiting,
            busy.clone(),
        ),
        // Exclusive.
        (
            "exclusive vs another's exclusive",
            held_exclusively(2),
            "b",
            Mode::Exclusive,
            Counted,
            Empty,
            busy.clone(),
        ),
        (
            "exclusive vs shared holders",
            shared_by_a_and_b(),
            "c",
            Mode::Exclusive,
            Counted,
            Empty,
            busy.clone(),
        ),
        (
            "exclusive re-entry counts",
            held_exclusively(2),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Ok(grant(How::Reentered, X, 3, Some(5))),
        ),
        (
            "exclusive re-entry with ONCE does not count",
            held_exclusively(2),
            "a",
            Mode::Exclusive,
            Once,
            Empty,
            Ok(grant(How::Reentered, X, 2, Some(5))),
        ),
        (
            "exclusive re-entry past waiters",
            held_exclusively(2),
            "a",
            Mode::Exclusive,
            Counted,
            Waiting,
            Ok(grant(How::Reentered, X, 3, Some(5))),
        ),
        (
            "downgraded holder re-enters its exclusive hold",
            downgraded_by_a(),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Ok(grant(How::Reentered, X, 2, Some(5))),
        ),
        (
            "upgrade refused while others hold",
            shared_by_a_and_b(),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Err(LockError::UpgradeRefused),
        ),
        (
            "upgrade refused when alone",
            rw(vec![hold("a", S, 1, END, 5)]),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Err(LockError::UpgradeRefused),
        ),
        (
            "upgrade refused with waiters",
            shared_by_a_and_b(),
            "a",
            Mode::Exclusive,
            Once,
            Waiting,
            Err(LockError::UpgradeRefused),
        ),
        // Shared.
        (
            "shared beside shared holders",
            shared_by_a_and_b(),
            "c",
            Mode::Shared,
            Counted,
            Empty,
            Ok(grant(How::New, S, 1, None)),
        ),
        (
            "shared vs another's exclusive",
            held_exclusively(1),
            "b",
            Mode::Shared,
            Counted,
            Empty,
            busy.clone(),
        ),
        (
            "shared vs a downgraded holder",
            downgraded_by_a(),
            "b",
            Mode::Shared,
            Counted,
            Empty,
            busy.clone(),
        ),
        (
            "new shared holder queues behind waiters",
            shared_by_a_and_b(),
            "c",
            Mode::Shared,
            Counted,
            Waiting,
            busy.clone(),
        ),
        (
            "shared re-entry past waiters",
            shared_by_a_and_b(),
            "a",
            Mode::Shared,
            Counted,
            Waiting,
            Ok(grant(How::Reentered, S, 2, Some(5))),
        ),
        (
            "shared re-entry with ONCE",
            shared_by_a_and_b(),
            "b",
            Mode::Shared,
            Once,
            Empty,
            Ok(grant(How::Reentered, S, 1, Some(6))),
        ),
        (
            "downgrade",
            held_exclusively(2),
            "a",
            Mode::Shared,
            Counted,
            Empty,
            Ok(grant(How::Downgraded, S, 1, None)),
        ),
        (
            "downgrade with waiters",
            held_exclusively(2),
            "a",
            Mode::Shared,
            Once,
            Waiting,
            Ok(grant(How::Downgraded, S, 1, None)),
        ),
        (
            "downgraded holder re-enters its shared hold",
            downgraded_by_a(),
            "a",
            Mode::Shared,
            Counted,
            Waiting,
            Ok(grant(How::Reentered, S, 2, Some(6))),
        ),
        // Permits.
        (
            "permit with one free",
            semaphore_of_2(&["a"]),
            "b",
            Mode::Limit(2),
            Counted,
            Empty,
            Ok(grant(How::New, P, 1, None)),
        ),
        (
            "permit when full",
            semaphore_of_2(&["a", "b"]),
            "c",
            Mode::Limit(2),
            Counted,
            Empty,
            busy.clone(),
        ),
        (
            "permit re-entry when full",
            semaphore_of_2(&["a", "b"]),
            "b",
            Mode::Limit(2),
            Counted,
            Empty,
            Ok(grant(How::Reentered, P, 2, Some(6))),
        ),
        (
            "new permit queues behind waiters",
            semaphore_of_2(&["a"]),
            "b",
            Mode::Limit(2),
            Counted,
            Waiting,
            busy.clone(),
        ),
        (
            "permit re-entry with ONCE past waiters",
            semaphore_of_2(&["a"]),
            "a",
            Mode::Limit(2),
            Once,
            Waiting,
            Ok(grant(How::Reentered, P, 1, Some(5))),
        ),
        // Kinds don't mix.
        (
            "another limit on a semaphore",
            semaphore_of_2(&["a"]),
            "b",
            Mode::Limit(3),
            Counted,
            Empty,
            Err(LockError::IsSemaphore { limit: 2 }),
        ),
        (
            "another limit from the permit's own holder",
            semaphore_of_2(&["a"]),
            "a",
            Mode::Limit(1),
            Counted,
            Empty,
            Err(LockError::IsSemaphore { limit: 2 }),
        ),
        (
            "exclusive on a semaphore",
            semaphore_of_2(&["a"]),
            "b",
            Mode::Exclusive,
            Counted,
            Empty,
            Err(LockError::IsSemaphore { limit: 2 }),
        ),
        (
            "shared on a semaphore",
            semaphore_of_2(&["a"]),
            "b",
            Mode::Shared,
            Counted,
            Waiting,
            Err(LockError::IsSemaphore { limit: 2 }),
        ),
        (
            "exclusive on a semaphore by its holder",
            semaphore_of_2(&["a"]),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Err(LockError::IsSemaphore { limit: 2 }),
        ),
        (
            "LIMIT on an exclusive lock",
            held_exclusively(1),
            "b",
            Mode::Limit(2),
            Counted,
            Empty,
            Err(LockError::IsReadWrite),
        ),
        (
            "LIMIT on a shared lock",
            shared_by_a_and_b(),
            "c",
            Mode::Limit(2),
            Counted,
            Waiting,
            Err(LockError::IsReadWrite),
        ),
        (
            "LIMIT by the exclusive holder",
            held_exclusively(1),
            "a",
            Mode::Limit(1),
            Counted,
            Empty,
            Err(LockError::IsReadWrite),
        ),
        // Counts stop at the largest stored integer.
        (
            "exclusive count at i64::MAX",
            held_exclusively(MAX),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Err(LockError::CountOverflow),
        ),
        (
            "exclusive count reaches i64::MAX",
            held_exclusively(MAX - 1),
            "a",
            Mode::Exclusive,
            Counted,
            Empty,
            Ok(grant(How::Reentered, X, MAX, Some(5))),
        ),
        (
            "ONCE at i64::MAX",
            held_exclusively(MAX),
            "a",
            Mode::Exclusive,
            Once,
            Empty,
            Ok(grant(How::Reentered, X, MAX, Some(5))),
        ),
        (
            "shared count at i64::MAX",
            rw(vec![hold("a", S, MAX, END, 5)]),
            "a",
            Mode::Shared,
            Counted,
            Empty,
            Err(LockError::CountOverflow),
        ),
        (
            "permit count at i64::MAX",
            sem(2, vec![hold("a", P, MAX, END, 5)]),
            "a",
            Mode::Limit(2),
            Counted,
            Empty,
            Err(LockError::CountOverflow),
        ),
    ];
    for (case, lock, owner, mode, reentry, queue, want) in cases {
        assert_eq!(
            decide(&lock, owner.as_bytes(), mode, LEASE, reentry, queue, NOW),
            want,
            "{case}"
        );
    }
}

#[test]
fn decide_refuses_a_new_shared_holder_past_the_most_holders() {
    let full = rw((0..MAX_HOLDERS)
        .map(|i| hold(&format!("r{i}"), HoldKind::Shared, 1, END, i as u64 + 1))
        .collect());
    assert_eq!(
        decide(
            &full,
            b"new",
            Mode::Shared,
            LEASE,
            Reentry::Counted,
            Queue::Empty,
            NOW
        ),
        Err(LockError::TooManyHolders {
            max: MAX_HOLDERS as u64
        })
    );
    assert_eq!(
        decide(
            &full,
            b"r7",
            Mode::Shared,
            LEASE,
            Reentry::Counted,
            Queue::Empty,
            NOW
        ),
        Ok(grant(How::Reentered, HoldKind::Shared, 2, Some(8))),
        "a holder re-enters"
    );
}

#[test]
fn apply_writes_the_granted_hold_into_the_lock() {
    const NEW_TOKEN: u64 = 9;
    let lease_end = NOW + LEASE;
    let cases = [
        (
            "a free key becomes an RLock-layout lock",
            Lock::free(),
            "a",
            Mode::Exclusive,
            rw(vec![hold(
                "a",
                HoldKind::Exclusive,
                1,
                lease_end,
                NEW_TOKEN,
            )]),
        ),
        (
            "a free semaphore key taken exclusively is a read-write lock",
            sem(2, vec![]),
            "a",
            Mode::Exclusive,
            rw(vec![hold(
                "a",
                HoldKind::Exclusive,
                1,
                lease_end,
                NEW_TOKEN,
            )]),
        ),
        (
            "a free key taken with LIMIT is a semaphore of that limit",
            Lock::free(),
            "a",
            Mode::Limit(3),
            sem(
                3,
                vec![hold("a", HoldKind::Permit, 1, lease_end, NEW_TOKEN)],
            ),
        ),
        (
            "a re-entry keeps its token and takes the new lease",
            held_exclusively(2),
            "a",
            Mode::Exclusive,
            rw(vec![hold("a", HoldKind::Exclusive, 3, lease_end, 5)]),
        ),
        (
            "a downgrade adds a shared hold with a new token",
            held_exclusively(2),
            "a",
            Mode::Shared,
            rw(vec![
                hold("a", HoldKind::Exclusive, 2, END, 5),
                hold("a", HoldKind::Shared, 1, lease_end, NEW_TOKEN),
            ]),
        ),
        (
            "another shared holder",
            shared_by_a_and_b(),
            "c",
            Mode::Shared,
            rw(vec![
                hold("a", HoldKind::Shared, 1, END, 5),
                hold("b", HoldKind::Shared, 1, END, 6),
                hold("c", HoldKind::Shared, 1, lease_end, NEW_TOKEN),
            ]),
        ),
        (
            "another permit",
            semaphore_of_2(&["a"]),
            "b",
            Mode::Limit(2),
            sem(
                2,
                vec![
                    hold("a", HoldKind::Permit, 1, END, 5),
                    hold("b", HoldKind::Permit, 1, lease_end, NEW_TOKEN),
                ],
            ),
        ),
    ];
    for (case, lock, owner, mode, want) in cases {
        let Ok(Decision::Grant(granted)) = decide(
            &lock,
            owner.as_bytes(),
            mode,
            LEASE,
            Reentry::Counted,
            Queue::Empty,
            NOW,
        ) else {
            panic!("{case}: not granted");
        };
        assert_eq!(
            apply(&lock, owner.as_bytes(), mode, &granted, NEW_TOKEN),
            want,
            "{case}"
        );
    }
}

// ---- release, renew, lease ends, removal ----

#[test]
fn release_counts_the_exclusive_hold_down_before_the_shared_one() {
    let mut lock = rw(vec![
        hold("a", HoldKind::Exclusive, 2, END, 5),
        hold("a", HoldKind::Shared, 1, END, 6),
    ]);
    let steps = [
        (
            2,
            vec![
                hold("a", HoldKind::Exclusive, 1, END, 5),
                hold("a", HoldKind::Shared, 1, END, 6),
            ],
        ),
        (1, vec![hold("a", HoldKind::Shared, 1, END, 6)]),
        (0, vec![]),
    ];
    for (remaining, holds) in steps {
        let (after, left) = release(&lock, b"a", None).expect("a holds the key");
        assert_eq!(
            (left, after.holds.as_slice()),
            (remaining, holds.as_slice())
        );
        lock = after;
    }
    assert_eq!(release(&lock, b"a", None), None, "a holds nothing any more");
}

#[test]
fn release_answers_the_owners_remaining_reentries_on_the_key() {
    let cases = [
        (
            "one of two shared holders leaves",
            shared_by_a_and_b(),
            "a",
            Some((rw(vec![hold("b", HoldKind::Shared, 1, END, 6)]), 0)),
        ),
        (
            "a permit counts down",
            sem(2, vec![hold("a", HoldKind::Permit, 3, END, 5)]),
            "a",
            Some((sem(2, vec![hold("a", HoldKind::Permit, 2, END, 5)]), 2)),
        ),
        (
            "the RLock holder's last release",
            held_exclusively(1),
            "a",
            Some((rw(vec![]), 0)),
        ),
        ("an owner holding nothing", shared_by_a_and_b(), "c", None),
        ("a free key", Lock::free(), "a", None),
    ];
    for (case, lock, owner, want) in cases {
        assert_eq!(release(&lock, owner.as_bytes(), None), want, "{case}");
    }
}

#[test]
fn a_release_with_a_token_counts_down_only_the_owners_hold_under_it() {
    // a holds the key exclusively (token 5) and SHARED (token 6); b SHARED (token 7).
    let both = rw(vec![
        hold("a", HoldKind::Exclusive, 1, END, 5),
        hold("a", HoldKind::Shared, 1, END, 6),
        hold("b", HoldKind::Shared, 1, END, 7),
    ]);
    let cases = [
        (
            "the shared hold by its token, though a plain release takes the exclusive first",
            both.clone(),
            "a",
            6,
            Some((
                rw(vec![
                    hold("a", HoldKind::Exclusive, 1, END, 5),
                    hold("b", HoldKind::Shared, 1, END, 7),
                ]),
                1,
            )),
        ),
        (
            "the exclusive hold by its token",
            both.clone(),
            "a",
            5,
            Some((
                rw(vec![
                    hold("a", HoldKind::Shared, 1, END, 6),
                    hold("b", HoldKind::Shared, 1, END, 7),
                ]),
                1,
            )),
        ),
        ("another owner's token", both.clone(), "a", 7, None),
        ("a token the owner no longer holds", both, "a", 4, None),
        (
            "a re-entered hold counts down",
            held_exclusively(2),
            "a",
            held_exclusively(2).holds[0].token.unwrap_or_default(),
            Some((held_exclusively(1), 1)),
        ),
    ];
    for (case, lock, owner, token, want) in cases {
        assert_eq!(
            release(&lock, owner.as_bytes(), Some(token)),
            want,
            "{case}"
        );
    }
}

#[test]
fn renew_sets_the_new_lease_on_every_hold_of_the_owner_only() {
    let renewed = NOW + LEASE;
    let cases = [
        (
            "both holds of a downgrade",
            downgraded_by_a(),
            "a",
            Some(rw(vec![
                hold("a", HoldKind::Exclusive, 1, renewed, 5),
                hold("a", HoldKind::Shared, 1, renewed, 6),
            ])),
        ),
        (
            "one shared holder among others",
            shared_by_a_and_b(),
            "b",
            Some(rw(vec![
                hold("a", HoldKind::Shared, 1, END, 5),
                hold("b", HoldKind::Shared, 1, renewed, 6),
            ])),
        ),
        (
            "an RLock key without expiry",
            rw(vec![Hold {
                expires_at: None,
                ..hold("a", HoldKind::Exclusive, 1, 0, 5)
            }]),
            "a",
            Some(rw(vec![hold("a", HoldKind::Exclusive, 1, renewed, 5)])),
        ),
        ("an owner holding nothing", shared_by_a_and_b(), "c", None),
    ];
    for (case, lock, owner, want) in cases {
        assert_eq!(renew(&lock, owner.as_bytes(), LEASE, NOW), want, "{case}");
    }
}

#[test]
fn drop_ended_removes_a_hold_only_once_the_clock_is_past_its_lease_end() {
    let mut lock = rw(vec![
        hold("a", HoldKind::Shared, 1, NOW - 1, 5),
        hold("b", HoldKind::Shared, 1, NOW, 6),
        hold("c", HoldKind::Shared, 1, NOW + 1, 7),
        Hold {
            expires_at: None,
            ..hold("d", HoldKind::Shared, 1, 0, 8)
        },
    ]);
    let steps = [
        (NOW, 1, vec!["b", "c", "d"]),
        (NOW, 0, vec!["b", "c", "d"]),
        (NOW + 1, 1, vec!["c", "d"]),
        (UnixMs::MAX, 1, vec!["d"]),
    ];
    for (now, dropped, left) in steps {
        assert_eq!(lock.drop_ended(now), dropped, "at {now}");
        let owners: Vec<&[u8]> = lock.holds.iter().map(|h| h.owner.as_slice()).collect();
        let left: Vec<&[u8]> = left.iter().map(|o| o.as_bytes()).collect();
        assert_eq!(owners, left, "at {now}");
    }
}

#[test]
fn remove_hold_ends_the_named_grant_undelivered_only_at_count_1() {
    use HoldKind::{Exclusive as X, Permit as P, Shared as S};
    let cases = [
        (
            "undelivered grant at count 1",
            held_exclusively(1),
            X,
            5,
            false,
            Some(rw(vec![])),
        ),
        (
            "undelivered grant re-entered since",
            held_exclusively(2),
            X,
            5,
            false,
            None,
        ),
        (
            "connection closed at count 2",
            held_exclusively(2),
            X,
            5,
            true,
            Some(rw(vec![])),
        ),
        (
            "connection closed at i64::MAX",
            held_exclusively(MAX),
            X,
            5,
            true,
            Some(rw(vec![])),
        ),
        ("another token", held_exclusively(1), X, 6, true, None),
        (
            "another token, undelivered",
            held_exclusively(1),
            X,
            4,
            false,
            None,
        ),
        (
            "the token of another kind",
            held_exclusively(1),
            S,
            5,
            true,
            None,
        ),
        (
            "the shared part of a downgrade",
            downgraded_by_a(),
            S,
            6,
            false,
            Some(held_exclusively(1)),
        ),
        (
            "one permit among two",
            semaphore_of_2(&["a", "b"]),
            P,
            6,
            true,
            Some(semaphore_of_2(&["a"])),
        ),
        ("a free key", Lock::free(), X, 5, true, None),
    ];
    for (case, lock, kind, token, any_count, want) in cases {
        assert_eq!(remove_hold(&lock, kind, token, any_count), want, "{case}");
    }
}

#[test]
fn lease_ends_and_counts_are_read_over_all_holds() {
    let lock = rw(vec![
        hold("a", HoldKind::Exclusive, 2, END + 7, 5),
        hold("a", HoldKind::Shared, 3, END, 6),
    ]);
    assert_eq!(lock.next_lease_end(), Some(END));
    assert_eq!(lock.last_lease_end(), Some(END + 7));
    assert_eq!(lock.count_of(b"a"), 5);
    assert_eq!(lock.count_of(b"b"), 0);
    let no_lease = rw(vec![Hold {
        expires_at: None,
        ..hold("a", HoldKind::Exclusive, 1, 0, 5)
    }]);
    assert_eq!(
        (no_lease.next_lease_end(), no_lease.last_lease_end()),
        (None, None)
    );
    assert_eq!(Lock::free().next_lease_end(), None);
}

/// The stored fields after `writes` ran on `stored` (None: the key is deleted).
fn run_writes(
    mut stored: BTreeMap<Vec<u8>, Vec<u8>>,
    writes: &[Write],
) -> Option<BTreeMap<Vec<u8>, Vec<u8>>> {
    for write in writes {
        match write {
            Write::Delete => return None,
            Write::Set(pairs) => stored.extend(pairs.iter().cloned()),
            Write::Remove(names) => names.iter().for_each(|n| {
                stored.remove(n);
            }),
            Write::ExpireAt(_) => {}
        }
    }
    Some(stored)
}

#[test]
fn writes_on_a_key_with_only_its_mode_field_leave_exactly_the_new_lock() {
    let x = rw(vec![hold("a", HoldKind::Exclusive, 1, END, 5)]);
    let s = rw(vec![hold("a", HoldKind::Shared, 1, END, 5)]);
    let p = sem(3, vec![hold("a", HoldKind::Permit, 1, END, 5)]);
    for (mode, family) in [
        ("rw", Family::ReadWrite),
        ("semaphore:2", Family::Semaphore { limit: 2 }),
    ] {
        for (field, names) in [
            ("mode", FieldNames::Current),
            ("__mode__", FieldNames::Legacy),
        ] {
            let stored: BTreeMap<_, _> = fields(&[(field, mode)]).into_iter().collect();
            let read =
                decode_stored(&stored.clone().into_iter().collect::<Vec<_>>(), None).unwrap();
            assert_eq!(read.names, names);
            let old = read.lock;
            assert_eq!(
                old,
                Lock {
                    family,
                    holds: smallvec::smallvec![]
                }
            );
            for new in [&x, &s, &p] {
                let w = writes(Some(&old), None, names, new);
                let after = run_writes(stored.clone(), &w).expect("not deleted");
                assert_eq!(after, encode(new), "{mode} -> {new:?}: {w:?}");
                assert!(w.contains(&Write::ExpireAt(END)), "{mode} -> {new:?}");
                let back = decode(&after.into_iter().collect::<Vec<_>>(), Some(END));
                assert_eq!(back.as_ref(), Ok(new), "{mode} -> {new:?}");
            }
            assert_eq!(
                writes(Some(&old), None, names, &rw(vec![])),
                [Write::Delete]
            );
        }
    }
}

mod writes_model {
    use super::*;
    use proptest::prelude::*;

    /// A lock of any layout: up to 6 holds of 4 owners, a family, counts, lease ends and tokens
    /// from small ranges (so that old and new often share holds exactly).
    fn any_lock() -> impl Strategy<Value = Lock> {
        let hold = (0usize..4, 0usize..3, 1u64..3, 1u64..3, 1u64..3).prop_map(
            |(owner, kind, count, end, token)| Hold {
                owner: format!("o{owner}").into_bytes().into(),
                kind: [HoldKind::Exclusive, HoldKind::Shared, HoldKind::Permit][kind],
                count,
                expires_at: Some(END + end),
                token: Some(token),
            },
        );
        (proptest::collection::vec(hold, 0..6), 0usize..3).prop_map(|(holds, family)| {
            let family = [
                Family::ReadWrite,
                Family::Semaphore { limit: 5 },
                Family::Semaphore { limit: 6 },
            ][family];
            let mut lock = Lock {
                family,
                holds: Default::default(),
            };
            for hold in holds {
                // One hold per (kind, owner), as every stored lock has.
                if lock.find(&hold.owner, hold.kind).is_none() {
                    lock.holds.push(hold);
                }
            }
            lock
        })
    }

    proptest! {
        /// Whatever the layouts, running `writes` on what `old` is stored as leaves exactly
        /// what `new` is stored as (the fast diff between multi-hold locks included).
        #[test]
        fn writes_leave_exactly_the_new_lock(old in any_lock(), new in any_lock()) {
            // A key stored under the old names too: the writes leave exactly the new layout.
            for names in [FieldNames::Current, FieldNames::Legacy] {
                let mut stored = encode_as(&old, names);
                if old.holds.is_empty() {
                    // A stored multi-hold key without holds keeps its mode field.
                    stored.insert(names.mode_field().to_vec(), mode_value(old.family));
                }
                let w = writes(Some(&old), old.last_lease_end(), names, &new);
                let after = run_writes(stored, &w);
                if new.holds.is_empty() {
                    prop_assert_eq!(after, None);
                } else {
                    prop_assert_eq!(after, Some(encode(&new)), "{:?} {:?}", names, w);
                }
            }
        }
    }
}

#[test]
fn a_field_reported_twice_by_a_hash_scan_is_one_hold() {
    let stored = fields(&[
        ("__mode__", "semaphore:2"),
        ("p:b", "1:2000:7"),
        ("p:a", "1:2000:6"),
        ("p:b", "1:2000:7"),
    ]);
    let lock = decode(&stored, Some(2000)).unwrap();
    let owners: Vec<&[u8]> = lock.holds.iter().map(|h| h.owner.as_slice()).collect();
    assert_eq!(owners, [&b"a"[..], &b"b"[..]], "sorted, the twin dropped");
    assert_eq!(
        lock.family,
        Family::Semaphore { limit: 2 },
        "and within the limit"
    );
}

#[test]
fn an_owners_own_fields_decode_to_what_the_full_read_gives_for_it() {
    // A read-write key: a downgraded holder (exclusive and shared) beside nobody else, and a
    // shared key of two readers; a semaphore of two permits.
    let keys: Vec<Stored> = vec![
        fields(&[
            ("mode", "rw"),
            ("x:a", &value(2, NOW, 10)),
            ("s:a", &value(1, NOW + 5, 11)),
        ]),
        fields(&[
            ("mode", "rw"),
            ("s:a", &value(1, NOW, 12)),
            ("s:b", &value(3, NOW, 13)),
        ]),
        fields(&[
            ("mode", "semaphore:2"),
            ("p:a", &value(1, NOW, 14)),
            ("p:b", &value(1, NOW, 15)),
        ]),
    ];
    for stored in keys {
        let full = decode(&stored, Some(NOW + 5)).unwrap();
        let mode = &stored[0].1;
        for owner in ["a", "b", "c"] {
            let own: Vec<Option<&[u8]>> = HoldKind::ALL
                .iter()
                .map(|&kind| {
                    let name = hold_field(kind, owner.as_bytes());
                    stored
                        .iter()
                        .find(|(f, _)| *f == name)
                        .map(|(_, v)| v.as_slice())
                })
                .collect();
            let own = decode_owner_holds(
                decode_family(mode).unwrap(),
                stored.len() - 1,
                owner.as_bytes(),
                [own[0], own[1], own[2]],
            )
            .unwrap();
            let expected: Vec<&Hold> = full
                .holds
                .iter()
                .filter(|h| h.owner == owner.as_bytes())
                .collect();
            assert_eq!(
                own.iter().collect::<Vec<_>>(),
                expected,
                "{owner} in {stored:?}"
            );
        }
    }
}

#[test]
fn an_owners_own_fields_that_break_the_layout_are_not_a_lock() {
    let good = value(1, NOW, 7);
    type Case<'a> = (&'static str, Family, usize, [Option<&'a [u8]>; 3]);
    let cases: Vec<Case> = vec![
        (
            "a permit in a read-write lock",
            Family::ReadWrite,
            1,
            [None, None, Some(good.as_bytes())],
        ),
        (
            "an exclusive hold in a semaphore",
            Family::Semaphore { limit: 2 },
            1,
            [Some(good.as_bytes()), None, None],
        ),
        (
            "a shared hold in a semaphore",
            Family::Semaphore { limit: 2 },
            1,
            [None, Some(good.as_bytes()), None],
        ),
        (
            "a value that is no hold",
            Family::ReadWrite,
            1,
            [Some(b"1:2"), None, None],
        ),
        (
            "a zero count",
            Family::ReadWrite,
            1,
            [None, Some(b"0:5:7"), None],
        ),
        (
            "a semaphore with more permits than its limit",
            Family::Semaphore { limit: 2 },
            3,
            [None, None, Some(good.as_bytes())],
        ),
        (
            "an exclusive hold beside others' holds",
            Family::ReadWrite,
            3,
            [Some(good.as_bytes()), Some(good.as_bytes()), None],
        ),
    ];
    for (name, family, holds, values) in cases {
        assert_eq!(
            decode_owner_holds(family, holds, b"a", values),
            Err(LockError::NotALock),
            "{name}"
        );
    }
    assert_eq!(decode_family(b"exclusive:5"), None);
    assert_eq!(decode_family(b"semaphore:0"), None);
    assert_eq!(decode_family(b"rw"), Some(Family::ReadWrite));
}

/// A run finds an owner's holds by binary search when the holds are in the order every decoded
/// key lists them, and through a map otherwise: both find the same holds, so every decision and
/// grant of a run is the same either way.
#[test]
fn a_run_decides_alike_on_holds_in_stored_order_and_in_any_other() {
    use super::run::OwnIndex;
    let sorted = |mut lock: Lock| {
        lock.holds
            .sort_unstable_by(|a, b| (a.kind, &a.owner).cmp(&(b.kind, &b.owner)));
        lock
    };
    let locks = [
        rw((0..50)
            .map(|i| {
                hold(
                    &format!("r{i:02}"),
                    HoldKind::Shared,
                    1,
                    NOW + 10_000,
                    100 + i,
                )
            })
            .collect()),
        rw(vec![
            hold("d", HoldKind::Exclusive, 2, NOW + 10_000, 7),
            hold("d", HoldKind::Shared, 1, NOW + 10_000, 7),
        ]),
        sem(
            5,
            (0..4)
                .map(|i| hold(&format!("p{i}"), HoldKind::Permit, 1, NOW + 10_000, 10 + i))
                .collect(),
        ),
    ];
    let owners = ["r00", "r25", "r49", "d", "p0", "p3", "nobody"];
    let modes = [Mode::Exclusive, Mode::Shared, Mode::Limit(5)];
    for lock in locks {
        let mut reversed = lock.clone();
        reversed.holds.reverse();
        let in_order = Run::new(sorted(lock.clone()));
        let other = Run::new(reversed);
        assert!(matches!(in_order.own, OwnIndex::Sorted { .. }));
        assert!(lock.holds.len() < 2 || matches!(other.own, OwnIndex::Map(_)));
        for owner in owners {
            for mode in modes {
                for reentry in [Reentry::Counted, Reentry::Once] {
                    let a = in_order.decide(owner.as_bytes(), mode, 5_000, reentry, NOW);
                    let b = other.decide(owner.as_bytes(), mode, 5_000, reentry, NOW);
                    assert_eq!(a, b, "{owner} {mode:?} {reentry:?}");
                    if let Ok(Decision::Grant(g)) = a {
                        let (mut x, mut y) = (
                            Run::new(sorted(lock.clone())),
                            Run::new({
                                let mut l = lock.clone();
                                l.holds.reverse();
                                l
                            }),
                        );
                        x.apply(owner.as_bytes(), mode, &g, 999);
                        y.apply(owner.as_bytes(), mode, &g, 999);
                        assert_eq!(
                            sorted(x.into_lock()),
                            sorted(y.into_lock()),
                            "{owner} {mode:?}"
                        );
                    }
                }
            }
        }
    }
}
