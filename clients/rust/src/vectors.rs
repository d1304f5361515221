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
