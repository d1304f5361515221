//! What names a lock and a connection: a key (its database and name), a client id, and a grant
//! (a key, a kind and a token). A leaf of the crate.

use crate::kind::HoldKind;

/// A lock key: the database it lives in and its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub db: i32,
    pub name: Box<[u8]>,
}

impl LockKey {
    pub fn new(db: i32, name: &[u8]) -> Self {
        LockKey {
            db,
            name: name.into(),
        }
    }
}

/// The server's id of a client connection.
pub type ClientId = u64;

/// One grant, named well enough to end it later: an ephemeral hold whose connection closed, or
/// an undelivered grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRef {
    pub key: LockKey,
    pub kind: HoldKind,
    /// Tokens never repeat on a key: the token names the grant.
    pub token: u64,
}
