//! A client blocked in `LOCK.ACQUIRE ... WAIT` on its own connection, in a thread of its own.

use std::cell::RefCell;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult};

use crate::lock::{key_waiters, waiters};
use crate::{eventually, Server};

/// How long `start` waits for the server to show the client queued.
const QUEUED_WITHIN: Duration = Duration::from_secs(5);

/// What becomes of a waiter's connection once its reply came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterReply {
    /// Closed before the reply is handed over: a test that goes on to MODULE UNLOAD must not
    /// find it still open with LOCK.ACQUIRE as its last command.
    #[default]
    Close,
    /// Kept open and handed over with the reply (`Answer::con`): an `EPHEMERAL` grant lives as
    /// long as its connection.
    Keep,
}

/// Which count `start` watches to see the client queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueuedIn {
    /// The server's `INFO lock` `lock_waiters`.
    #[default]
    Server,
    /// `LOCK.INFO key`'s `waiters`: where other keys' waiters come and go meanwhile.
    Key,
}

/// The reply a waiter got.
pub struct Answer {
    /// The token, nil on timeout, or the error.
    pub reply: RedisResult<Option<i64>>,
    /// From sending the command to its reply.
    pub waited: Duration,
    /// When the reply arrived.
    pub at: Instant,
    /// The connection, still open, with `AfterReply::Keep`.
    pub con: Option<Connection>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("reply", &self.reply)
            .field("waited", &self.waited)
            .field("connection kept", &self.con.is_some())
            .finish()
    }
}

impl Answer {
    /// The connection kept open (`AfterReply::Keep`).
    pub fn connection(self) -> Connection {
        self.con
            .expect("the connection was closed (start the waiter with keep_connection)")
    }
}

/// `LOCK.ACQUIRE key owner lease [options...] WAIT timeout`, to start: `Waiter::request(..)`,
/// then any of `options`, `keep_connection`, `queued_in`, then `start`.
pub struct WaitRequest<'a> {
    server: &'a Server,
    key: String,
    owner: String,
    lease_ms: u64,
    timeout_ms: u64,
    options: Vec<String>,
    after: AfterReply,
    queued_in: QueuedIn,
}

impl WaitRequest<'_> {
    /// LOCK.ACQUIRE options before `WAIT` (`SHARED`, `LIMIT n`, `EPHEMERAL`, ...).
    pub fn options(mut self, options: &[&str]) -> Self {
        self.options = options.iter().map(|o| o.to_string()).collect();
        self
    }

    /// Keeps the connection open after the reply (`AfterReply::Keep`).
    pub fn keep_connection(mut self) -> Self {
        self.after = AfterReply::Keep;
        self
    }

    pub fn queued_in(mut self, queued_in: QueuedIn) -> Self {
        self.queued_in = queued_in;
        self
    }

    /// Sends the command and returns once the server shows one more waiter, so that waiters
    /// started one after another queue in that order.
    pub fn start(self) -> Waiter {
        let mut admin = self.server.connect();
        let key = self.key.clone();
        let queued = move |admin: &mut Connection| match self.queued_in {
            QueuedIn::Server => waiters(admin),
            QueuedIn::Key => key_waiters(admin, &key),
        };
        let before = queued(&mut admin);
        let mut con = self.server.connect();
        let id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query(&mut con)
            .expect("CLIENT ID");
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(&self.key)
            .arg(&self.owner)
            .arg(self.lease_ms)
            .arg(&self.options)
            .arg("WAIT")
            .arg(self.timeout_ms);
        let what = format!(
            "LOCK.ACQUIRE {} {} {} {}WAIT {}",
            self.key,
            self.owner,
            self.lease_ms,
            self.options
                .iter()
                .map(|o| format!("{o} "))
                .collect::<String>(),
            self.timeout_ms
        );
        let (tx, done) = mpsc::channel();
        let after = self.after;
        thread::spawn(move || {
            let sent = Instant::now();
            let reply = cmd.query::<Option<i64>>(&mut con);
            let at = Instant::now();
            let con = match after {
                AfterReply::Close => {
                    drop(con);
                    None
                }
                AfterReply::Keep => Some(con),
            };
            let _ = tx.send(Answer {
                reply,
                waited: at - sent,
                at,
                con,
            });
        });
        assert!(
            eventually(QUEUED_WITHIN, || queued(&mut admin) == before + 1),
            "{what} did not block"
        );
        Waiter {
            id,
            what,
            done,
            early: RefCell::new(None),
        }
    }
}

/// A client blocked in `LOCK.ACQUIRE ... WAIT` on its own connection.
pub struct Waiter {
    /// Its `CLIENT ID`.
    pub id: i64,
    what: String,
    done: mpsc::Receiver<Answer>,
    /// A reply `still_blocked` saw come, kept for `answer`.
    early: RefCell<Option<Answer>>,
}

impl Waiter {
    /// `LOCK.ACQUIRE key owner lease WAIT timeout`, closed once answered, queued as the
    /// server's waiter count shows.
    pub fn start(
        server: &Server,
        key: &str,
        owner: &str,
        lease_ms: u64,
        timeout_ms: u64,
    ) -> Waiter {
        Waiter::request(server, key, owner, lease_ms, timeout_ms).start()
    }

    /// The same with options: see `WaitRequest`.
    pub fn request<'a>(
        server: &'a Server,
        key: &str,
        owner: &str,
        lease_ms: u64,
        timeout_ms: u64,
    ) -> WaitRequest<'a> {
        WaitRequest {
            server,
            key: key.to_string(),
            owner: owner.to_string(),
            lease_ms,
            timeout_ms,
            options: Vec::new(),
            after: AfterReply::default(),
            queued_in: QueuedIn::default(),
        }
    }

    /// The reply, if it comes within `within`.
    pub fn answer(&self, within: Duration) -> Option<Answer> {
        if let Some(answer) = self.early.borrow_mut().take() {
            return Some(answer);
        }
        self.done.recv_timeout(within).ok()
    }

    /// The token, or `None` when the wait timed out; panics on an error or no reply within
    /// `within`.
    pub fn token(&self, within: Duration) -> Option<i64> {
        match self.answer(within) {
            Some(Answer { reply: Ok(t), .. }) => t,
            other => panic!("{} (client {}) got {other:?}", self.what, self.id),
        }
    }

    /// The granted token and the answer; panics on anything but a grant within `within`.
    pub fn granted(&self, within: Duration) -> (i64, Answer) {
        match self.answer(within) {
            Some(answer) => match answer.reply {
                Ok(Some(token)) => (token, answer),
                _ => panic!("{} (client {}) got {answer:?}", self.what, self.id),
            },
            None => panic!(
                "{} (client {}) not answered within {within:?}",
                self.what, self.id
            ),
        }
    }

    /// Whether no reply came yet (a reply that came is kept for `answer`).
    pub fn still_blocked(&self) -> bool {
        if self.early.borrow().is_some() {
            return false;
        }
        match self.done.try_recv() {
            Ok(answer) => {
                *self.early.borrow_mut() = Some(answer);
                false
            }
            Err(mpsc::TryRecvError::Empty) => true,
            Err(mpsc::TryRecvError::Disconnected) => false,
        }
    }
}
