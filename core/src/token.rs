//! Fencing tokens: strictly increasing per lock key, across deletions, restarts, failovers and
//! slot migrations.
//!
//! Each cluster slot (per database) has a counter key holding a **bound**: a value at least as
//! large as every token ever handed out for that slot. A new token is above the bound it reads,
//! so tokens rise wherever the bound goes (it persists, replicates and migrates with the slot).
//!
//! Writing and replicating the bound on every grant would be most of a grant's cost, so the
//! module *reserves* a window: it stores `token + WINDOW` once and then hands out tokens from
//! that window from memory, writing nothing until the window is used up. The in-memory
//! reservation is trusted only while the stored bound still equals the bound it wrote; any
//! other value (FLUSHALL, a deleted or rewritten counter, a slot that came back from another
//! node, a reload) means someone else may have handed out tokens, and the next token goes
//! above the stored value again.
//!
//! Tokens also never fall below the server clock (`now_ms * 1000`): if the bound is lost or
//! rolled back (FLUSHALL, an RDB snapshot older than the last reservation, a failover to a
//! replica that missed it), a later clock reading is above every earlier token unless the clock
//! went back or a slot sustained more than 1,000 grants per millisecond.

use crate::layout::MAX_STORED_INTEGER;
use crate::{LockError, UnixMs};

/// Token values per millisecond of the server clock: a token is never below `now_ms * 1000`.
pub const TOKENS_PER_MS: u64 = 1_000;

/// How far ahead of a token its stored bound is reserved: one minute of clock. A slot's bound
/// is then written at most about once a minute (or once per 60 million grants), so even with
/// locks spread over all 16,384 slots most grants write nothing; tokens after a restart or
/// failover may start up to a minute's worth ahead of the clock, which is harmless.
pub const WINDOW: u64 = 60_000 * TOKENS_PER_MS;

/// A window reserved by this process for one slot of one database: the last token handed out
/// from it and the bound stored for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub last: u64,
    pub bound: u64,
}

/// The token for a new hold, and the new bound to store (and replicate) when one is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub token: u64,
    pub store_bound: Option<u64>,
}

impl Grant {
    /// The reservation this process holds after the grant.
    pub fn reservation(&self, before: Option<Reservation>) -> Option<Reservation> {
        match (self.store_bound, before) {
            (Some(bound), _) => Some(Reservation {
                last: self.token,
                bound,
            }),
            (None, Some(r)) => Some(Reservation {
                last: self.token,
                ..r
            }),
            (None, None) => None,
        }
    }
}

