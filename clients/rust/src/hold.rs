//! One hold's I/O shell around its machine (`machine.rs`): it turns replies, messages, timers
//! and connection closes into events, and carries out what the machine asks — a renewal, a
//! check, a wake-up with the keeper, the application told. It does not know the client or the
//! handle that made it.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use redis::{Cmd, PushKind, Value};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::acks::{Acknowledgement, Shortfall};
use crate::basics::{millis, FAILOVER_PAUSE, FAILOVER_PAUSE_MAX};
use crate::conn::{Commands, HoldConn};
use crate::error::LockError;
use crate::keeper::{Keeper, Place, Timed};
use crate::lost::{look_and_wait_lost, Look, LostReason, LostWatch, Status};
use crate::machine::{
    Actions, Answer, Binding, Check, Event, Form, Identity, Machine, Read, Refusal, State, Terms,
    Wake,
};
use crate::message::LostSignal;
use crate::reply;
use crate::servers::Redirect;
use crate::signal::{SignalHub, Subscriber};

/// One hold: what its guards, its keeper and the signal listener share. A hold of several keys
/// (`LOCK.MACQUIRE`) is one hold: one machine, one renewal, one release.
pub(crate) struct Hold {
    /// The keys, in the order given (one for an ordinary hold); never empty.
    pub(crate) keys: Arc<[Arc<[u8]>]>,
    pub(crate) owner: Arc<str>,
    /// A fencing token per key, in the keys' order.
    pub(crate) tokens: Arc<[u64]>,
    terms: Terms,
    /// What a grant and each renewal must be acknowledged by (replicas, AOF fsyncs).
    acks: Acknowledgement,
    conn: HoldConn,
    /// The client's shared connection, for the checks a message asks for (in a cluster it
    /// follows `MOVED` and `ASK` to where the key is now).
    reads: Arc<Commands>,
    /// `LOCK.RELEASE key owner` or `LOCK.MRELEASE n key... owner` (the handle's).
    release: Arc<Cmd>,
    inner: Mutex<Inner>,
    /// Tells the application of status changes; made by the first watcher, under `inner`'s
    /// lock (a hold nobody watches costs no channel).
    tx: OnceLock<watch::Sender<Status>>,
    /// The runtime the hold was acquired on: its tasks run there, and a guard dropped anywhere
    /// releases through it.
    pub(crate) runtime: Option<Handle>,
    keeper: Arc<Keeper>,
    signals: Option<Arc<SignalHub>>,
    abandoned: Arc<dyn Abandoned>,
    /// The first refusal (`NOPERM`) of a command that keeps the hold: the command and the
    /// server's line, answered by the guard's calls once the hold ended so.
    denied: OnceLock<(String, String)>,
    /// The client's command timeout: how long a call waits for the server to end an
    /// `EPHEMERAL` hold whose connection failed under it.
    command_timeout: Duration,
}

/// What the hold changes under its lock.
struct Inner {
    machine: Machine,
    place: Place,
    /// Tasks of this hold (a renewal in flight, the connection watcher, the subscription):
    /// stopped when the hold ends.
    tasks: Vec<AbortHandle>,
}

impl Inner {
    fn keep(&mut self, task: Option<AbortHandle>) {
        self.tasks.retain(|t| !t.is_finished());
        self.tasks.extend(task);
    }
}

/// Who counts a hold's background releases: the handle that made it, whose next acquire waits
/// for them (a hold does not know its handle, only this).
pub(crate) trait Abandoned: Send + Sync {
    /// Sends `hold`'s release in the background ([`Hold::release_abandoned`]), counted.
    fn release_abandoned(&self, hold: Arc<Hold>);
}

/// What a hold is made of.
pub(crate) struct NewHold {
    pub(crate) identity: Identity,
    pub(crate) terms: Terms,
    pub(crate) acks: Acknowledgement,
    pub(crate) conn: HoldConn,
    pub(crate) reads: Arc<Commands>,
    pub(crate) release: Arc<Cmd>,
    pub(crate) keeper: Arc<Keeper>,
    pub(crate) signals: Option<Arc<SignalHub>>,
    /// The handle, for the releases of a hold this side stopped believing in.
    pub(crate) abandoned: Arc<dyn Abandoned>,
    /// The client's command timeout.
    pub(crate) command_timeout: Duration,
}

impl Look for Hold {
    /// Steps the machine to now: past its deadline, the hold is lost at once.
    fn look(self: Arc<Self>) {
        self.status();
    }
}

