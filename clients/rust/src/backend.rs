//! What serves the locks on a server: the `LOCK.*` module, or, where no module can load (a
//! managed Redis), the `redislock` Functions library (`functions/redislock.lua`). How each is
//! found (once per server, in a cluster once per master), and how a `LOCK.*` command is sent
//! to the library (its `FCALL`, with the same arguments and replies). No I/O here but
//! [`detect`]'s, which the connection layer (`conn.rs`) calls.

use std::borrow::Cow;
use std::future::Future;

use redis::{Arg, Cmd, Value};

use crate::error::{command_name, LockError};

/// What serves the locks on a server ([`LockClient::backend`](crate::LockClient::backend)),
/// found at the first lock command sent to it (in a cluster: per master).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// The `LOCK.*` module: everything this library does.
    Module,
    /// No module, the `redislock` Functions library (`FCALL`; a managed Redis): exclusive
    /// locks only, without `EPHEMERAL` holds, fenced commands or the lost-hold signal; a wait
    /// listens to the lock's unlock message and asks again (see the README, *Without the
    /// module*).
    Functions,
}

impl Backend {
    /// Whether a hold can be `EPHEMERAL` (bound to its connection) here.
    pub fn supports_ephemeral(self) -> bool {
        self == Backend::Module
    }
}

/// The version of the `redislock` library (`FCALL_RO lock_version 0`) this crate speaks: a
/// server with an older one, or none, gets [`LIBRARY`] loaded when the client was built with
/// [`load_functions(true)`](crate::LockClientBuilder::load_functions).
pub(crate) const FUNCTIONS_VERSION: i64 = 2;

/// The `redislock` library shipped with this crate: `redislock.lua` in the crate's directory is a
/// symbolic link to the repository's `functions/redislock.lua`, one source, whose text
/// `cargo package` ships as a file.
pub(crate) const LIBRARY: &str = include_str!("../redislock.lua");

/// What makes a reply of the library's function the `LOCK.*` command's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The same reply.
    AsIs,
    /// `LOCK.CHECK key owner token` sent as a `lock_info` read: 1 while `owner` holds the key
    /// under `token`, else 0.
    Held { owner: Vec<u8>, token: i64 },
}

impl Answer {
    pub(crate) fn apply(&self, reply: Value) -> Value {
        match self {
            Answer::AsIs => reply,
            Answer::Held { owner, token } => {
                Value::Int(i64::from(holder_ttl(&reply, owner, *token).is_some()))
            }
        }
    }
}

/// A command as it is sent to the server's backend, and what makes its reply the command's.
pub(crate) struct Sent<'a> {
    pub(crate) cmd: Cow<'a, Cmd>,
    pub(crate) answer: Answer,
}

/// Whether `cmd` is one of the module's (`LOCK.*`): only those depend on the backend.
pub(crate) fn is_lock_command(cmd: &Cmd) -> bool {
    command_name(cmd).starts_with("LOCK.")
}

/// The key a `LOCK.*` command is about (its slot is the server asked which backend it has):
/// the first key (after `numkeys` for the multi-key commands).
pub(crate) fn key_of(cmd: &Cmd) -> Option<Vec<u8>> {
    let at = if command_name(cmd).starts_with("LOCK.M") {
        2
    } else {
        1
    };
    match cmd.args_iter().nth(at) {
        Some(Arg::Simple(key)) => Some(key.to_vec()),
        _ => None,
    }
}

/// `cmd` as `backend` takes it: as it is for the module (and for any command not `LOCK.*`);
/// for the library, the `FCALL` of its function (`LOCK.CHECK` as a `lock_info` read), or
/// [`LockError::NotSupported`] for what the library cannot do (a command without a function,
/// `SHARED`, `LIMIT`, `EPHEMERAL`, `WAIT`: the library's waits are the client's own).
pub(crate) fn sent_as(backend: Backend, cmd: &Cmd) -> Result<Sent<'_>, LockError> {
    let as_is = || Sent {
        cmd: Cow::Borrowed(cmd),
        answer: Answer::AsIs,
    };
    if backend == Backend::Module || !is_lock_command(cmd) {
        return Ok(as_is());
    }
    on_functions(cmd)
}

/// Each `LOCK.*` command the library has a function for: how it is called.
const FUNCTIONS: [(&str, &str, &str); 6] = [
    ("LOCK.ACQUIRE", "FCALL", "lock_acquire"),
    ("LOCK.CANCEL", "FCALL", "lock_cancel"),
    ("LOCK.RELEASE", "FCALL", "lock_release"),
    ("LOCK.RENEW", "FCALL", "lock_renew"),
    ("LOCK.FORCERELEASE", "FCALL", "lock_forcerelease"),
    ("LOCK.INFO", "FCALL_RO", "lock_info"),
];

