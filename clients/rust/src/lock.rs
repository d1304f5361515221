//! Lock handles: one owner identity on one key, and how it acquires.

use std::borrow::Cow;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use redis::{Cmd, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::ClientInner;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::hold::{self, millis, Form, HoldConn, HoldCore, NewHold, OwnConnection, Renewal};
use crate::lost::{LostReason, LostWatch};
use crate::servers::Found;

/// The default lease: Redisson's 30 s, renewed by the watchdog every 10 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How much longer than the server-side wait a waiting connection's read timeout is.
const WAIT_MARGIN: Duration = Duration::from_secs(2);

/// How many times an acquire is sent again after its connection broke or timed out. Safe
/// because every acquire carries `ONCE`.
const RETRIES: u32 = 2;

/// The kind of hold a [`Lock`] handle takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The exclusive lock (and write side of the read-write lock).
    Exclusive,
    /// A shared (read) hold: `LOCK.ACQUIRE ... SHARED`.
    Shared,
    /// One permit of a counting semaphore: `LOCK.ACQUIRE ... LIMIT n`.
    Permit {
        /// The semaphore's number of permits.
        limit: u32,
    },
}

/// How long [`Lock::acquire`] waits for a busy key (in the server: `LOCK.ACQUIRE ... WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until the key is granted (`WAIT 0`). The default.
    Forever,
    /// At most this long, then [`LockError::Timeout`]. A zero timeout is one attempt.
    Timeout(Duration),
}

/// A handle on one key, with its own owner identity (`<client id>:<n>`).
///
/// Re-entry is per handle: while a guard of this handle holds the key, acquiring again through
/// the same handle (or a clone of it) succeeds at once with the same fencing token, and the hold
/// ends when the last of its guards is released. The server sees one hold per handle (count 1):
/// every `LOCK.ACQUIRE` carries `ONCE`, which makes a re-sent acquire (after a timeout or a broken
/// connection) harmless, and lets the library retry it. Two handles, even on the same key and
/// client, are two owners and exclude each other.
///
/// The options (`lease`, `wait_timeout`, `ephemeral`, ...) are set on the handle before use; a
/// clone keeps them and shares the owner.
///
/// ```no_run
/// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
/// use std::time::Duration;
///
/// let lock = client
///     .lock("report")
///     .lease(Duration::from_secs(10))          // renewed every ~3.3 s while held
///     .wait_timeout(Duration::from_secs(5));   // acquire() waits in the server, at most 5 s
/// match lock.try_acquire().await? {
///     Some(guard) => println!("got it at once, token {}", guard.token()),
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    state: Arc<HandleState>,
    lease: Duration,
    renewal: Renewal,
    wait: Wait,
    ephemeral: bool,
    /// `LOCK.ACQUIRE` without `WAIT` as these options make it, built once (a builder method
    /// that changes an option clears it).
    acquire: OnceLock<Cmd>,
}

/// The command a handle acquires with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// `LOCK.ACQUIRE key ...`.
    Acquire,
    /// `LOCK.MACQUIRE numkeys key... ...`: every key at once.
    MultiAcquire,
    /// `LOCK.CAMPAIGN key candidate ...`: an exclusive hold that the server announces.
    Campaign,
}

/// What all clones of a handle share: its identity and its current hold.
pub(crate) struct HandleState {
    pub(crate) client: Arc<ClientInner>,
    /// The keys (one, but for a multi-key handle).
    keys: Arc<[Arc<[u8]>]>,
    owner: Arc<str>,
    /// `LOCK.RELEASE key owner` (`LOCK.MRELEASE n key... owner`), the same for every hold of the
    /// handle.
    release: Arc<Cmd>,
    kind: Kind,
    verb: Verb,
    /// One acquire at a time per handle (the server lets an owner wait once per key anyway).
    gate: tokio::sync::Mutex<()>,
    slot: Mutex<Option<ActiveHold>>,
}

