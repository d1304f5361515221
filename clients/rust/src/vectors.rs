//! The shared test vectors (`clients/vectors`, see its README), read by this crate's tests: each
//! file's rows, with their `\xHH` escapes decoded.

/// The rows of one vector file: its lines that are not comments, split at tabs.
pub(crate) fn rows(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| line.split('\t').collect())
        .collect()
}

/// A row's column, empty past its end.
pub(crate) fn column<'a>(row: &[&'a str], at: usize) -> &'a str {
    row.get(at).copied().unwrap_or("")
}

/// A column's bytes: `\xHH` is the byte HH, `\\` a backslash.
pub(crate) fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        match (b, bytes.get(at + 1)) {
            (b'\\', Some(b'\\')) => {
                out.push(b'\\');
                at += 2;
            }
            (b'\\', Some(b'x')) => {
                let hex = std::str::from_utf8(bytes.get(at + 2..at + 4).expect("\\xHH"));
                out.push(u8::from_str_radix(hex.expect("hex"), 16).expect("hex"));
                at += 4;
            }
            _ => {
                out.push(b);
                at += 1;
            }
        }
    }
    out
}

pub(crate) const LOST_MESSAGES: &str = include_str!("../../vectors/lost-messages.tsv");
pub(crate) const LEADER_MESSAGES: &str = include_str!("../../vectors/leader-messages.tsv");
pub(crate) const CHANNELS: &str = include_str!("../../vectors/channels.tsv");
pub(crate) const ERROR_LINES: &str = include_str!("../../vectors/error-lines.tsv");

// The module is compiled for tests only (lib.rs): no second `cfg(test)` here.
mod tests {
    use super::*;
    use crate::error::{missing_rule, refused_command, LockError};
    use crate::hold::not_yet;
    use crate::lost::LostReason;
    use crate::reply::{fence_refusal, is_final};

    #[test]
    fn error_lines_read_as_the_shared_vectors_say() {
        let rows = rows(ERROR_LINES);
        assert!(rows.len() > 15);
        for row in rows {
            let line = column(&row, 0);
            assert_eq!(is_final(line), column(&row, 1) == "final", "{row:?}");
            let fence = match column(&row, 2) {
                "gone" => Some(LostReason::HoldGone),
                "token-not-current" => Some(LostReason::TokenNotCurrent),
                _ => None,
            };
            assert_eq!(fence_refusal(line), fence, "{row:?}");
            let server = LockError::Server(line.to_string());
            assert_eq!(not_yet(&server), column(&row, 3) == "not-yet", "{row:?}");
            if line.starts_with("NOPERM") {
                let named = refused_command(line).unwrap_or_default();
                assert_eq!(named, column(&row, 4), "{row:?}");
                let command = if named.is_empty() {
                    "LOCK.ACQUIRE"
                } else {
                    &named
                };
                assert_eq!(missing_rule(command, line), column(&row, 5), "{row:?}");
            }
        }
    }
}