/// What each `LOCK.*` command the library has no function for does, in a refusal's words.
const NO_FUNCTION: [(&str, &str); 7] = [
    ("LOCK.MACQUIRE", "multi-key locks"),
    ("LOCK.MRELEASE", "multi-key locks"),
    ("LOCK.MRENEW", "multi-key locks"),
    ("LOCK.GUARD", "fenced commands (LockGuard::fenced)"),
    ("LOCK.CAMPAIGN", "elections"),
    ("LOCK.PROCLAIM", "elections"),
    ("LOCK.LEADER", "elections"),
];

/// The acquire options the library refuses, in a refusal's words (this crate waits on the
/// library through the unlock channel, not with the library's tickets).
const NO_OPTION: [(&str, &str); 5] = [
    ("SHARED", "shared (read) holds"),
    ("LIMIT", "semaphores"),
    ("EPHEMERAL", "EPHEMERAL holds"),
    ("WAIT", "waits in the server"),
    ("TICKET", "waits in the server"),
];

/// The error for `what` (plural: "semaphores") asked of the `redislock` library: the same
/// words as the Python library's.
pub(crate) fn refusal(what: &str) -> LockError {
    LockError::NotSupported(format!(
        "{what} need the LOCK.* module: this server has the redislock Functions library only"
    ))
}

/// [`sent_as`] for the library.
fn on_functions(cmd: &Cmd) -> Result<Sent<'_>, LockError> {
    let name = command_name(cmd);
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .map(|a| match a {
            Arg::Simple(bytes) => bytes,
            _ => b"0".as_slice(),
        })
        .collect();
    let rest = args.get(1..).unwrap_or_default();
    if name == "LOCK.CHECK" {
        let (Some(key), Some(owner), Some(token)) = (args.get(1), args.get(2), args.get(3)) else {
            return Ok(Sent {
                cmd: Cow::Borrowed(cmd),
                answer: Answer::AsIs,
            });
        };
        let token = std::str::from_utf8(token)
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(0);
        let mut read = redis::cmd("FCALL_RO");
        read.arg("lock_info").arg(1).arg(*key);
        return Ok(Sent {
            cmd: Cow::Owned(read),
            answer: Answer::Held {
                owner: owner.to_vec(),
                token,
            },
        });
    }
    if let Some((_, what)) = NO_FUNCTION.iter().find(|(c, _)| *c == name) {
        return Err(refusal(what));
    }
    let Some((_, call, function)) = FUNCTIONS.iter().find(|(c, _, _)| *c == name) else {
        return Err(refusal(&name));
    };
    if name == "LOCK.ACQUIRE" {
        for word in rest.iter().skip(3) {
            let option = String::from_utf8_lossy(word).to_ascii_uppercase();
            if let Some((_, what)) = NO_OPTION.iter().find(|(o, _)| *o == option) {
                return Err(refusal(what));
            }
        }
    }
    let mut sent = redis::cmd(call);
    sent.arg(*function).arg(1);
    for arg in rest {
        sent.arg(*arg);
    }
    Ok(Sent {
        cmd: Cow::Owned(sent),
        answer: Answer::AsIs,
    })
}

/// The fields of a `LOCK.INFO` (`lock_info`) reply: a flat array (RESP2) or a map (RESP3).
fn fields(reply: &Value) -> Vec<(&[u8], &Value)> {
    fn name(v: &Value) -> Option<&[u8]> {
        match v {
            Value::BulkString(b) => Some(b.as_slice()),
            Value::SimpleString(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => name(k).map(|k| (k, v)),
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| name(k).map(|k| (k, v)))
            .collect(),
        _ => Vec::new(),
    }
}

fn field<'a>(reply: &'a Value, wanted: &[u8]) -> Option<&'a Value> {
    fields(reply)
        .into_iter()
        .find(|(k, _)| *k == wanted)
        .map(|(_, v)| v)
}

/// From a `LOCK.INFO` reply: the milliseconds left on the lease of `owner`'s hold under
/// `token` (-1: no lease), or `None` when the server shows no such hold.
pub(crate) fn holder_ttl(reply: &Value, owner: &[u8], token: i64) -> Option<i64> {
    let Some(Value::Array(holders)) = field(reply, b"holders") else {
        return None;
    };
    holders.iter().find_map(|holder| {
        let named = matches!(field(holder, b"owner"), Some(Value::BulkString(o)) if o == owner);
        let tokened = matches!(field(holder, b"token"), Some(Value::Int(t)) if *t == token);
        (named && tokened).then(|| match field(holder, b"ttl") {
            Some(Value::Int(ttl)) => *ttl,
            _ => -1,
        })
    })
}