/// The handle's current hold and how many guards share it.
pub(crate) struct ActiveHold {
    core: Arc<HoldCore>,
    guards: usize,
    tasks: Vec<JoinHandle<()>>,
}

impl ActiveHold {
    /// Takes the hold off its keeper's schedule and stops its tasks (no renewal after this) and
    /// its signal subscription.
    pub(crate) fn stop(self) {
        self.core.keeper.cancel(&self.core);
        for task in &self.tasks {
            task.abort();
        }
        if let (Some(hub), Some(runtime)) = (self.core.signals.clone(), &self.core.runtime) {
            let core = self.core.clone();
            runtime.spawn(async move { hub.unwatch(&core).await });
        }
    }
}

/// What ending one guard did to the handle's hold.
pub(crate) enum GuardEnd {
    /// Other guards of the hold remain.
    Remaining,
    /// That was the hold's last guard: the caller sends the release.
    Last(ActiveHold),
    /// The guard's hold was no longer the handle's (it was lost and replaced).
    Stale,
}

impl HandleState {
    /// The first key: the one a connection of its own is opened for.
    fn key(&self) -> &[u8] {
        self.keys.first().map_or(&[], |k| k)
    }

    fn form(&self) -> Form {
        match self.verb {
            Verb::MultiAcquire => Form::Many,
            Verb::Acquire | Verb::Campaign => Form::One,
        }
    }

    fn slot(&self) -> MutexGuard<'_, Option<ActiveHold>> {
        // The slot is only swapped or counted under this lock; a panic elsewhere cannot leave
        // it half-updated, so a poisoned lock is used as it is.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One guard of `core` ends.
    pub(crate) fn end_guard(&self, core: &Arc<HoldCore>) -> GuardEnd {
        let mut slot = self.slot();
        match slot.as_mut() {
            Some(active) if Arc::ptr_eq(&active.core, core) => {
                active.guards = active.guards.saturating_sub(1);
                if active.guards > 0 {
                    return GuardEnd::Remaining;
                }
                match slot.take() {
                    Some(active) => GuardEnd::Last(active),
                    None => GuardEnd::Stale,
                }
            }
            _ => GuardEnd::Stale,
        }
    }
}

impl Lock {
    pub(crate) fn new(
        client: Arc<ClientInner>,
        keys: Vec<Arc<[u8]>>,
        owner: Arc<str>,
        kind: Kind,
        verb: Verb,
    ) -> Lock {
        let mut release = match verb {
            Verb::MultiAcquire => {
                let mut cmd = redis::cmd("LOCK.MRELEASE");
                cmd.arg(keys.len());
                cmd
            }
            Verb::Acquire | Verb::Campaign => redis::cmd("LOCK.RELEASE"),
        };
        for key in &keys {
            release.arg(&**key);
        }
        release.arg(owner.as_bytes());
        Lock {
            state: Arc::new(HandleState {
                client,
                keys: keys.into(),
                owner,
                release: Arc::new(release),
                kind,
                verb,
                gate: tokio::sync::Mutex::new(()),
                slot: Mutex::new(None),
            }),
            lease: DEFAULT_LEASE,
            renewal: Renewal::Watchdog,
            wait: Wait::Forever,
            ephemeral: false,
            acquire: OnceLock::new(),
        }
    }

