//! How the library's connections introduce themselves, so that `CLIENT LIST` shows which
//! connection is whose: every connection a client opens to one node is named
//! `redis-lock-client:<client id>` (`CLIENT SETNAME`; a hold's owner is `<client id>:<n>`), and
//! says `CLIENT SETINFO LIB-NAME redis-lock-client` and `LIB-VER <crate version>` where the
//! server has that command (Redis >= 7.2, Valkey).

use redis::Cmd;

/// The `CLIENT SETINFO LIB-NAME` the library's connections send (where the server has it:
/// Redis >= 7.2, Valkey); `LIB-VER` is the crate's version.
pub(crate) const LIB_NAME: &str = "redis-lock-client";

/// The name (`CLIENT SETNAME`) of every connection a client opens to one node:
/// `redis-lock-client:<client id>`; a hold's owner is `<client id>:<n>`.
pub(crate) fn client_name(id: &str) -> String {
    format!("{LIB_NAME}:{id}")
}

/// `settings` with the library's name and version for `CLIENT SETINFO`.
pub(crate) fn with_lib_name(settings: redis::RedisConnectionInfo) -> redis::RedisConnectionInfo {
    settings.set_lib_name(LIB_NAME, env!("CARGO_PKG_VERSION"))
}

/// `CLIENT SETNAME name`.
pub(crate) fn setname(name: &str) -> Cmd {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("SETNAME").arg(name);
    cmd
}
