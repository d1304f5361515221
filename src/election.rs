//! Carrying out an election's effects: a new leader (and the value it proclaims) is stored and
//! announced on the key's leader channel (in the database selected on the context). The rules are `lock_core::election`'s.

use lock_core::signal;

use crate::ffi::{self, Ctx};
use crate::{notify, store};

/// `owner` became the leader of `name` in `epoch`: keep the value it proclaims (if any), then
/// tell the observers, the election first.
pub fn announce(ctx: Ctx, name: &[u8], epoch: u64, owner: &[u8], value: Option<&[u8]>) {
    if let Some(value) = value {
        store::write_proclaimed(ctx, name, epoch, value);
    }
    let db = ffi::selected_db(ctx);
    notify::publish_leader(ctx, name, &signal::elected(db, name, epoch, owner));
    if let Some(value) = value {
        notify::publish_leader(ctx, name, &signal::proclaimed(db, name, epoch, value));
    }
}

/// The leader of `epoch` proclaims `value`: keep it and tell the observers.
pub fn proclaim(ctx: Ctx, name: &[u8], epoch: u64, value: &[u8]) {
    store::write_proclaimed(ctx, name, epoch, value);
    let db = ffi::selected_db(ctx);
    notify::publish_leader(ctx, name, &signal::proclaimed(db, name, epoch, value));
}