    /// The lease each hold gets on the server (default [`DEFAULT_LEASE`], 30 s). The watchdog
    /// renews it every `lease / 3` while the hold lasts; if it cannot for a whole lease, the
    /// hold is reported lost ([`LostReason::Unreachable`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.renewal = Renewal::Watchdog;
        self.acquire = OnceLock::new();
        self
    }

    /// A lease nothing renews: the hold ends on the server `lease` after the acquire (or
    /// re-entry), and the guard reports [`LostReason::LeaseEnded`] then.
    pub fn fixed_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.renewal = Renewal::Fixed;
        self.acquire = OnceLock::new();
        self
    }

    /// How long [`Lock::acquire`] waits in the server for a busy key (default: until granted).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait = Wait::Timeout(timeout);
        self
    }

    /// Holds are `EPHEMERAL`: bound to a connection the guard owns, they end in the server the
    /// moment that connection closes (the process died, the socket broke, `CLIENT KILL`). Any
    /// error on that connection reports the hold lost ([`LostReason::ConnectionClosed`]); it is
    /// never reconnected. Caveat: the server's `timeout` setting closes idle connections; the
    /// watchdog's renewals keep it busy at `lease / 3`, so keep `timeout` at 0 (the default) or
    /// well above a third of the lease — and with [`Lock::fixed_lease`] nothing is sent at all.
    pub fn ephemeral(mut self) -> Self {
        self.ephemeral = true;
        self.acquire = OnceLock::new();
        self
    }

    /// The same handle (owner, keys, options) taking holds of another kind; nothing it held is
    /// carried over.
    pub(crate) fn with_kind(self, kind: Kind) -> Lock {
        let state = &self.state;
        let mut lock = Lock::new(
            state.client.clone(),
            state.keys.to_vec(),
            state.owner.clone(),
            kind,
            state.verb,
        );
        lock.lease = self.lease;
        lock.renewal = self.renewal;
        lock.wait = self.wait;
        lock.ephemeral = self.ephemeral;
        lock
    }

    /// Holds that are not `EPHEMERAL` (the default of a lock; an election's is `EPHEMERAL`).
    pub(crate) fn without_ephemeral(mut self) -> Self {
        self.ephemeral = false;
        self.acquire = OnceLock::new();
        self
    }

    /// The wait [`Lock::acquire`] uses.
    pub(crate) fn wait(&self) -> Wait {
        self.wait
    }

    /// The client the handle was made by.
    pub(crate) fn client(&self) -> &Arc<ClientInner> {
        &self.state.client
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        self.state.key()
    }

    /// The keys (one, but for a multi-key handle), in the order given.
    pub(crate) fn keys(&self) -> &[Arc<[u8]>] {
        &self.state.keys
    }

    /// The owner string this handle sends (`<client id>:<n>`).
    pub fn owner(&self) -> &str {
        &self.state.owner
    }

    /// The kind of hold this handle takes.
    pub fn kind(&self) -> Kind {
        self.state.kind
    }

    /// Takes the key if it is free (or re-enters this handle's hold), without waiting:
    /// `Ok(None)` when another owner holds it or others wait for it.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        self.acquire_inner(None, None).await
    }

    /// Takes the key, waiting in the server (FIFO, no polling) as long as
    /// [`Lock::wait_timeout`] allows; [`LockError::Timeout`] when it passes. The wait runs on a
    /// connection of its own, whose read timeout is above the wait, so it delays no other
    /// command. Dropping the future closes that connection, and the server forgets the waiter.
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.acquire_waiting(self.wait, None).await
    }

    /// [`Lock::acquire`] with this `wait`, and `VALUE value` for a campaign.
    pub(crate) async fn acquire_waiting(
        &self,
        wait: Wait,
        value: Option<&[u8]>,
    ) -> Result<LockGuard, LockError> {
        match self.acquire_inner(Some(wait), value).await? {
            Some(guard) => Ok(guard),
            None => Err(LockError::Timeout {
                waited: match wait {
                    Wait::Timeout(t) => t,
                    Wait::Forever => Duration::ZERO,
                },
            }),
        }
    }

    /// Runs `work` while holding the key: acquires (as [`Lock::acquire`]), calls
    /// `work(token, lost)` and polls its future beside the hold's loss. If the hold is lost
    /// first, the work's future is dropped at once (at its next `.await`: code between two
    /// awaits is not interrupted) and the answer is [`LockError::NotHeld`] with the reason;
    /// otherwise the hold is released and the work's output returned.
    ///
    /// `lost` is a [`LostWatch`] for work that must check before a step it cannot undo (or hand
    /// to a thread of its own). Pass `token` with every write to the protected resource.
    ///
    /// A hold found lost at the release (after the work finished) is also
    /// [`LockError::NotHeld`]: nothing then proves the work ran under the lock to its end. A
    /// release that cannot be sent is not an error of the work: the hold ends at its lease end.
    ///
    /// ```no_run
    /// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// let lock = client.lock("reports:daily");
    /// let rows = lock
    ///     .run(|token, _lost| async move {
    ///         // ... write with `token` as the fence ...
    ///         42
    ///     })
    ///     .await?; // Err(LockError::NotHeld { lost: Some(reason) }) if the hold was lost
    /// # let _ = rows; Ok(()) }
    /// ```
    pub async fn run<T, F, Fut>(&self, work: F) -> Result<T, LockError>
    where
        F: FnOnce(u64, LostWatch) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let mut guard = self.acquire().await?;
        let lost = guard.lost();
        let output = tokio::select! {
            biased;
            reason = lost => {
                // Dropping the guard here (the error path) stops the watchdog; nothing to
                // release.
                return Err(LockError::NotHeld { lost: Some(reason) });
            }
            output = work(guard.token(), guard.watch()) => output,
        };
        match guard.release().await {
            Ok(_) | Err(LockError::Connection(_)) => Ok(output),
            Err(e) => Err(e),
        }
    }

    /// `LOCK.ACQUIRE key owner lease [SHARED | LIMIT n] [EPHEMERAL] ONCE [WAIT ms]`,
    /// `LOCK.MACQUIRE n key... owner lease [SHARED] [EPHEMERAL] ONCE [WAIT ms]`, or
    /// `LOCK.CAMPAIGN key candidate lease [EPHEMERAL] [WAIT ms] [VALUE v]`.
    fn acquire_cmd(&self, wait: Option<Wait>, value: Option<&[u8]>) -> Cow<'_, Cmd> {
        let base = self.acquire.get_or_init(|| {
            let mut cmd = match self.state.verb {
                Verb::Acquire => redis::cmd("LOCK.ACQUIRE"),
                Verb::MultiAcquire => {
                    let mut cmd = redis::cmd("LOCK.MACQUIRE");
                    cmd.arg(self.state.keys.len());
                    cmd
                }
                Verb::Campaign => redis::cmd("LOCK.CAMPAIGN"),
            };
            for key in self.state.keys.iter() {
                cmd.arg(&**key);
            }
            cmd.arg(self.state.owner.as_bytes()).arg(millis(self.lease));
            match self.state.kind {
                Kind::Exclusive => {}
                Kind::Shared => {
                    cmd.arg("SHARED");
                }
                Kind::Permit { limit } => {
                    cmd.arg("LIMIT").arg(limit);
                }
            }
            if self.ephemeral {
                cmd.arg("EPHEMERAL");
            }
            if self.state.verb != Verb::Campaign {
                // A campaign is ONCE by itself (a leader campaigning again keeps its epoch).
                cmd.arg("ONCE");
            }
            cmd
        });
        let ms = match wait {
            None | Some(Wait::Timeout(Duration::ZERO)) => None,
            Some(Wait::Forever) => Some(0),
            Some(Wait::Timeout(t)) => Some(millis(t)),
        };
        if ms.is_none() && value.is_none() {
            return Cow::Borrowed(base);
        }
        let mut cmd = base.clone();
        if let Some(ms) = ms {
            cmd.arg("WAIT").arg(ms);
        }
        if let Some(value) = value {
            cmd.arg("VALUE").arg(value);
        }
        Cow::Owned(cmd)
    }

    async fn acquire_inner(
        &self,
        wait: Option<Wait>,
        value: Option<&[u8]>,
    ) -> Result<Option<LockGuard>, LockError> {
        if self.lease.is_zero() {
            return Err(LockError::InvalidArgument(
                "the lease must be at least 1 ms",
            ));
        }
        check_keys(&self.state.keys)?;
        let wait = match wait {
            Some(Wait::Timeout(Duration::ZERO)) => None,
            w => w,
        };
        let _gate = self.state.gate.lock().await;
        let current = self
            .state
            .slot()
            .as_ref()
            .filter(|a| a.core.status.is_active())
            .map(|a| a.core.clone());
        let sent = Instant::now();
        let (reply, own) = if self.ephemeral {
            let (reply, own) = self.send_ephemeral(current.as_ref(), wait, value).await;
            match reply {
                Ok(reply) => (reply, own),
                Err(e) => {
                    if let Some(c) = &current {
                        if matches!(c.conn, HoldConn::Own(_)) && e.is_retryable() {
                            c.lose(LostReason::ConnectionClosed);
                        }
                    }
                    return Err(e);
                }
            }
        } else {
            (self.send_with_retries(wait, value).await?, None)
        };
        let tokens = parse_tokens(reply, self.state.keys.len())?;
        self.settle(current, tokens, sent, own)
    }

    /// Sends the acquire on the shared connection (no wait) or on a fresh connection of its own
    /// (wait), again after a broken or timed-out connection: `ONCE` makes that safe.
    async fn send_with_retries(
        &self,
        wait: Option<Wait>,
        value: Option<&[u8]>,
    ) -> Result<Value, LockError> {
        let until = match wait {
            Some(Wait::Timeout(t)) => Some(Instant::now() + t),
            _ => None,
        };
        let mut attempt = 0;
        loop {
            let this_wait = match (wait, until) {
                (Some(Wait::Timeout(_)), Some(until)) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        // A retry with no wait left: one last attempt without waiting.
                        None
                    } else {
                        Some(Wait::Timeout(left))
                    }
                }
                (w, _) => w,
            };
            let cmd = self.acquire_cmd(this_wait, value);
            let reply = match this_wait {
                None => {
                    let key = self.state.key();
                    self.state
                        .client
                        .commands
                        .query_routed(&cmd, Some(key))
                        .await
                }
                Some(w) => self.send_waiting(&cmd, w).await,
            };
            match reply {
                Err(e) if e.is_retryable() && attempt < RETRIES => attempt += 1,
                r => return r,
            }
        }
    }

    /// A waiting acquire, on a connection opened for it (to the key's node) and closed after it.
    async fn send_waiting(&self, cmd: &Cmd, wait: Wait) -> Result<Value, LockError> {
        let limit = match wait {
            Wait::Forever => None,
            Wait::Timeout(t) => Some(t + WAIT_MARGIN),
        };
        self.send_on_own_connection(cmd, Pushes::No, limit).await.0
    }

    /// An `EPHEMERAL` acquire: on the current hold's own connection (a re-entry), or on a new
    /// one that the new hold will own. No retry: a broken connection took its hold with it.
    async fn send_ephemeral(
        &self,
        current: Option<&Arc<HoldCore>>,
        wait: Option<Wait>,
        value: Option<&[u8]>,
    ) -> (Result<Value, LockError>, Option<OwnConnection>) {
        let client = &self.state.client;
        let limit = match wait {
            None => Some(client.command_timeout),
            Some(Wait::Forever) => None,
            Some(Wait::Timeout(t)) => Some(t + WAIT_MARGIN),
        };
        let cmd = self.acquire_cmd(wait, value);
        let existing = current.and_then(|c| match &c.conn {
            HoldConn::Own(conn) => Some(conn.clone()),
            HoldConn::Shared(_) => None,
        });
        match existing {
            Some(mut conn) => (
                within(limit, cmd.query_async::<Value>(&mut conn)).await,
                None,
            ),
            None => self.send_on_own_connection(&cmd, Pushes::Yes, limit).await,
        }
    }

    /// Sends `cmd` on a new connection to the node that serves the key (the one server, or the
    /// master of the key's slot in the client's slot map), following `MOVED` (the slot moved:
    /// the map is dropped, to be read again by the next lookup) and `ASK` (with `ASKING`: the
    /// slot is moving) to another node. A node of the map that cannot be reached also drops the
    /// map, and the node is looked up once more: nothing was sent to it. Returns the connection
    /// the answer came on.
    async fn send_on_own_connection(
        &self,
        cmd: &Cmd,
        pushes: Pushes,
        limit: Option<Duration>,
    ) -> (Result<Value, LockError>, Option<OwnConnection>) {
        let servers = &self.state.client.servers;
        let timeout = self.state.client.command_timeout;
        let (mut node, mut found) = match servers.node_of(self.state.key()).await {
            Ok(found) => found,
            Err(e) => return (Err(e), None),
        };
        let mut asking = false;
        let mut redirects = 0;
        loop {
            let (target, push) = match pushes {
                Pushes::Yes => (&node.resp3, true),
                Pushes::No => (&node.client, false),
            };
            let mut own = match hold::own_connection(target, push, timeout).await {
                Ok(own) => own,
                Err(_) if found == Found::FromSlotMap => {
                    servers.forget_slots();
                    (node, found) = match servers.node_of(self.state.key()).await {
                        Ok((node, _)) => (node, Found::Sure),
                        Err(e) => return (Err(e), None),
                    };
                    continue;
                }
                Err(e) => return (Err(e), None),
            };
            if asking {
                if let Err(e) = redis::cmd("ASKING")
                    .query_async::<Value>(&mut own.conn)
                    .await
                {
                    return (Err(LockError::from(e)), None);
                }
            }
            let reply = match limit {
                None => cmd.query_async::<Value>(&mut own.conn).await,
                Some(limit) => {
                    match tokio::time::timeout(limit, cmd.query_async(&mut own.conn)).await {
                        Ok(r) => r,
                        Err(_) => return (Err(timed_out()), None),
                    }
                }
            };
            match &reply {
                Err(e) if redirects < REDIRECTS => {
                    if let Some((address, _slot)) = e.redirect_node() {
                        asking = e.code() == Some("ASK");
                        if !asking {
                            servers.forget_slots();
                        }
                        node = match servers.node_at(address, &node) {
                            Ok(node) => node,
                            Err(e) => return (Err(e), None),
                        };
                        found = Found::Sure;
                        redirects += 1;
                        continue;
                    }
                }
                _ => {}
            }
            return (reply.map_err(LockError::from), Some(own));
        }
    }

    /// Turns the server's answer into a guard: a re-entry of the current hold, or a new hold
    /// (the current one, if any, is then gone).
    fn settle(
        &self,
        current: Option<Arc<HoldCore>>,
        tokens: Option<Vec<u64>>,
        sent: Instant,
        own: Option<OwnConnection>,
    ) -> Result<Option<LockGuard>, LockError> {
        let state = &self.state;
        if let (Some(t), Some(c)) = (&tokens, &current) {
            if *c.tokens == **t {
                let mut slot = state.slot();
                if let Some(active) = slot.as_mut().filter(|a| Arc::ptr_eq(&a.core, c)) {
                    active.guards += 1;
                    c.extend(sent);
                    return Ok(Some(LockGuard::new(state.clone(), c.clone())));
                }
            }
        }
        // Whatever the handle held is gone: the server answered another token, or nil.
        if let Some(c) = &current {
            c.lose(LostReason::HoldGone);
        }
        let old = state.slot().take();
        if let Some(old) = old {
            old.stop();
        }
        let Some(tokens) = tokens else {
            return Ok(None);
        };
        let client = &state.client;
        let (conn, pushes) = match own {
            Some(mut own) => {
                own.conn.set_response_timeout(client.command_timeout);
                (HoldConn::Own(own.conn), own.pushes)
            }
            None => (HoldConn::Shared(client.commands.clone()), None),
        };
        let core = HoldCore::new(NewHold {
            keys: state.keys.clone(),
            form: state.form(),
            owner: state.owner.clone(),
            release: state.release.clone(),
            tokens: tokens.into(),
            lease: self.lease,
            conn,
            sent,
            signals: client.signals.clone(),
            renewal: self.renewal,
            keeper: client.keepers.current(),
        });
        core.start_keeping(sent);
        let mut tasks = Vec::new();
        if let Some(pushes) = pushes {
            tasks.push(tokio::spawn(hold::watch_connection(
                Arc::downgrade(&core),
                pushes,
            )));
        }
        if let Some(hub) = client.signals.clone() {
            let watched = core.clone();
            tasks.push(tokio::spawn(async move {
                // A failed subscription leaves the watchdog alone to notice a loss.
                let _ = hub.watch(&watched).await;
            }));
        }
        *state.slot() = Some(ActiveHold {
            core: core.clone(),
            guards: 1,
            tasks,
        });
        Ok(Some(LockGuard::new(state.clone(), core)))
    }
}

