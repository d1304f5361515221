//! The unlock channel, named the way Redisson names it so that Redisson clients waiting on a lock
//! wake up when a LOCK.* client frees it.

/// Redisson's `prefixName`: `prefix:{key}`, or `prefix:key` when the key already has a `{`.
/// An empty prefix means "do not publish".
pub fn unlock_channel(prefix: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    if prefix.is_empty() {
        return None;
    }
    let mut channel = Vec::with_capacity(prefix.len() + key.len() + 3);
    channel.extend_from_slice(prefix);
    if key.contains(&b'{') {
        channel.push(b':');
        channel.extend_from_slice(key);
    } else {
        channel.extend_from_slice(b":{");
        channel.extend_from_slice(key);
        channel.push(b'}');
    }
    Some(channel)
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