impl Hold {
    pub(crate) fn new(n: NewHold) -> Arc<Hold> {
        Arc::new(Hold {
            keys: n.identity.keys.clone(),
            owner: n.identity.owner.clone(),
            tokens: n.identity.tokens.clone(),
            terms: n.terms,
            acks: n.acks,
            conn: n.conn,
            reads: n.reads,
            release: n.release,
            inner: Mutex::new(Inner {
                machine: Machine::new(n.identity, n.terms),
                place: Place::default(),
                tasks: Vec::new(),
            }),
            tx: OnceLock::new(),
            runtime: Handle::try_current().ok(),
            keeper: n.keeper,
            signals: n.signals,
            abandoned: n.abandoned,
            denied: OnceLock::new(),
            command_timeout: n.command_timeout,
        })
    }

    /// A call on this `EPHEMERAL` hold's own connection failed (a connection error): the
    /// server ends the hold as soon as it reads the close, which a read on the shared
    /// connection confirms ([`Event::ConnectionLost`]). Whether the hold was reported lost
    /// within the command timeout (false: the server still holds it, or no read answered).
    pub(crate) async fn closed_outcome(self: &Arc<Self>) -> bool {
        self.step(Event::ConnectionLost);
        let _ = tokio::time::timeout(self.command_timeout, self.lost()).await;
        !self.is_active()
    }

