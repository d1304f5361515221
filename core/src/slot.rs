//! Redis Cluster hash slots, and the per-slot key that holds the fencing-token counter.
//!
//! Tokens must rise across holds of a key even after the key is deleted, so the counter cannot
//! live in the lock's own hash. One counter per *slot* (not per key) bounds the memory to at most
//! 16,384 small keys however many distinct locks are ever taken, and keeps the counter in the
//! lock key's slot, so it replicates, persists and migrates with it.

use std::sync::OnceLock;

pub const SLOTS: usize = 16_384;

/// CRC16-CCITT (XMODEM) lookup table, computed at compile time (where an out-of-range index
/// is a compile error, not a panic).
#[allow(clippy::indexing_slicing)]
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16-CCITT (XMODEM), as Redis Cluster uses it.
pub fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        let index = usize::from(((crc >> 8) ^ u16::from(b)) & 0xff);
        (crc << 8) ^ CRC16_TABLE.get(index).copied().unwrap_or(0)
    })
}

/// The slot of a key, honouring `{hash tags}` exactly as Redis does.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let after = key.get(open + 1..)?;
            let len = after.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| after.get(..len)).flatten()
        })
        .unwrap_or(key);
    crc16(hashed) & (SLOTS as u16 - 1)
}

const COUNTER_PREFIX: &[u8] = b"__lock_fence__{";

/// The name of the counter key for `slot`: `__lock_fence__{<tag>}`, where `<tag>` is the first
/// string in a fixed enumeration that hashes to `slot`. The enumeration must never change: the
/// counter names are data on users' servers.
pub fn counter_key(slot: u16) -> Vec<u8> {
    slot_key(COUNTER_PREFIX, slot)
}

const LEADERS_PREFIX: &[u8] = b"__lock_fence__leaders{";

/// The name of the hash that keeps the values leaders proclaimed for the election keys of
/// `slot` (field: the election key, value: the epoch and the value): `__lock_fence__leaders{<tag>}`,
/// in the reserved namespace and in the slot (it replicates, persists and migrates with the
/// keys it describes).
pub fn leaders_key(slot: u16) -> Vec<u8> {
    slot_key(LEADERS_PREFIX, slot)
}

/// `<prefix><tag>}`: a name in `slot` (the prefix ends with the hash tag's `{`): the token
/// counters, the proclamations and the tickets (`crate::ticket`) are named so.
pub fn slot_key(prefix: &[u8], slot: u16) -> Vec<u8> {
    let tag = slot_tags()
        .get(usize::from(slot) % SLOTS)
        .copied()
        .unwrap_or_default();
    let mut name = Vec::with_capacity(prefix.len() + 5);
    name.extend_from_slice(prefix);
    name.extend_from_slice(tag.as_bytes());
    name.push(b'}');
    name
}

/// A tag of at most four base-36 characters, stored inline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tag {
    len: u8,
    bytes: [u8; 4],
}

impl Tag {
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or_default()
    }
}

fn slot_tags() -> &'static [Tag] {
    static TAGS: OnceLock<Vec<Tag>> = OnceLock::new();
    TAGS.get_or_init(|| {
        const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
        let mut tags = vec![Tag::default(); SLOTS];
        let mut missing = SLOTS;
        'lengths: for len in 1..=4u8 {
            let total = 36u32.pow(u32::from(len));
            for mut n in 0..total {
                let mut tag = Tag { len, bytes: [0; 4] };
                for i in (0..usize::from(len)).rev() {
                    if let (Some(slot), Some(&digit)) =
                        (tag.bytes.get_mut(i), DIGITS.get((n % 36) as usize))
                    {
                        *slot = digit;
                    }
                    n /= 36;
                }
                let slot = usize::from(crc16(tag.as_bytes()) & (SLOTS as u16 - 1));
                if let Some(entry) = tags.get_mut(slot) {
                    if entry.len == 0 {
                        *entry = tag;
                        missing -= 1;
                        if missing == 0 {
                            break 'lengths;
                        }
                    }
                }
            }
        }
        tags
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.0.
        let cases: [(&[u8], u16); 6] = [
            (b"foo", 12182),
            (b"bar", 5061),
            (b"{user1000}.following", 3443),
            (b"{user1000}.followers", 3443),
            (b"foo{}{bar}", 8363),
            (b"foo{{bar}}zap", 4015),
        ];
        for (key, slot) in cases {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn every_slot_has_a_counter_key_in_that_slot() {
        let mut seen = std::collections::HashSet::new();
        for slot in 0..SLOTS as u16 {
            let name = counter_key(slot);
            assert_eq!(key_slot(&name), slot, "{}", String::from_utf8_lossy(&name));
            assert!(seen.insert(name));
        }
    }

    #[test]
    fn counter_names_are_stable() {
        // These names are stored on users' servers: changing the enumeration breaks tokens.
        assert_eq!(counter_key(key_slot(b"foo")), counter_key(12182));
        let name = counter_key(0);
        assert!(name.starts_with(b"__lock_fence__{") && name.ends_with(b"}"));
    }
}
