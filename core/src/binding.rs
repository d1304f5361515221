//! Holds bound to the connection that took them (`EPHEMERAL`): they end when it closes.
//!
//! A grant is identified by its key's slot and its token (tokens never repeat within a slot,
//! across databases and flushes; see `token`), so the index from a hold to its connection is
//! two integers. Each connection keeps the list of its holds, so that closing it costs in
//! proportion to its own holds only.

use std::collections::HashMap;

use crate::hold::HoldKind;
use crate::queue::LockKey;

/// The server's id of a client connection.
pub type ClientId = u64;

/// One bound hold, as its connection lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub key: LockKey,
    /// The key's slot: with the token, the grant's identity (tokens repeat across slots).
    pub slot: u16,
    pub kind: HoldKind,
    pub token: u64,
}

impl Bound {
    pub fn new(key: &LockKey, kind: HoldKind, token: u64) -> Bound {
        Bound {
            key: key.clone(),
            slot: crate::slot::key_slot(&key.name),
            kind,
            token,
        }
    }
}

#[derive(Debug, Default)]
pub struct Bindings {
    by_grant: HashMap<(u16, u64), ClientId>,
    by_client: HashMap<ClientId, Vec<Bound>>,
}

impl Bindings {
    /// Binds the hold granted with `token` on `key` (in `slot`) to `client`.
    pub fn bind(&mut self, client: ClientId, bound: Bound) {
        self.by_grant.insert((bound.slot, bound.token), client);
        self.by_client.entry(client).or_default().push(bound);
    }

    /// The connection the grant is bound to, if any.
    pub fn client_of(&self, slot: u16, token: u64) -> Option<ClientId> {
        self.by_grant.get(&(slot, token)).copied()
    }

    /// The hold ended (released by its owner): forget its binding.
    pub fn unbind(&mut self, slot: u16, token: u64) {
        let Some(client) = self.by_grant.remove(&(slot, token)) else {
            return;
        };
        if let Some(list) = self.by_client.get_mut(&client) {
            if let Some(i) = list.iter().position(|b| b.token == token && b.slot == slot) {
                list.swap_remove(i);
            }
            if list.is_empty() {
                self.by_client.remove(&client);
            }
        }
    }

    /// The connection closed: every hold it had bound, for the caller to end.
    pub fn take_client(&mut self, client: ClientId) -> Vec<Bound> {
        let list = self.by_client.remove(&client).unwrap_or_default();
        for bound in &list {
            let key = (bound.slot, bound.token);
            if self.by_grant.get(&key) == Some(&client) {
                self.by_grant.remove(&key);
            }
        }
        list
    }

    /// Holds of `client` that may have ended by other means (DEL, lease end, FORCERELEASE):
    /// `keep` says which still exist. Called when a connection's list has grown, so that a
    /// long-lived connection does not accumulate bindings of holds long gone.
    pub fn prune(&mut self, client: ClientId, mut keep: impl FnMut(&Bound) -> bool) {
        let Some(list) = self.by_client.get_mut(&client) else {
            return;
        };
        let by_grant = &mut self.by_grant;
        list.retain(|b| {
            let live = keep(b);
            if !live {
                by_grant.remove(&(b.slot, b.token));
            }
            live
        });
    }

    /// Forgets every binding (the server became a replica: its connections bind nothing there,
    /// and a later promotion must not revive them).
    pub fn clear(&mut self) {
        self.by_grant.clear();
        self.by_client.clear();
    }

    pub fn holds_of(&self, client: ClientId) -> usize {
        self.by_client.get(&client).map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.by_grant.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_grant.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(name: &str, slot: u16, token: u64) -> Bound {
        Bound {
            key: LockKey::new(0, name.as_bytes()),
            slot,
            kind: HoldKind::Exclusive,
            token,
        }
    }

    #[test]
    fn a_closed_connection_gives_back_its_own_holds_only() {
        let mut b = Bindings::default();
        b.bind(7, bound("a", 1, 10));
        b.bind(7, bound("b", 2, 11));
        b.bind(8, bound("c", 1, 12));
        assert_eq!(b.client_of(1, 10), Some(7));
        assert_eq!(b.client_of(2, 10), None, "the slot is part of the identity");
        let gone = b.take_client(7);
        assert_eq!(gone, [bound("a", 1, 10), bound("b", 2, 11)]);
        assert_eq!(b.client_of(1, 10), None);
        assert_eq!(b.client_of(1, 12), Some(8));
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn a_release_unbinds_its_own_grant_not_one_with_the_same_token_in_another_slot() {
        let mut b = Bindings::default();
        b.bind(7, bound("a", 1, 10));
        b.bind(7, bound("b", 2, 10));
        b.unbind(2, 10);
        assert_eq!(b.client_of(1, 10), Some(7));
        assert_eq!(b.take_client(7), [bound("a", 1, 10)]);
    }

    #[test]
    fn a_release_unbinds_and_pruning_drops_holds_gone_otherwise() {
        let mut b = Bindings::default();
        for t in 0..10 {
            b.bind(7, bound("a", 1, t));
        }
        b.unbind(1, 3);
        assert_eq!(b.client_of(1, 3), None);
        assert_eq!(b.holds_of(7), 9);
        b.prune(7, |h| h.token % 2 == 0);
        assert_eq!(b.holds_of(7), 5);
        assert_eq!(b.client_of(1, 5), None);
        assert_eq!(b.client_of(1, 4), Some(7));
        for t in [0, 2, 4, 6, 8] {
            b.unbind(1, t);
        }
        assert!(b.is_empty());
        assert_eq!(b.holds_of(7), 0);
    }
}