    /// Keeps the first refusal (`NOPERM`) among `replies`, for [`Hold::not_held`].
    fn note_denied<'a>(&self, replies: impl IntoIterator<Item = &'a Result<Value, LockError>>) {
        for reply in replies {
            if let Err(LockError::NoPermission {
                command, message, ..
            }) = reply
            {
                let _ = self.denied.set((command.clone(), message.clone()));
                return;
            }
        }
    }

    /// The error a call on a hold that is no longer active answers: the refusal that ended it
    /// ([`LockError::NoPermission`]), or [`LockError::NotHeld`] with `lost`.
    pub(crate) fn not_held(&self, lost: Option<LostReason>) -> LockError {
        match (lost, self.denied.get()) {
            (Some(LostReason::NoPermission), Some((command, message))) => LockError::NoPermission {
                command: command.clone(),
                message: message.clone(),
                channel: None,
            },
            _ => LockError::NotHeld { lost },
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // The machine changes in whole steps under this lock; a panic elsewhere cannot leave it
        // half-updated, so a poisoned lock is used as it is.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Feeds the machine one event and carries out what it asks that needs no caller: the
    /// status sent to watchers, the keeper's wake-up, a renewal, a check. Returns the actions
    /// for the caller (deliver, refuse, a confirmation, the release).
    pub(crate) fn step(self: &Arc<Self>, event: Event<'_>) -> Actions {
        let mut inner = self.inner();
        let out = inner.machine.step(event);
        if out.notify {
            if let Some(tx) = self.tx.get() {
                tx.send_replace(inner.machine.status());
            }
        }
        let inner = &mut *inner;
        match out.wake {
            Some(Wake::At(at)) => {
                let me: Arc<dyn Timed> = self.clone();
                self.keeper
                    .schedule(Arc::downgrade(&me), &mut inner.place, at);
            }
            Some(Wake::Never) => {
                // The end: nothing renews, checks or listens after it.
                self.keeper.cancel(&mut inner.place);
                for task in inner.tasks.drain(..) {
                    task.abort();
                }
                if let Some(hub) = &self.signals {
                    let me: Arc<dyn Subscriber> = self.clone();
                    hub.unwatch(&Arc::downgrade(&me), &self.keys);
                }
            }
            None => {}
        }
        let confirming = matches!(inner.machine.state(), State::Confirming { .. });
        if out.renew && !confirming {
            let task = self.spawn(self.clone().renew());
            inner.keep(task);
        }
        if let Some(check) = out.check {
            let task = self.spawn(self.clone().check(check));
            inner.keep(task);
        }
        if out.abandon {
            self.abandoned.release_abandoned(self.clone());
        }
        out
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) -> Option<AbortHandle> {
        let runtime = self
            .runtime
            .clone()
            .or_else(|| Handle::try_current().ok())?;
        Some(runtime.spawn(task).abort_handle())
    }

    /// The application's view, never stale: a hold past its local deadline is lost (and
    /// released in the background, as the keeper's wake-up would do) the moment anyone looks,
    /// before the keeper's own wake-up runs (a process paused past its lease reads `lost` first
    /// thing when it resumes).
    pub(crate) fn status(self: &Arc<Self>) -> Status {
        self.step(Event::Tick {
            now: Instant::now(),
        });
        self.inner().machine.status()
    }

    pub(crate) fn is_active(self: &Arc<Self>) -> bool {
        self.status() == Status::Active
    }

    pub(crate) fn lost_reason(self: &Arc<Self>) -> Option<LostReason> {
        match self.status() {
            Status::Lost(reason) => Some(reason),
            _ => None,
        }
    }

    /// The channel, made with the current status under the machine's lock (so that no change
    /// falls between its first value and its first send).
    fn channel(&self) -> &watch::Sender<Status> {
        let inner = self.inner();
        self.tx
            .get_or_init(|| watch::Sender::new(inner.machine.status()))
    }

    /// Resolves with the reason when the hold is lost; never once it is released. Each poll
    /// looks at the local deadline first (see [`Hold::status`]).
    pub(crate) fn lost(self: &Arc<Self>) -> impl Future<Output = LostReason> + Send + 'static {
        let me: Arc<dyn Look> = self.clone();
        look_and_wait_lost(self.channel().subscribe(), Arc::downgrade(&me))
    }

    pub(crate) fn watch(self: &Arc<Self>) -> LostWatch {
        let me: Arc<dyn Look> = self.clone();
        LostWatch::new(self.channel().subscribe(), Arc::downgrade(&me))
    }

    /// The first key: the one commands are routed by (all keys of a hold share a slot).
    pub(crate) fn key(&self) -> &[u8] {
        self.keys.first().map_or(&[], |k| k)
    }

    /// The first key's token (an ordinary hold's only one).
    pub(crate) fn token(&self) -> u64 {
        self.tokens.first().copied().unwrap_or(0)
    }

    /// The connection an `EPHEMERAL` hold is bound to (none once unbound).
    pub(crate) fn own_connection(&self) -> Option<redis::aio::MultiplexedConnection> {
        match self.connection() {
            HoldConn::Own(conn) => Some(conn),
            HoldConn::Shared(_) => None,
        }
    }

    /// The connection the hold's commands go on now: its own while it is bound to it; the
    /// client's shared one once the hold is bound to nothing (in a cluster, its key moved to
    /// another node: the shared connection follows it there).
    fn connection(&self) -> HoldConn {
        match &self.conn {
            HoldConn::Own(conn) if self.inner().machine.binding() == Binding::Connection => {
                HoldConn::Own(conn.clone())
            }
            HoldConn::Own(_) => HoldConn::Shared(self.reads.clone()),
            HoldConn::Shared(commands) => HoldConn::Shared(commands.clone()),
        }
    }

    /// `cmd` on the hold's connection (in a cluster, to its keys' master).
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, LockError> {
        self.connection().query(cmd, self.key()).await
    }

    /// Runs `cmd` through the fence of the hold's `index`-th key: `LOCK.GUARD key owner token
    /// <cmd...>` on the hold's connection (in a cluster, to the key's master). The command's
    /// reply (its own errors as [`LockError::Server`]); [`LockError::Fenced`] when the server
    /// refused the token, which the machine takes as the hold's loss; [`LockError::NotHeld`],
    /// with nothing sent, once the hold is known lost or released. Never sent twice: after a
    /// broken connection the command may or may not have run.
    pub(crate) async fn fenced(
        self: &Arc<Self>,
        index: usize,
        cmd: &Cmd,
    ) -> Result<Value, LockError> {
        let (Some(key), Some(token)) = (self.keys.get(index), self.tokens.get(index)) else {
            return Err(LockError::InvalidArgument("not a key of this hold"));
        };
        // Time passing may have ended it (no renewal confirmed for a lease): `status` looks.
        match self.status() {
            Status::Active => {}
            Status::Lost(reason) => return Err(self.not_held(Some(reason))),
            Status::Released => return Err(LockError::NotHeld { lost: None }),
        }
        let mut guarded = redis::cmd("LOCK.GUARD");
        guarded.arg(&**key).arg(self.owner.as_bytes()).arg(*token);
        for arg in cmd.args_iter() {
            match arg {
                redis::Arg::Simple(arg) => {
                    guarded.arg(arg);
                }
                _ => return Err(LockError::InvalidArgument(
                    "a cursor argument (cursor_arg) cannot be fenced: give it as a plain argument",
                )),
            }
        }
        match self.connection().query(&guarded, key).await {
            Err(LockError::Server(text)) => match reply::fence_refusal(&text) {
                Some(reason) => {
                    self.step(Event::Fenced(reason));
                    Err(LockError::Fenced { lost: reason })
                }
                None => Err(LockError::Server(text)),
            },
            // The fenced command's refusal is named after it on every server: Redis 7.0's
            // module words it (`the command given to LOCK.GUARD`), later servers and Valkey
            // pass theirs on (`... to run the 'set' command`).
            Err(LockError::NoPermission { message, .. })
                if message.contains("given to LOCK.GUARD") =>
            {
                Err(LockError::NoPermission {
                    command: crate::error::command_name(cmd),
                    message,
                    channel: None,
                })
            }
            Err(e) if e.is_retryable() && self.own_connection().is_some() => {
                // The server ends an EPHEMERAL hold with its connection.
                self.step(Event::ConnectionLost);
                Err(e)
            }
            reply => reply,
        }
    }

    /// `LOCK.RENEW key owner lease`, or `LOCK.MRENEW n key... owner lease`.
    fn renew_cmd(&self) -> Cmd {
        let mut cmd = match self.terms.form {
            Form::One => redis::cmd("LOCK.RENEW"),
            Form::Many => {
                let mut cmd = redis::cmd("LOCK.MRENEW");
                cmd.arg(self.keys.len());
                cmd
            }
        };
        for key in self.keys.iter() {
            cmd.arg(&**key);
        }
        cmd.arg(self.owner.as_bytes()).arg(millis(self.terms.lease));
        cmd
    }

    /// One renewal (the watchdog's): its answer goes to the machine.
    async fn renew(self: Arc<Self>) {
        let (event, _, broken) = self.send_renewal().await;
        if broken {
            // The connection the hold is bound to failed: the server ends the hold once it
            // reads that (the machine asks for reads until then).
            self.step(Event::ConnectionLost);
        }
        self.step(event);
    }

    /// Whether `reply` is a connection error on the connection this hold is bound to (its own,
    /// `EPHEMERAL`): the server ends the hold as soon as it reads the close.
    fn broke(&self, reply: &Result<Value, LockError>) -> bool {
        matches!(reply, Err(LockError::Connection(_)))
            && matches!(self.connection(), HoldConn::Own(_))
    }

    /// A renewal, followed in one pipeline by what acknowledges it (`WAIT`, `WAITAOF`) when
    /// the lock asks for that: the hold is there but the renewal unacknowledged
    /// ([`Answer::Unacknowledged`], with why) when too few acknowledged. The last: whether the
    /// connection the hold is bound to failed ([`Hold::broke`]).
    async fn send_renewal(self: &Arc<Self>) -> (Event<'static>, Option<Shortfall>, bool) {
        let sent = Instant::now();
        let mut broken = false;
        let (answer, why) = if self.acks.is_on() {
            let mut pipe = redis::pipe();
            pipe.ignore_errors().add_command(self.renew_cmd());
            for cmd in self.acks.commands() {
                pipe.add_command(cmd);
            }
            match self.connection().query_pipeline(&pipe, self.key()).await {
                Ok(mut replies) if !replies.is_empty() => {
                    let renewed = replies.remove(0);
                    self.note_denied([&renewed]);
                    if is_redirect(&renewed) && self.unbind_if_moved().await {
                        // Sent again where the key is now, in the next round.
                        return (self.nothing(sent), None, false);
                    }
                    match reply::renewal(&renewed, self.terms.lease) {
                        Answer::Holds(left) => match self.acks.judge(&replies) {
                            Ok(()) => (Answer::Holds(left), None),
                            Err(short) => (Answer::Unacknowledged, Some(short)),
                        },
                        answer => (answer, None),
                    }
                }
                Ok(_) => (Answer::Nothing, None),
                Err(e) => {
                    let reply = Err(e);
                    self.note_denied([&reply]);
                    broken = self.broke(&reply);
                    (reply::renewal(&reply, self.terms.lease), None)
                }
            }
        } else {
            let mut reply = self.query(&self.renew_cmd()).await;
            if is_redirect(&reply) && self.unbind_if_moved().await {
                // Bound to nothing now: renewed where the key is.
                reply = self.query(&self.renew_cmd()).await;
            }
            self.note_denied([&reply]);
            broken = self.broke(&reply);
            (reply::renewal(&reply, self.terms.lease), None)
        };
        let answer = match answer {
            Answer::Holds(_) | Answer::Unacknowledged => self.check_tokens(answer).await,
            answer => answer,
        };
        let event = Event::Answered {
            read: Read::Renewal,
            sent,
            replied: Instant::now(),
            answer,
        };
        (event, why, broken)
    }

    /// `answer` when the server holds every key under this hold's token, `Gone` when it does not
    /// (`LOCK.CHECK`, one pipeline). `LOCK.RENEW` names no token: it renews whatever hold the
    /// owner has on the key, so a renewal answered on a server where the owner holds another
    /// token (the key force-released and taken again by the same owner; through Sentinel, a
    /// paused "zombie" master's grant confirmed on the real master) says nothing of this hold.
    async fn check_tokens(&self, answer: Answer) -> Answer {
        let mut pipe = redis::pipe();
        // Each reply in its place (a refusal named after its command).
        pipe.ignore_errors();
        for (key, token) in self.keys.iter().zip(self.tokens.iter()) {
            pipe.cmd("LOCK.CHECK")
                .arg(&**key)
                .arg(self.owner.as_bytes())
                .arg(*token);
        }
        match self.connection().query_pipeline(&pipe, self.key()).await {
            Ok(replies) if replies.len() == self.keys.len() => {
                if replies.iter().all(|r| matches!(r, Ok(Value::Int(1)))) {
                    answer
                } else if replies.iter().all(|r| matches!(r, Ok(Value::Int(_)))) {
                    Answer::Gone
                } else if replies
                    .iter()
                    .any(|r| matches!(r, Err(LockError::NoPermission { .. })))
                {
                    // The renewal went through, the token's check did not: the hold cannot be
                    // kept (its token never confirmed), and the refusal is said at once.
                    self.note_denied(&replies);
                    Answer::Refused
                } else {
                    Answer::Nothing
                }
            }
            Err(e @ LockError::NoPermission { .. }) => {
                let reply = Err(e);
                self.note_denied([&reply]);
                Answer::Refused
            }
            _ => Answer::Nothing,
        }
    }

    /// A fixed lease's confirmation: the lease this hold has left on its first key
    /// (`LOCK.INFO`; every key was granted at one instant with one lease); and whether the
    /// connection the hold is bound to failed ([`Hold::broke`]).
    async fn read_lease(&self) -> (Event<'static>, bool) {
        let sent = Instant::now();
        let mut cmd = redis::cmd("LOCK.INFO");
        cmd.arg(self.key());
        let reply = self.query(&cmd).await;
        self.note_denied([&reply]);
        let event = Event::Answered {
            read: Read::LeaseLeft,
            sent,
            replied: Instant::now(),
            answer: reply::holder(&reply, self.owner.as_bytes(), self.token()),
        };
        (event, self.broke(&reply))
    }

    /// After a grant: hands the hold over, or first sends the confirmation the machine asks for
    /// (a long wait) until it answers. `Err` when the hold is not to be handed out:
    /// [`LockError::NotHeld`] (the confirmation found it gone) or [`LockError::Connection`] (the
    /// server answered no confirmation).
    pub(crate) async fn granted(
        self: &Arc<Self>,
        sent: Instant,
        replied: Instant,
    ) -> Result<(), LockError> {
        let mut out = self.step(Event::Granted { sent, replied });
        let mut why = None;
        loop {
            if out.deliver {
                return Ok(());
            }
            match out.refuse {
                Some(Refusal::Gone(reason)) => {
                    return Err(LockError::NotHeld { lost: Some(reason) })
                }
                Some(Refusal::Unanswered) => return Err(LockError::Connection(no_confirmation())),
                Some(Refusal::Denied) => return Err(self.not_held(Some(LostReason::NoPermission))),
                Some(Refusal::Unacknowledged) => {
                    // Released by the caller (the handle's release, ordered before its next
                    // acquire). Too few replicas connected is said first (read once, here).
                    let mut short = why.unwrap_or(Shortfall {
                        acknowledged: 0,
                        wanted: 0,
                        why: String::new(),
                    });
                    if let Ok(role) = self.query(&redis::cmd("ROLE")).await {
                        short = short.explained_by_role(&role);
                    }
                    return Err(LockError::NotSafelyAcquired {
                        tokens: self.tokens.to_vec(),
                        acknowledged: short.acknowledged,
                        wanted: short.wanted,
                        why: short.why,
                    });
                }
                None => {}
            }
            let (event, broken) = if out.renew {
                let (event, unacknowledged, broken) = self.send_renewal().await;
                why = unacknowledged;
                (event, broken)
            } else if out.read_lease {
                self.read_lease().await
            } else {
                return Err(LockError::UnexpectedReply(
                    "the grant was neither handed out nor confirmed".into(),
                ));
            };
            if broken {
                // Its connection failed: the machine refuses the grant (the master ends it with
                // the connection; a replica's copy is released in the background).
                out = self.step(Event::ConnectionLost);
                if out.refuse.is_some() {
                    continue;
                }
            }
            out = self.step(event);
        }
    }

    /// Starts the hold's background work as it is handed out: the connection watcher of an
    /// `EPHEMERAL` hold, and the subscription to its keys' lost-hold channels. Returns once the
    /// server confirmed a new subscription (or after the command timeout), as the Python library
    /// does: a loss right after the grant is then heard, not left to the next renewal. A
    /// subscription the ACL refused is returned at once ([`LockError::NoPermission`] naming
    /// the channel): the caller releases the grant. Any other failure leaves the watchdog alone
    /// to notice a loss.
    pub(crate) async fn start(
        self: &Arc<Self>,
        pushes: Option<(Pushes, Option<Changes>)>,
    ) -> Result<(), LockError> {
        let mut tasks = Vec::new();
        if let Some((pushes, changes)) = pushes {
            tasks.extend(self.spawn(watch_connection(Arc::downgrade(self), pushes, changes)));
        }
        let mut refused = None;
        if let Some(hub) = self.signals.clone() {
            let me: Arc<dyn Subscriber> = self.clone();
            let new = hub.watch(&Arc::downgrade(&me), &self.keys);
            if !new.is_empty() {
                let (done, subscribed) = tokio::sync::oneshot::channel();
                // Not one of the hold's tasks (other holds of the key count on it too), and
                // never cut short by this wait's timeout.
                let spawned = self.spawn(async move {
                    let _ = done.send(hub.subscribe(&new).await);
                });
                if spawned.is_some() {
                    if let Ok(Ok(Err(e @ LockError::NoPermission { .. }))) =
                        tokio::time::timeout(self.command_timeout, subscribed).await
                    {
                        refused = Some(e);
                    }
                }
            }
        }
        let mut inner = self.inner();
        if inner.machine.status() == Status::Active {
            inner.tasks.extend(tasks);
        } else {
            for task in tasks {
                task.abort();
            }
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The application releases the hold (its last guard): the machine stops the watchdog and
    /// the subscription. Returns whether to send the release, and the reason if the hold was
    /// lost before.
    pub(crate) fn release_requested(self: &Arc<Self>) -> (bool, Option<LostReason>) {
        let out = self.step(Event::ReleaseRequested);
        (out.release, self.lost_reason())
    }

    /// Sends the release (`LOCK.RELEASE`/`LOCK.MRELEASE`); the machine learns it was answered.
    /// Sent again after `TRYAGAIN` (in a cluster, a slot move caught between a multi-key hold's
    /// keys: nothing ran), after the pauses of [`TRYAGAIN_PAUSES`] (the shared cluster
    /// connection does this itself; an `EPHEMERAL` hold's own connection does not); after
    /// `MOVED`/`ASK` on an `EPHEMERAL` hold's own connection (its keys moved with their slot,
    /// bound to nothing there), sent on the shared connection, which follows the redirect, as
    /// the Python library does. Never after a connection error: it may have run.
    pub(crate) async fn send_release(self: Arc<Self>) -> Result<Value, LockError> {
        let mut pauses = TRYAGAIN_PAUSES.iter();
        let mut conn = self.connection();
        let reply = loop {
            let reply = conn.query(&self.release, self.key()).await;
            if is_redirect(&reply) && matches!(conn, HoldConn::Own(_)) {
                // The keys left the own connection's node with their slot: released where
                // they are now, on the shared connection (it follows the redirect).
                conn = HoldConn::Shared(self.reads.clone());
                continue;
            }
            match (&reply, pauses.next()) {
                (Err(LockError::Server(text)), Some(pause)) if text.starts_with("TRYAGAIN") => {
                    tokio::time::sleep(*pause).await;
                }
                _ => break reply,
            }
        };
        self.step(Event::ReleaseReplied);
        reply
    }

    /// Releases a hold this side no longer believes in while the server may still have it (a
    /// loss it may not know of, or a release that got no answer): by its token (`LOCK.RELEASE
    /// key owner TOKEN t`, which never counts down a later hold of the owner; a multi-key hold
    /// with its `LOCK.MRELEASE`), on the client's shared connection, which follows a failover
    /// to the new master and a cluster key to its node. Sent again after a connection error or
    /// a server that cannot serve it yet (a failover), pausing 50 ms doubling to 250 ms, for up to
    /// a lease: by then the server has ended the hold itself.
    pub(crate) async fn release_abandoned(self: Arc<Self>) {
        let cmd = match self.terms.form {
            Form::One => {
                let mut cmd = redis::cmd("LOCK.RELEASE");
                cmd.arg(self.key())
                    .arg(self.owner.as_bytes())
                    .arg("TOKEN")
                    .arg(self.token());
                cmd
            }
            Form::Many => (*self.release).clone(),
        };
        let started = Instant::now();
        let mut pause = FAILOVER_PAUSE;
        loop {
            match self.reads.query_routed(&cmd, Some(self.key())).await {
                Err(e) if not_yet(&e) && started.elapsed() + pause < self.terms.lease => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(FAILOVER_PAUSE_MAX);
                }
                _ => return,
            }
        }
    }

    /// A check a message asked for: one `LOCK.CHECK key owner token` per key (O(1), also on a
    /// key with many holds; `LOCK.INFO` on a module without it), on the shared connection, which
    /// in a cluster follows the key to its node; gone on any key is the hold gone. After a move,
    /// the subscription follows the key to its new node.
    async fn check(self: Arc<Self>, check: Check) {
        let mut sent = Instant::now();
        let mut answer = self.check_keys().await;
        if check.until_gone {
            // Its connection closed: the server ends the hold once it sees that; until then
            // it holds it (and so does this side). Bounded by the lease: the watchdog's deadline
            // ends the belief at the latest.
            let started = sent;
            let mut pause = CLOSE_RECHECK_FIRST;
            while !matches!(answer, Answer::Gone | Answer::Refused)
                && self.is_active()
                && started.elapsed() < self.terms.lease
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(CLOSE_RECHECK_MAX);
                sent = Instant::now();
                answer = self.check_keys().await;
            }
        }
        if check.moved && matches!(answer, Answer::Holds(_)) {
            // An EPHEMERAL hold's key moved: bound to nothing on the new node, it lives on.
            self.step(Event::Unbound);
        }
        self.step(Event::Answered {
            read: Read::Check(check.reason),
            sent,
            replied: Instant::now(),
            answer,
        });
        if check.moved && matches!(answer, Answer::Holds(_)) {
            if let Some(hub) = &self.signals {
                for key in self.keys.iter() {
                    // A failure leaves the watchdog alone to notice a loss.
                    let _ = hub.resubscribe(key).await;
                }
            }
        }
    }

    /// `LOCK.CHECK` of every key (see [`Hold::check`]): gone on any key is the hold gone.
    async fn check_keys(&self) -> Answer {
        let mut answer = Answer::Holds(None);
        for (key, token) in self.keys.iter().zip(self.tokens.iter()) {
            match self.check_key(key, *token).await {
                Answer::Holds(_) | Answer::Unacknowledged => {}
                Answer::Gone => return Answer::Gone,
                Answer::Refused => return Answer::Refused,
                Answer::Nothing => answer = Answer::Nothing,
            }
        }
        answer
    }

    /// A renewal on an `EPHEMERAL` hold's own connection was answered `MOVED`/`ASK`: in a
    /// cluster its key left that node with its slot. Checks where the key is now (the shared
    /// connection follows the redirect); if the hold is there it is bound to nothing and lives
    /// on: the machine is told ([`Event::Unbound`]), and the hold's commands go on the shared
    /// connection from here. Returns whether it did.
    async fn unbind_if_moved(self: &Arc<Self>) -> bool {
        if self.inner().machine.binding() != Binding::Connection {
            return false;
        }
        for (key, token) in self.keys.iter().zip(self.tokens.iter()) {
            if !matches!(self.check_key(key, *token).await, Answer::Holds(_)) {
                return false;
            }
        }
        self.step(Event::Unbound);
        true
    }

    /// A renewal's answer that says nothing (sent at `sent`).
    fn nothing(&self, sent: Instant) -> Event<'static> {
        Event::Answered {
            read: Read::Renewal,
            sent,
            replied: Instant::now(),
            answer: Answer::Nothing,
        }
    }

    /// Whether the server still has this hold on `key` (with `token`).
    async fn check_key(&self, key: &[u8], token: u64) -> Answer {
        let mut cmd = redis::cmd("LOCK.CHECK");
        cmd.arg(key).arg(self.owner.as_bytes()).arg(token);
        let reply = self.reads.query_routed(&cmd, Some(key)).await;
        match reply {
            Err(LockError::Server(text))
                if text.to_ascii_lowercase().contains("unknown command") =>
            {
                let mut cmd = redis::cmd("LOCK.INFO");
                cmd.arg(key);
                let reply = self.reads.query_routed(&cmd, Some(key)).await;
                self.note_denied([&reply]);
                reply::holder(&reply, self.owner.as_bytes(), token)
            }
            reply => {
                self.note_denied([&reply]);
                reply::checked(&reply)
            }
        }
    }
}

