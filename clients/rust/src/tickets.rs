//! Waiting with tickets: every waiting acquire of a client on one server is served by one
//! waiting connection.
//!
//! A waiting acquire asks on the client's shared connection with `... WAIT ms TICKET`; when the
//! server must queue it, the reply is a ticket (a key the server pushes the answer into). The
//! waiter hands the ticket here: one task per client ([`Tickets`]) keeps one connection of its
//! own to the server (opened when a ticket first waits, closed when none has waited for a
//! while) and runs `BLPOP t1 ... tk timeout` over every outstanding ticket; a ticket that comes
//! while a `BLPOP` runs interrupts it (`CLIENT UNBLOCK` on the shared connection: it answers nil)
//! and the `BLPOP` is sent again with the new set. A popped answer goes to its waiter.
//!
//! A ticket belongs to the connection that asked for it: when the shared connection is replaced
//! (it broke, or the master changed), its tickets are void, and their waiters are told so
//! ([`Answer::Void`]) to withdraw them and ask again. The task pings the shared connection while
//! tickets wait, so that a connection closed under it is noticed within a second. It knows
//! nothing of locks: a grant popped for a waiter that is gone is released with the command the
//! waiter left ([`Wanted::release`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::basics::relock;
use crate::conn::{self, Commands};
use crate::error::LockError;
use crate::master::Master;
use crate::node::Node;

/// How long the waiting connection stays open with no ticket waiting.
const IDLE: Duration = Duration::from_secs(2);

/// How often the shared connection (the tickets' asking connection) is checked while tickets
/// wait.
const CHECK: Duration = Duration::from_secs(1);

/// How long past a ticket's deadline (and past a `BLPOP`'s own timeout) the task waits for an
/// answer before it gives the ticket up (or takes the waiting connection for broken).
const MARGIN: Duration = Duration::from_secs(2);

/// After a `CLIENT UNBLOCK` that found nothing blocked (the `BLPOP` was still on its way), how
/// soon it is sent again.
const UNBLOCK_AGAIN: Duration = Duration::from_millis(5);

/// How many times in a row the waiting connection may fail to open before the waiters are
/// answered with the error.
const OPEN_FAILURES: u32 = 3;

/// What a ticket came to.
#[derive(Debug)]
pub(crate) enum Answer {
    /// What the server pushed into it: the token(s), `timeout`, or `-` and an error.
    Popped(Vec<u8>),
    /// The ticket is void: the connection that asked for it was replaced (it closed, or the
    /// master changed). Withdraw it (`LOCK.CANCEL`) and ask again.
    Void,
    /// Its deadline passed (with the margin) and nothing was popped: withdraw it.
    Expired,
    /// The waiting connection could not be opened.
    Failed(LockError),
}

/// A ticket to wait for.
pub(crate) struct Wanted {
    /// The ticket's name, as the server replied it.
    pub(crate) ticket: Vec<u8>,
    /// When the acquire's wait ends (none: waits until granted).
    pub(crate) deadline: Option<Instant>,
    /// The number of the shared connection that asked ([`Commands::query_asking`]).
    pub(crate) asked_on: u64,
    /// The key the grant is on (a cluster routes the release by it).
    pub(crate) key: Arc<[u8]>,
    /// Releases a grant popped for a waiter that gave up meanwhile.
    pub(crate) release: Arc<Cmd>,
}

struct Entry {
    wanted: Wanted,
    answer: oneshot::Sender<Answer>,
}

/// The client's waiting connection and the task that runs it.
pub(crate) struct Tickets {
    master: Arc<Master>,
    commands: Arc<Commands>,
    /// `CLIENT SETNAME` of the waiting connection.
    name: String,
    timeout: Duration,
    /// The running task's inbox, if one runs.
    runner: Mutex<Option<mpsc::UnboundedSender<Entry>>>,
}

/// The waiting connection: to the master of `generation`, with its id for `CLIENT UNBLOCK`
/// (none when the server refused `CLIENT ID`: then each `BLPOP` lasts at most a second).
struct Waiting {
    conn: MultiplexedConnection,
    id: Option<i64>,
    generation: u64,
}

impl Tickets {
    pub(crate) fn new(
        master: Arc<Master>,
        commands: Arc<Commands>,
        name: String,
        timeout: Duration,
    ) -> Tickets {
        Tickets {
            master,
            commands,
            name,
            timeout,
            runner: Mutex::new(None),
        }
    }