/// Decides the next token from the stored bound (`None`: missing or unreadable), this
/// process's reservation for the slot, and the server clock.
///
/// Tokens are signed 64-bit integers on the wire. A token above `i64::MAX` cannot be given, and
/// saturating would repeat one, so past the limit every grant in the slot is refused: only a
/// counter written by hand near the limit can get there (the clock floor is about 2^60 in the
/// year 2200). The stored bound is capped at the limit instead: a window may just end early.
pub fn next_token(
    stored: Option<u64>,
    reserved: Option<Reservation>,
    now: UnixMs,
) -> Result<Grant, LockError> {
    let floor = now.saturating_mul(TOKENS_PER_MS).max(1);
    if let Some(r) = reserved.filter(|r| stored == Some(r.bound)) {
        if let Some(token) = r.last.checked_add(1).map(|t| t.max(floor)) {
            if token <= r.bound {
                return Ok(Grant {
                    token,
                    store_bound: None,
                });
            }
        }
    }
    // No usable reservation: go above everything known — the stored bound, what this process
    // handed out itself, and the clock — and reserve a new window.
    let above = |known: Option<u64>| known.map_or(Some(0), |v| v.checked_add(1));
    let token = above(stored)
        .zip(above(reserved.map(|r| r.last)))
        .map(|(a, b)| a.max(b).max(floor))
        .filter(|t| *t <= MAX_STORED_INTEGER)
        .ok_or(LockError::TokensExhausted)?;
    Ok(Grant {
        token,
        store_bound: Some(token.saturating_add(WINDOW).min(MAX_STORED_INTEGER)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: UnixMs = 1_700_000_000_000;
    const FLOOR: u64 = NOW * TOKENS_PER_MS;

    fn reserved(last: u64, bound: u64) -> Option<Reservation> {
        Some(Reservation { last, bound })
    }

    fn grant(token: u64, store_bound: Option<u64>) -> Grant {
        Grant { token, store_bound }
    }

    #[test]
    fn next_token_in_every_situation() {
        let cases = [
            // A new slot: from the clock, reserving a window.
            (None, None, grant(FLOOR, Some(FLOOR + WINDOW))),
            // Inside our window: from memory, nothing to write.
            (
                Some(FLOOR + 10),
                reserved(FLOOR + 3, FLOOR + 10),
                grant(FLOOR + 4, None),
            ),
            // The clock moved past the last token but is still inside the window.
            (
                Some(FLOOR + WINDOW),
                reserved(FLOOR - 5_000, FLOOR + WINDOW),
                grant(FLOOR, None),
            ),
            // The window is used up: a new one.
            (
                Some(FLOOR + 10),
                reserved(FLOOR + 10, FLOOR + 10),
                grant(FLOOR + 11, Some(FLOOR + 11 + WINDOW)),
            ),
            // The clock ran past the window.
            (
                Some(FLOOR - 1),
                reserved(FLOOR - 9, FLOOR - 1),
                grant(FLOOR, Some(FLOOR + WINDOW)),
            ),
            // Someone else moved the bound (another node, a reload): above it, new window.
            (
                Some(FLOOR + 50),
                reserved(FLOOR + 3, FLOOR + 10),
                grant(FLOOR + 51, Some(FLOOR + 51 + WINDOW)),
            ),
            // The bound was flushed: above what we handed out ourselves, and the clock.
            (
                None,
                reserved(FLOOR + 7, FLOOR + 10),
                grant(FLOOR + 8, Some(FLOOR + 8 + WINDOW)),
            ),
            // An old counter that held the last token (or a bound behind the clock).
            (Some(41), None, grant(FLOOR, Some(FLOOR + WINDOW))),
            // A bound ahead of the clock (a busy slot, or a restart): above it.
            (
                Some(FLOOR + 500),
                None,
                grant(FLOOR + 501, Some(FLOOR + 501 + WINDOW)),
            ),
            // Near the integer limit the window ends at the limit.
            (
                Some(MAX_STORED_INTEGER - 10),
                None,
                grant(MAX_STORED_INTEGER - 9, Some(MAX_STORED_INTEGER)),
            ),
        ];
        for (stored, reservation, want) in cases {
            assert_eq!(
                next_token(stored, reservation, NOW),
                Ok(want),
                "{stored:?} {reservation:?}"
            );
        }
    }

    /// A counter written near `i64::MAX`: tokens rise to the limit, each once, and then every
    /// grant is refused — even after the counter is flushed, since this process handed the
    /// limit out itself. Nothing ever repeats or saturates.
    #[test]
    fn tokens_never_repeat_at_the_integer_limit() {
        let mut stored = Some(MAX_STORED_INTEGER - 7);
        let mut reservation = None;
        let mut seen = Vec::new();
        loop {
            match next_token(stored, reservation, NOW) {
                Ok(g) => {
                    assert!(seen.last().is_none_or(|last| g.token > *last));
                    seen.push(g.token);
                    if let Some(bound) = g.store_bound {
                        stored = Some(bound);
                    }
                    reservation = g.reservation(reservation);
                }
                Err(e) => {
                    assert_eq!(e, LockError::TokensExhausted);
                    break;
                }
            }
        }
        assert_eq!(seen.len(), 7);
        assert_eq!(seen.last(), Some(&MAX_STORED_INTEGER));
        assert_eq!(
            next_token(None, reservation, NOW),
            Err(LockError::TokensExhausted)
        );
        assert_eq!(
            next_token(Some(MAX_STORED_INTEGER), None, NOW),
            Err(LockError::TokensExhausted)
        );
        // A stored value past i64::MAX cannot be read (parse_positive refuses it), but the
        // decision refuses it too.
        assert_eq!(
            next_token(Some(u64::MAX), None, NOW),
            Err(LockError::TokensExhausted)
        );
    }

    /// Replays grants through a store that can lose or roll back its bound, and checks that
    /// tokens only ever rise.
    #[test]
    fn tokens_rise_through_restarts_rollbacks_and_clock_jumps() {
        let mut stored: Option<u64> = None;
        let mut reservation: Option<Reservation> = None;
        let mut snapshot: Option<u64> = None;
        let mut highest = 0;
        let mut now = NOW;
        for step in 0..10_000u64 {
            now += step % 3; // several grants per millisecond, sometimes
            match step % 1_000 {
                // An RDB snapshot, and later a restart from it: memory and newer bounds lost.
                100 => snapshot = stored,
                700 => {
                    stored = snapshot;
                    reservation = None;
                    now += 50;
                }
                // FLUSHALL.
                400 => stored = None,
                // The clock goes back a little (NTP step).
                900 => now -= 20,
                _ => {}
            }
            let grant = next_token(stored, reservation, now).unwrap();
            assert!(grant.token > highest, "step {step}: {grant:?} <= {highest}");
            highest = grant.token;
            if let Some(bound) = grant.store_bound {
                assert!(bound >= grant.token);
                stored = Some(bound);
            }
            reservation = grant.reservation(reservation);
            assert!(stored.is_some_and(|b| b >= highest));
        }
    }

    #[test]
    fn a_reservation_follows_the_grant() {
        let r = reserved(5, 10);
        assert_eq!(grant(6, None).reservation(r), reserved(6, 10));
        assert_eq!(grant(11, Some(20)).reservation(r), reserved(11, 20));
        assert_eq!(grant(11, Some(20)).reservation(None), reserved(11, 20));
    }

    #[test]
    fn tokens_stay_exact_in_javascript_for_centuries() {
        let year_2200 = 7_258_118_400_000;
        assert!(next_token(None, None, year_2200).unwrap().token + WINDOW < 1 << 53);
    }
}