impl Timed for Hold {
    fn fire(self: Arc<Self>, now: Instant) {
        self.step(Event::Tick { now });
    }
}

impl Subscriber for Hold {
    fn hear(self: Arc<Self>, signal: &LostSignal) {
        self.step(Event::Signal(signal));
    }
}

/// How soon a hold whose connection closed is read again while the server still holds it
/// (doubling up to [`CLOSE_RECHECK_MAX`]): the server ends it as soon as it reads the close.
const CLOSE_RECHECK_FIRST: Duration = Duration::from_millis(2);
const CLOSE_RECHECK_MAX: Duration = Duration::from_millis(100);

/// The pushes of an `EPHEMERAL` hold's own connection.
pub(crate) type Pushes = mpsc::UnboundedReceiver<redis::PushInfo>;

/// Tells of a failover (through Sentinel).
pub(crate) type Changes = tokio::sync::watch::Receiver<u64>;

/// Reports an `EPHEMERAL` hold's connection closing to its machine, and the master it is bound
/// to being replaced (a failover: the hold is bound to nothing on the new master, and the old
/// one, if it comes back, no longer counts). A failover is watched for also after the
/// connection closed (the old master's death closes it first): the read that follows a close
/// finds the hold on the new master. The task ends with the hold (its tasks are aborted then).
async fn watch_connection(hold: Weak<Hold>, mut pushes: Pushes, changes: Option<Changes>) {
    let mut changed = std::pin::pin!(crate::master::changed(changes));
    let mut open = true;
    loop {
        let event = tokio::select! {
            push = pushes.recv(), if open => match push {
                Some(push) if push.kind != PushKind::Disconnection => continue,
                _ => {
                    open = false;
                    Event::ConnectionLost
                }
            },
            _ = &mut changed => Event::MasterReplaced,
        };
        let Some(hold) = hold.upgrade() else {
            return;
        };
        let replaced = matches!(event, Event::MasterReplaced);
        hold.step(event);
        if replaced {
            return;
        }
    }
}