    /// Waits for `wanted`: its answer comes on the receiver. Dropping the receiver gives the
    /// ticket up here (the caller withdraws it with `LOCK.CANCEL`).
    pub(crate) fn wait(self: &Arc<Self>, wanted: Wanted) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        let mut entry = Entry { wanted, answer: tx };
        let mut runner = relock(&self.runner);
        if let Some(inbox) = runner.as_ref() {
            match inbox.send(entry) {
                Ok(()) => return rx,
                // The task ended (its runtime shut down): a new one.
                Err(mpsc::error::SendError(back)) => entry = back,
            }
        }
        let (inbox, rx_entries) = mpsc::unbounded_channel();
        // Cannot fail: the receiver is alive.
        let _ = inbox.send(entry);
        *runner = Some(inbox);
        drop(runner);
        tokio::spawn(self.clone().run(rx_entries));
        rx
    }

    /// The task: one `BLPOP` at a time over every outstanding ticket, until none has waited
    /// for [`IDLE`].
    async fn run(self: Arc<Self>, mut inbox: mpsc::UnboundedReceiver<Entry>) {
        let mut entries: Vec<Entry> = Vec::new();
        let mut waiting: Option<Waiting> = None;
        let mut failures = 0;
        loop {
            while let Ok(entry) = inbox.try_recv() {
                entries.push(entry);
            }
            let generation = self.master.generation();
            if waiting.as_ref().is_some_and(|w| w.generation != generation) {
                // A failover: the waiting connection goes (the shared connection is done with
                // too, which voids every ticket it asked for).
                waiting = None;
            }
            self.sweep(&mut entries);
            if entries.is_empty() {
                // Nothing waits: the connection goes, and the task after a while.
                waiting = None;
                match tokio::time::timeout(IDLE, inbox.recv()).await {
                    Ok(Some(entry)) => entries.push(entry),
                    Ok(None) => return,
                    Err(_) => {
                        let mut runner = relock(&self.runner);
                        match inbox.try_recv() {
                            Ok(entry) => entries.push(entry),
                            Err(_) => {
                                *runner = None;
                                return;
                            }
                        }
                    }
                }
                continue;
            }
            let current = match waiting.take() {
                Some(w) => w,
                None => match self.open(generation).await {
                    Ok(w) => {
                        failures = 0;
                        w
                    }
                    Err(e) => {
                        failures += 1;
                        if failures >= OPEN_FAILURES {
                            failures = 0;
                            for entry in entries.drain(..) {
                                let _ = entry.answer.send(Answer::Failed(clone_error(&e)));
                            }
                        } else {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        continue;
                    }
                },
            };
            match self.pop(&current, &mut entries, &mut inbox).await {
                Popped::Answer(ticket, answer) => {
                    waiting = Some(current);
                    self.deliver(&mut entries, &ticket, answer);
                }
                Popped::Nothing => waiting = Some(current),
                // The waiting connection broke, or stayed silent past its BLPOP's timeout, or
                // is to a master that is no longer the master: a new one (the tickets stand).
                Popped::Broken => {}
            }
        }
    }

    /// Answers and drops what needs no `BLPOP`: waiters that gave up, tickets whose asking
    /// connection was replaced, tickets past their deadline.
    fn sweep(&self, entries: &mut Vec<Entry>) {
        let asking = self.commands.asking();
        let now = Instant::now();
        let mut kept = Vec::with_capacity(entries.len());
        for entry in entries.drain(..) {
            if entry.answer.is_closed() {
                continue;
            }
            if entry.wanted.asked_on != asking {
                let _ = entry.answer.send(Answer::Void);
            } else if entry.wanted.deadline.is_some_and(|d| d + MARGIN <= now) {
                let _ = entry.answer.send(Answer::Expired);
            } else {
                kept.push(entry);
            }
        }
        *entries = kept;
    }

    /// Opens the waiting connection to the master: its name and `CLIENT ID` in one round trip.
    async fn open(&self, generation: u64) -> Result<Waiting, LockError> {
        let node = self.master.node().await?;
        let opened = self.open_to(&node, generation).await;
        if opened.is_err() {
            // Through Sentinel, the next lookup asks the Sentinels again (a failover).
            self.master.forget(&node);
        }
        opened
    }

    async fn open_to(&self, node: &Node, generation: u64) -> Result<Waiting, LockError> {
        let mut own = conn::own_connection(&node.client, false, self.timeout).await?;
        let mut id_cmd = redis::cmd("CLIENT");
        id_cmd.arg("ID");
        let id = tokio::time::timeout(
            self.timeout,
            conn::first_query(&mut own.conn, &self.name, false, &id_cmd),
        )
        .await
        .map_err(|_| timed_out())?;
        let id = match id {
            Ok(Value::Int(id)) => Some(id),
            // Refused (an ACL without CLIENT): BLPOPs short enough to take new tickets.
            Ok(_) => None,
            Err(e) if e.code().is_some() => None,
            Err(e) => return Err(LockError::Connection(e)),
        };
        Ok(Waiting {
            conn: own.conn,
            id,
            generation,
        })
    }

    /// One `BLPOP` over `entries`' tickets, interrupted (and its nil answer read) when a ticket
    /// comes, a waiter gives up, or the asking connection is replaced.
    async fn pop(
        &self,
        waiting: &Waiting,
        entries: &mut Vec<Entry>,
        inbox: &mut mpsc::UnboundedReceiver<Entry>,
    ) -> Popped {
        let now = Instant::now();
        let nearest = entries.iter().filter_map(|e| e.wanted.deadline).min();
        let mut secs = match nearest {
            // Rounded up, plus a second: the server's own `timeout` answer comes first.
            Some(d) => d.saturating_duration_since(now).as_millis().div_ceil(1000) as u64 + 1,
            None => 0,
        };
        if waiting.id.is_none() {
            // Cannot be interrupted: short, so that new tickets join soon.
            secs = 1;
        }
        let mut cmd = redis::cmd("BLPOP");
        for entry in entries.iter() {
            cmd.arg(&entry.wanted.ticket);
        }
        cmd.arg(secs);
        let mut conn = waiting.conn.clone();
        let mut blpop = Box::pin(async move { cmd.query_async::<Value>(&mut conn).await });
        let silent_after = (secs > 0).then(|| now + Duration::from_secs(secs) + MARGIN);
        let mut check = tokio::time::interval_at(now + CHECK, CHECK);
        let mut interrupt = false;
        let mut interrupted = false;
        let mut inbox_open = true;
        let failover = crate::master::changed(self.master.changes());
        tokio::pin!(failover);
        let reply = loop {
            if interrupt && !interrupted {
                if let Some(id) = waiting.id {
                    let mut unblock = redis::cmd("CLIENT");
                    unblock.arg("UNBLOCK").arg(id);
                    interrupted = matches!(self.commands.query(&unblock).await, Ok(Value::Int(1)));
                }
            }
            let retry = interrupt && !interrupted && waiting.id.is_some();
            tokio::select! {
                reply = &mut blpop => break reply,
                entry = inbox.recv(), if inbox_open => match entry {
                    Some(entry) => {
                        entries.push(entry);
                        interrupt = true;
                    }
                    None => inbox_open = false,
                },
                _ = tokio::time::sleep(UNBLOCK_AGAIN), if retry => {}
                // Through Sentinel, the master was replaced: its tickets no longer count.
                _ = &mut failover => return Popped::Broken,
                _ = check.tick() => {
                    if self.master.generation() != waiting.generation {
                        return Popped::Broken;
                    }
                    // A ping: a shared connection closed under the client is replaced now,
                    // and the tickets it asked for are void.
                    let _ = self.commands.query(&redis::cmd("PING")).await;
                    let asking = self.commands.asking();
                    if entries
                        .iter()
                        .any(|e| e.answer.is_closed() || e.wanted.asked_on != asking)
                    {
                        interrupt = true;
                    }
                    if self.master.generation() != waiting.generation {
                        return Popped::Broken;
                    }
                    if silent_after.is_some_and(|t| Instant::now() > t) {
                        return Popped::Broken;
                    }
                }
            }
        };
        match reply {
            Ok(Value::Array(mut pair)) if pair.len() == 2 => {
                let answer = pair.pop();
                let ticket = pair.pop();
                match (ticket, answer) {
                    (Some(Value::BulkString(ticket)), Some(Value::BulkString(answer))) => {
                        Popped::Answer(ticket, answer)
                    }
                    _ => Popped::Nothing,
                }
            }
            Ok(_) => Popped::Nothing,
            Err(_) => Popped::Broken,
        }
    }

    /// Gives `answer` to the waiter of `ticket`; a grant whose waiter is gone is released.
    fn deliver(&self, entries: &mut Vec<Entry>, ticket: &[u8], answer: Vec<u8>) {
        let Some(at) = entries.iter().position(|e| e.wanted.ticket == ticket) else {
            return;
        };
        let entry = entries.swap_remove(at);
        if let Err(Answer::Popped(answer)) = entry.answer.send(Answer::Popped(answer)) {
            if is_grant(&answer) {
                let commands = self.commands.clone();
                let (release, key) = (entry.wanted.release, entry.wanted.key);
                tokio::spawn(async move {
                    let _ = commands.query_routed(&release, Some(&key)).await;
                });
            }
        }
    }
}

/// What one `BLPOP` came to.
enum Popped {
    /// A ticket and its answer.
    Answer(Vec<u8>, Vec<u8>),
    /// Nil: it timed out, or was interrupted.
    Nothing,
    /// The waiting connection is of no more use.
    Broken,
}

/// Whether a ticket's answer is a grant (digits: the token or tokens).
pub(crate) fn is_grant(answer: &[u8]) -> bool {
    answer.first().is_some_and(u8::is_ascii_digit)
}

fn timed_out() -> LockError {
    LockError::Connection(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the waiting connection did not answer in time",
    )))
}

/// The error of a waiting connection that cannot be opened, for each of its waiters.
fn clone_error(e: &LockError) -> LockError {
    LockError::Connection(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("the waiting connection cannot be opened: {e}"),
    )))
}
