//! What the module stores and the names it reserves, shared by the parser, the state machine,
//! the lock family and the token counters: the mode field (and the old layout's names), the
//! counter namespace, and how stored integers are read. Kept apart so that `args` and `hold` depend on it
//! rather than on each other.

/// The hash field naming what a lock key is: `exclusive:<token>` for one exclusive hold in
/// Redisson's `RLock` layout (the value carries the hold's fencing token), `rw` or
/// `semaphore:<n>` for a multi-hold key (see [`crate::hold`]). It has the name Redisson's
/// `RReadWriteLock` scripts read, and none of these values is one they take (`read`, `write`):
/// to them every module key is busy.
pub const MODE_FIELD: &[u8] = b"mode";
pub const MODE_FIELD_DISPLAY: &str = "mode";

/// How `mode`'s value starts on an exclusive key in Redisson's `RLock` layout.
pub const EXCLUSIVE_MODE_PREFIX: &[u8] = b"exclusive:";

/// The field that carried the fencing token of an `RLock`-layout key before the token moved into
/// `mode` (the old layout): still read, and removed by the key's next module write.
pub const FENCE_FIELD: &[u8] = b"__fence__";
pub const FENCE_FIELD_DISPLAY: &str = "__fence__";

/// The name the mode field of a multi-hold key had before it became `mode` (the old layout):
/// still read, and renamed by the key's next module write.
pub const LEGACY_MODE_FIELD: &[u8] = b"__mode__";
pub const LEGACY_MODE_FIELD_DISPLAY: &str = "__mode__";

/// Whether an owner name is one of the lock's own fields, which no LOCK.* command accepts as an
/// owner.
pub fn is_reserved_owner(owner: &[u8]) -> bool {
    owner == MODE_FIELD || owner == FENCE_FIELD || owner == LEGACY_MODE_FIELD
}

/// The token in `mode`'s value `exclusive:<token>` (None for any other value). Costs what
/// parsing the token alone costs: a prefix compare, no allocation.
pub fn parse_exclusive_mode(value: &[u8]) -> Option<u64> {
    parse_positive(value.strip_prefix(EXCLUSIVE_MODE_PREFIX)?)
}

/// Writes `exclusive:<token>` into `buf` and returns it (no allocation: `exclusive:` and at most
/// 20 digits always fit). On the hot path: every new exclusive hold stores it.
pub fn format_exclusive_mode(token: u64, buf: &mut [u8; 30]) -> &[u8] {
    let mut digits = [0u8; 20];
    let digits = format_u64(token, &mut digits);
    let len = EXCLUSIVE_MODE_PREFIX.len() + digits.len();
    let (prefix, rest) = buf.split_at_mut(EXCLUSIVE_MODE_PREFIX.len());
    prefix.copy_from_slice(EXCLUSIVE_MODE_PREFIX);
    if let Some(tail) = rest.get_mut(..digits.len()) {
        tail.copy_from_slice(digits);
    }
    buf.get(..len).unwrap_or_default()
}

/// Formats `value` in decimal into `buf` and returns the digits: what the module stores for
/// counts, tokens and times, without the formatting machinery or an allocation.
pub fn format_u64(mut value: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        if let Some(slot) = buf.get_mut(at) {
            *slot = b'0' + (value % 10) as u8;
        }
        value /= 10;
        if value == 0 || at == 0 {
            break;
        }
    }
    buf.get(at..).unwrap_or_default()
}

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
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    if digits.len() > 1 && digits.first() == Some(&b'0') {
        return None;
    }
    if negative && digits == b"0" {
        return None;
    }
    // One pass, digits checked as they come. Up to 19 digits cannot overflow a u64 (10^19 - 1
    // < 2^64); the 20th digit is added with checked steps. u64 holds every i64 magnitude. On
    // the hot path: every token and count the module reads goes through here.
    let mut magnitude: u64 = 0;
    let (head, tail) = digits.split_at(digits.len().min(19));
    for &d in head {
        let digit = d.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        magnitude = magnitude * 10 + u64::from(digit);
    }
    for &d in tail {
        let digit = d.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        magnitude = magnitude.checked_mul(10)?.checked_add(u64::from(digit))?;
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

    /// `string2ll`'s rules, written the plain way: what the one-pass parser must agree with.
    fn reference_parse(bytes: &[u8]) -> Option<i64> {
        let text = std::str::from_utf8(bytes).ok()?;
        let digits = text.strip_prefix('-').unwrap_or(text);
        let plain = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits.len() == 1 || !digits.starts_with('0'))
            && text != "-0";
        plain.then(|| text.parse::<i64>().ok()).flatten()
    }

    proptest::proptest! {
        #[test]
        fn the_one_pass_parser_agrees_with_the_plain_rules(
            text in "-?[0-9]{0,21}|[-+ 0-9a]{0,22}|-?9223372036854775[0-9]{3}"
        ) {
            proptest::prop_assert_eq!(parse_i64(text.as_bytes()), reference_parse(text.as_bytes()));
        }
    }

    #[test]
    fn the_exclusive_mode_value_carries_the_token() {
        let mut buf = [0u8; 30];
        for token in [1, 7, 1_732_370_000_123_004, MAX_STORED_INTEGER] {
            let text = format_exclusive_mode(token, &mut buf).to_vec();
            assert_eq!(text, format!("exclusive:{token}").into_bytes());
            assert_eq!(parse_exclusive_mode(&text), Some(token));
        }
        let refused: [&[u8]; 7] = [
            b"exclusive:",
            b"exclusive:abc",
            b"exclusive:0",
            b"exclusive:-1",
            b"exclusive",
            b"bogus",
            b"7",
        ];
        for value in refused {
            assert_eq!(parse_exclusive_mode(value), None, "{value:?}");
        }
    }

    #[test]
    fn integers_are_formatted_as_their_decimal_digits() {
        let mut buf = [0u8; 20];
        for value in [0, 1, 9, 10, 1_732_370_000_123_004, u64::MAX] {
            assert_eq!(format_u64(value, &mut buf), value.to_string().as_bytes());
        }
    }

    #[test]
    fn the_lock_fields_are_reserved_owners() {
        for owner in [&b"mode"[..], b"__fence__", b"__mode__"] {
            assert!(is_reserved_owner(owner));
        }
        assert!(!is_reserved_owner(b"modes"));
    }

    #[test]
    fn the_counter_namespace_is_reserved() {
        assert!(is_reserved_key(b"__lock_fence__{foo}"));
        assert!(is_reserved_key(b"__lock_fence__"));
        assert!(!is_reserved_key(b"__lock_fenc"));
        assert!(!is_reserved_key(b"x__lock_fence__{foo}"));
    }
}