/// The pauses before a release answered `TRYAGAIN` is sent again (50 ms doubling, five times:
/// 1.55 s in all, as the Python library's `TRYAGAIN_PAUSES`).
const TRYAGAIN_PAUSES: [Duration; 5] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];

/// Whether a reply is a cluster redirect (`MOVED`, `ASK`).
fn is_redirect(reply: &Result<Value, LockError>) -> bool {
    Redirect::in_reply(reply).is_some()
}

fn no_confirmation() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "granted after a long wait, but the server answered no confirmation",
    ))
}

/// An answer that says the command did not run and may run in a moment: no answer, or a server
/// in a failover or a slot move (`READONLY`: still the old master's connection; `LOADING`,
/// `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`; `NOREPLICAS`: a master with `min-replicas-to-write`
/// refuses writes until its replicas are back, as after a failover; `BUSY`: a script or function
/// past `busy-reply-threshold`, and the server runs nothing else until it ends or is killed).
pub(crate) fn not_yet(e: &LockError) -> bool {
    match e {
        LockError::Server(text) => [
            "READONLY",
            "LOADING",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "NOREPLICAS",
            "BUSY ", // the code BUSY, not BUSYKEY or BUSYGROUP
        ]
        .iter()
        .any(|code| text.starts_with(code)),
        e => e.is_retryable(),
    }
}
