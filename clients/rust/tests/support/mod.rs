//! The project's one test kit (`lock-testkit`): real servers with the module loaded, on free
//! loopback ports ($LOCK_SERVER, $LOCK_MODULE as for every other test of the project).

pub use lock_testkit::{server_info, Server, ServerKind};

/// Whether the server reports every key removal to modules (the key server event: Redis >= 7.2
/// and Valkey): only there does the module see DEL, SET over a key, RENAME and eviction.
// Not every test binary asks (tests/blocking.rs does not).
#[allow(dead_code)]
pub fn reports_key_events() -> bool {
    let info = server_info();
    info.kind == ServerKind::Valkey || info.version >= (7, 2, 0)
}
