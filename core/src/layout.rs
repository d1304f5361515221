//! What the module stores and the names it reserves, shared by the parser, the state machine,
//! the lock family and the token counters: the fence and mode fields, the counter namespace,
//! and how stored integers are read. Kept apart so that `args` and `hold` depend on it
//! rather than on each other.

/// The hash field that carries the fencing token of the current hold.
pub const FENCE_FIELD: &[u8] = b"__fence__";
pub const FENCE_FIELD_DISPLAY: &str = "__fence__";

/// The hash field naming what a multi-hold key is (`rw` or `semaphore:<n>`, see
/// [`crate::hold`]). A hash that has it is never in Redisson's `RLock` layout.
pub const MODE_FIELD: &[u8] = b"__mode__";
pub const MODE_FIELD_DISPLAY: &str = "__mode__";

/// Keys starting with this belong to the module (the per-slot token counters,
/// `__lock_fence__{<tag>}`): no LOCK.* command accepts one as a lock key, so a lock can never
/// share its key with a counter.
pub const RESERVED_KEY_PREFIX: &[u8] = b"__lock_fence__";
pub const RESERVED_KEY_PREFIX_DISPLAY: &str = "__lock_fence__";

/// The largest re-entry count and fencing token: both are stored as Redis integers and sent as
/// RESP integers, which are signed 64-bit.
pub const MAX_STORED_INTEGER: u64 = i64::MAX as u64;

/// Whether `key` is in the module's reserved namespace.
pub fn is_reserved_key(key: &[u8]) -> bool {
    key.starts_with(RESERVED_KEY_PREFIX)
}

/// Parses an integer the way Redis's `string2ll` does: optional `-`, decimal digits, no sign
/// `+`, no spaces, no leading zeros, and it must fit in an `i64`.
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if digits.len() > 1 && digits.first() == Some(&b'0') {
        return None;
    }
    if negative && digits == b"0" {
        return None;
    }
    // At most 20 digits (checked above): u64 with checked steps holds every i64 magnitude and
    // notices any overflow.
    let mut magnitude: u64 = 0;
    for d in digits {
        magnitude = magnitude
            .checked_mul(10)?
            .checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        // i64::MIN's magnitude is one more than i64::MAX.
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Parses a stored positive count or token (as written by HINCRBY/HSET): `1 ..= i64::MAX`.
pub fn parse_positive(bytes: &[u8]) -> Option<u64> {
    parse_i64(bytes)
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_like_redis() {
        let cases: [(&[u8], Option<i64>); 10] = [
            (b"0", Some(0)),
            (b"-7", Some(-7)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"9223372036854775808", None),
            (b"-0", None),
            (b"007", None),
            (b" 1", None),
            (b"", None),
            (b"-", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_i64(input),
                want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        assert_eq!(parse_positive(b"3"), Some(3));
        assert_eq!(parse_positive(b"0"), None);
        assert_eq!(parse_positive(b"-3"), None);
        assert_eq!(
            parse_positive(b"9223372036854775807"),
            Some(MAX_STORED_INTEGER)
        );
    }

    #[test]
    fn the_counter_namespace_is_reserved() {
        assert!(is_reserved_key(b"__lock_fence__{foo}"));
        assert!(is_reserved_key(b"__lock_fence__"));
        assert!(!is_reserved_key(b"__lock_fenc"));
        assert!(!is_reserved_key(b"x__lock_fence__{foo}"));
    }
}
