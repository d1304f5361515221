//! The channels the server publishes on: a key's lost-hold channel (and the flush channel), and
//! a key's leader channel. Named as Redisson names its channels, so that a key's channel hashes
//! to the key's slot.

/// The server's default `lock.lost-channel-prefix`. A server configured with another prefix is
/// listened to with [`LockClientBuilder::lost_signal_prefix`](crate::LockClientBuilder::lost_signal_prefix).
pub const DEFAULT_LOST_SIGNAL_PREFIX: &str = "lock.lost";

/// The server's default `lock.leader-channel-prefix`.
pub const DEFAULT_LEADER_CHANNEL_PREFIX: &str = "lock.leader";

/// The channel the server publishes a key's lost-hold messages on with the default prefix:
/// `lock.lost:{KEY}`, or `lock.lost:KEY` when KEY already contains `{` (so the channel hashes to
/// the key's slot). Keys `a` and `{a}` share a channel; each message names its key.
///
/// ```
/// use redis_lock_client::lost_signal_channel;
///
/// assert_eq!(lost_signal_channel(b"orders:42"), b"lock.lost:{orders:42}");
/// assert_eq!(lost_signal_channel(b"{orders}:42"), b"lock.lost:{orders}:42");
/// ```
pub fn lost_signal_channel(key: &[u8]) -> Vec<u8> {
    lost_signal_channel_with_prefix(DEFAULT_LOST_SIGNAL_PREFIX.as_bytes(), key)
}

/// [`lost_signal_channel`] for a server whose `lock.lost-channel-prefix` is `prefix`:
/// `<prefix>:{KEY}`, or `<prefix>:KEY` when KEY contains `{`.
pub fn lost_signal_channel_with_prefix(prefix: &[u8], key: &[u8]) -> Vec<u8> {
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
    channel
}

/// The channel an election key's leaders are announced on: `lock.leader:{KEY}`, or
/// `lock.leader:KEY` when KEY contains `{` (named as the lost-hold channel).
pub fn leader_channel(key: &[u8]) -> Vec<u8> {
    lost_signal_channel_with_prefix(DEFAULT_LEADER_CHANNEL_PREFIX.as_bytes(), key)
}

/// The channel a release that frees a key publishes on (the unlock message, Redisson's
/// `redisson_lock__channel:{KEY}`, named as the lost-hold channel): what an acquire waiting on
/// the `redislock` Functions library listens to.
pub(crate) fn unlock_channel(key: &[u8]) -> Vec<u8> {
    lost_signal_channel_with_prefix(b"redisson_lock__channel", key)
}

/// The channel of the flush message: `<prefix>:flush` (no `{`, so no key's channel is this one).
pub(crate) fn flush_channel(prefix: &[u8]) -> Vec<u8> {
    [prefix, b":flush"].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_follow_redisson() {
        assert_eq!(lost_signal_channel(b"orders:42"), b"lock.lost:{orders:42}");
        assert_eq!(
            lost_signal_channel(b"{tenant}:orders"),
            b"lock.lost:{tenant}:orders"
        );
        // Another prefix, as the server names it (core/src/channel.rs).
        assert_eq!(
            lost_signal_channel_with_prefix(b"app.lost", b"orders:42"),
            b"app.lost:{orders:42}"
        );
        assert_eq!(
            lost_signal_channel_with_prefix(b"app.lost", b"{tenant}:orders"),
            b"app.lost:{tenant}:orders"
        );
        assert_eq!(flush_channel(b"app.lost"), b"app.lost:flush");
        assert_eq!(leader_channel(b"svc"), b"lock.leader:{svc}");
        // `a` and `{a}` share a channel: the messages name their key.
        assert_eq!(lost_signal_channel(b"a"), lost_signal_channel(b"{a}"));
    }

    #[test]
    fn channels_are_named_as_the_shared_vectors_say() {
        use crate::vectors::{column, rows, unescape, CHANNELS};
        let rows = rows(CHANNELS);
        assert!(rows.len() > 3);
        for row in rows {
            let key = unescape(column(&row, 0));
            assert_eq!(
                lost_signal_channel(&key),
                unescape(column(&row, 1)),
                "{row:?}"
            );
            assert_eq!(leader_channel(&key), unescape(column(&row, 2)), "{row:?}");
            assert_eq!(unlock_channel(&key), unescape(column(&row, 3)), "{row:?}");
        }
    }
}