/// Whether a connection of its own needs the server's pushes (RESP3): an `EPHEMERAL` hold's
/// does, to see its close at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pushes {
    Yes,
    No,
}

/// How many `MOVED`/`ASK` redirects one acquire on a connection of its own follows.
const REDIRECTS: u32 = 3;

fn timed_out() -> LockError {
    LockError::Connection(redis::RedisError::from(io::Error::new(
        io::ErrorKind::TimedOut,
        "LOCK.ACQUIRE got no reply in time",
    )))
}

/// `query` within `limit` (none: as long as it takes).
async fn within(
    limit: Option<Duration>,
    query: impl std::future::Future<Output = redis::RedisResult<Value>>,
) -> Result<Value, LockError> {
    match limit {
        None => query.await.map_err(LockError::from),
        Some(limit) => match tokio::time::timeout(limit, query).await {
            Ok(r) => r.map_err(LockError::from),
            Err(_) => Err(timed_out()),
        },
    }
}

/// The most keys one multi-key hold takes (the server's bound).
pub(crate) const MAX_KEYS: usize = 64;

/// The keys of a handle: 1 to [`MAX_KEYS`], distinct. Checked before anything is sent.
fn check_keys(keys: &[Arc<[u8]>]) -> Result<(), LockError> {
    if keys.is_empty() {
        return Err(LockError::InvalidArgument("a multi-key lock needs a key"));
    }
    if keys.len() > MAX_KEYS {
        return Err(LockError::InvalidArgument(
            "a multi-key lock takes at most 64 keys",
        ));
    }
    for (i, key) in keys.iter().enumerate() {
        if keys.iter().skip(i + 1).any(|other| other == key) {
            return Err(LockError::InvalidArgument(
                "a multi-key lock names each key once",
            ));
        }
    }
    Ok(())
}

/// An acquire's reply: a token > 0 (`LOCK.ACQUIRE`, `LOCK.CAMPAIGN`), an array of `keys`
/// tokens (`LOCK.MACQUIRE`), or nil.
fn parse_tokens(reply: Value, keys: usize) -> Result<Option<Vec<u64>>, LockError> {
    let token = |v: &Value| match v {
        Value::Int(n) if *n > 0 => u64::try_from(*n).ok(),
        _ => None,
    };
    let tokens = match &reply {
        Value::Nil => return Ok(None),
        Value::Array(items) if items.len() == keys => items.iter().map(token).collect(),
        single => token(single).map(|t| vec![t]),
    };
    match tokens {
        Some(tokens) => Ok(Some(tokens)),
        None => Err(LockError::UnexpectedReply(format!(
            "the acquire answered {reply:?}"
        ))),
    }
}