/// From a `LOCK.INFO` reply: the milliseconds left on the lock's lease (-1: none), or `None`
/// when the lock is free.
pub(crate) fn lease_left(reply: &Value) -> Option<i64> {
    match reply {
        Value::Nil => None,
        reply => match field(reply, b"ttl") {
            Some(Value::Int(ttl)) => Some(*ttl),
            _ => Some(-1),
        },
    }
}

/// Whether a server's error says the backend a command was sent for is not there (any more):
/// the module's commands unknown, or the library's function not found (a `FUNCTION FLUSH`, a
/// `FUNCTION DELETE`, a failover to a server without them). The Python library's rule.
pub(crate) fn says_backend_gone(e: &LockError) -> bool {
    match e {
        LockError::Server(line) => {
            line.starts_with("ERR unknown command 'LOCK.")
                || line.starts_with("ERR unknown command `LOCK.")
                || line.contains("Function not found")
        }
        _ => false,
    }
}

/// What serves locks on a server, asked with `query` (the server's raw connection): the
/// module when `COMMAND INFO` knows `LOCK.ACQUIRE`; else the `redislock` library when
/// `lock_version` answers [`FUNCTIONS_VERSION`] or more; else, with `load`, [`LIBRARY`]
/// loaded (`FUNCTION LOAD REPLACE`); else [`LockError::NotSupported`], which says what to do.
/// An ACL that refuses `COMMAND INFO` leaves the library's answer to tell (none: the module,
/// as the commands' own errors will show). The Python library's rule.
pub(crate) async fn detect<F, Fut>(query: F, load: bool) -> Result<Backend, LockError>
where
    F: Fn(Cmd) -> Fut,
    Fut: Future<Output = Result<Value, LockError>>,
{
    let mut info = redis::cmd("COMMAND");
    info.arg("INFO").arg("LOCK.ACQUIRE");
    let refused = match query(info).await {
        Ok(Value::Array(known)) if known.first().is_some_and(|k| *k != Value::Nil) => {
            return Ok(Backend::Module)
        }
        Ok(_) => false,
        Err(LockError::NoPermission { .. }) => true,
        Err(e) => return Err(e),
    };
    let mut ask = redis::cmd("FCALL_RO");
    ask.arg("lock_version").arg(0);
    let version = match query(ask).await {
        Ok(Value::Int(v)) => Some(v),
        Ok(_) => None,
        Err(LockError::NoPermission { .. }) => return Ok(Backend::Module),
        Err(_) if refused => return Ok(Backend::Module),
        Err(LockError::Server(line)) if line.contains("Function not found") => None,
        Err(e) => return Err(e),
    };
    if version.is_some_and(|v| v >= FUNCTIONS_VERSION) {
        return Ok(Backend::Functions);
    }
    if refused {
        return Ok(Backend::Module);
    }
    if !load {
        let had = match version {
            None => "no redislock library".to_string(),
            Some(v) => format!("redislock library version {v}"),
        };
        return Err(LockError::NotSupported(format!(
            "the server has neither the LOCK.* module nor the redislock Functions library \
             version {FUNCTIONS_VERSION} or newer ({had}): load the module, or load \
             functions/redislock.lua (FUNCTION LOAD REPLACE), or build the client with \
             load_functions(true)"
        )));
    }
    let mut load = redis::cmd("FUNCTION");
    load.arg("LOAD").arg("REPLACE").arg(LIBRARY);
    query(load).await?;
    Ok(Backend::Functions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect()
    }

    fn command(words: &[&str]) -> Cmd {
        let mut cmd = redis::cmd(words[0]);
        for w in &words[1..] {
            cmd.arg(*w);
        }
        cmd
    }

    #[test]
    fn the_crate_ships_the_repositorys_library() {
        let repository =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../functions/redislock.lua");
        let source = std::fs::read_to_string(&repository).expect("functions/redislock.lua");
        assert!(
            source == LIBRARY,
            "clients/rust/redislock.lua differs from functions/redislock.lua: link it again"
        );
        assert!(LIBRARY.contains(&format!("local VERSION = {FUNCTIONS_VERSION}\n")));
    }

    #[test]
    fn commands_as_the_library_takes_them() {
        let cases: [(&[&str], &[&str]); 10] = [
            (
                &["LOCK.ACQUIRE", "k", "o", "500", "ONCE"],
                &["FCALL", "lock_acquire", "1", "k", "o", "500", "ONCE"],
            ),
            (
                &["LOCK.RENEW", "k", "o", "500"],
                &["FCALL", "lock_renew", "1", "k", "o", "500"],
            ),
            (
                &["LOCK.RELEASE", "k", "o"],
                &["FCALL", "lock_release", "1", "k", "o"],
            ),
            (
                &["LOCK.RELEASE", "k", "o", "TOKEN", "7"],
                &["FCALL", "lock_release", "1", "k", "o", "TOKEN", "7"],
            ),
            (
                &["LOCK.FORCERELEASE", "k"],
                &["FCALL", "lock_forcerelease", "1", "k"],
            ),
            (&["LOCK.INFO", "k"], &["FCALL_RO", "lock_info", "1", "k"]),
            (
                &["LOCK.CANCEL", "k", "t"],
                &["FCALL", "lock_cancel", "1", "k", "t"],
            ),
            (
                &["LOCK.CHECK", "k", "o", "7"],
                &["FCALL_RO", "lock_info", "1", "k"],
            ),
            (&["WAIT", "1", "100"], &["WAIT", "1", "100"]),
            (&["PING"], &["PING"]),
        ];
        for (sent, expected) in cases {
            let cmd = command(sent);
            let on = sent_as(Backend::Functions, &cmd).expect("sent");
            assert_eq!(words(&on.cmd), expected, "{sent:?}");
            let on_module = sent_as(Backend::Module, &cmd).expect("sent");
            assert_eq!(words(&on_module.cmd), sent, "{sent:?}");
            assert_eq!(on_module.answer, Answer::AsIs);
        }
    }

    #[test]
    fn what_the_library_has_no_function_for_is_refused() {
        let cases: [(&[&str], &str); 8] = [
            (
                &["LOCK.ACQUIRE", "k", "o", "500", "SHARED", "ONCE"],
                "shared",
            ),
            (
                &["LOCK.ACQUIRE", "k", "o", "500", "LIMIT", "3", "ONCE"],
                "semaphores",
            ),
            (
                &["LOCK.ACQUIRE", "k", "o", "500", "EPHEMERAL", "ONCE"],
                "EPHEMERAL",
            ),
            (
                &["LOCK.ACQUIRE", "k", "o", "500", "ONCE", "WAIT", "100"],
                "waits in the server",
            ),
            (&["LOCK.MACQUIRE", "1", "k", "o", "500"], "multi-key"),
            (
                &["LOCK.GUARD", "k", "o", "7", "SET", "x", "1"],
                "fenced commands",
            ),
            (&["LOCK.CAMPAIGN", "k", "o", "500"], "elections"),
            (&["LOCK.LEADER", "k"], "elections"),
        ];
        for (sent, what) in cases {
            match sent_as(Backend::Functions, &command(sent)) {
                Err(LockError::NotSupported(message)) => {
                    assert!(message.contains(what), "{sent:?}: {message}");
                    assert!(message.contains("need the LOCK.* module"), "{message}");
                }
                Err(e) => panic!("{sent:?}: {e}"),
                Ok(s) => panic!("{sent:?} sent as {:?}", words(&s.cmd)),
            }
        }
    }

    #[test]
    fn the_token_check_reads_the_holder() {
        let check = command(&["LOCK.CHECK", "k", "o", "7"]);
        let answer = sent_as(Backend::Functions, &check).expect("sent").answer;
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let info = |token: i64| {
            Value::Array(vec![
                bulk("owner"),
                bulk("o"),
                bulk("holders"),
                Value::Array(vec![Value::Array(vec![
                    bulk("owner"),
                    bulk("o"),
                    bulk("token"),
                    Value::Int(token),
                    bulk("ttl"),
                    Value::Int(100),
                ])]),
            ])
        };
        assert_eq!(answer.apply(info(7)), Value::Int(1));
        assert_eq!(answer.apply(info(8)), Value::Int(0));
        assert_eq!(answer.apply(Value::Nil), Value::Int(0));
        assert_eq!(holder_ttl(&info(7), b"o", 7), Some(100));
        assert_eq!(lease_left(&Value::Nil), None);
        assert_eq!(
            lease_left(&Value::Array(vec![bulk("ttl"), Value::Int(250)])),
            Some(250)
        );
    }

    #[test]
    fn answers_that_say_the_backend_is_gone() {
        let server = |s: &str| LockError::Server(s.into());
        assert!(says_backend_gone(&server(
            "ERR unknown command 'LOCK.ACQUIRE', with args beginning with: "
        )));
        assert!(says_backend_gone(&server("ERR Function not found")));
        assert!(!says_backend_gone(&server("ERR not a lock")));
        assert!(!says_backend_gone(&LockError::InvalidArgument("x")));
    }
}
