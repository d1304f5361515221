//! The unlock channel, named the way Redisson names it so that Redisson clients waiting on a lock
//! wake up when a LOCK.* client frees it.

/// Redisson's `prefixName`: `prefix:{key}`, or `prefix:key` when the key already has a `{`.
/// An empty prefix means "do not publish".
pub fn unlock_channel(prefix: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    let mut channel = Vec::with_capacity(prefix.len() + key.len() + 3);
    write_unlock_channel(prefix, key, &mut channel).then_some(channel)
}

/// [`unlock_channel`] into `out` (cleared first), so that a caller can reuse one buffer;
/// false when the prefix is empty.
pub fn write_unlock_channel(prefix: &[u8], key: &[u8], out: &mut Vec<u8>) -> bool {
    out.clear();
    if prefix.is_empty() {
        return false;
    }
    out.extend_from_slice(prefix);
    if key.contains(&b'{') {
        out.push(b':');
        out.extend_from_slice(key);
    } else {
        out.extend_from_slice(b":{");
        out.extend_from_slice(key);
        out.push(b'}');
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_follow_redisson() {
        type Case<'a> = (&'a [u8], &'a [u8], Option<&'a [u8]>);
        let cases: [Case; 3] = [
            (
                b"redisson_lock__channel",
                b"orders:42",
                Some(b"redisson_lock__channel:{orders:42}"),
            ),
            (
                b"redisson_lock__channel",
                b"{tenant}:orders",
                Some(b"redisson_lock__channel:{tenant}:orders"),
            ),
            (b"", b"k", None),
        ];
        for (prefix, key, want) in cases {
            assert_eq!(unlock_channel(prefix, key).as_deref(), want);
        }
    }
}
