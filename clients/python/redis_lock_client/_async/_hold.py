"""One hold, around its state machine (``_lifecycle.py``): the shell turns replies, messages
and the passing of time into the machine's events (``_event``) and carries out the actions it
returns: the confirmation of a grant after a long wait, the watchdog's renewals, the checks a
message or a closed connection calls for, a loss reported, a release in the background.

A hold does not know the client that made it: it reaches its server through a ``Route``.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Optional, Protocol

from .. import _fork
from .._commands import (
    NO_REPLICATION,
    KeySet,
    Replication,
    check,
    fence_refusal,
    guard,
    holder_ttl,
    info,
    is_final,
    is_not_yet,
    is_retry_later,
    release_token,
)
from .._common import (
    FAILOVER_PAUSE,
    FAILOVER_PAUSE_MAX,
    RETRIES,
    TRYAGAIN_PAUSES,
    Arg,
    Fenced,
    LockConnectionError,
    LockError,
    LockServerError,
    LostCallback,
    LostReason,
    NoPermission,
    NotHeld,
    Renewal,
    UnexpectedReply,
)
from .._connect import Redirected
from .. import _lifecycle as life
from .._lifecycle import Answer, Answered, CheckRead, Holds, HoldMachine, Phase, Read, Refusal
from .._messages import Flushed, HoldEnded, KeyEnded, LostMessage, lost_signal_channel
from .._watchdog import OVER, Look
from ._backend import (
    Event,
    LostEvent,
    Mutex,
    Watch,
    Watchdog,
    current_loop,
    sleep,
    spawn,
    spawn_from_any_thread,
    spawn_short,
    wait_event,
)
from ._connection import OwnClosed, OwnConnection

log = logging.getLogger("redis_lock_client")


class Route(Protocol):
    """How a hold reaches the server of its keys (the client that made it gives it one)."""

    async def query(
        self, args: list[Any], then: Optional[list[Any]] = None, then_timeout: float = 0.0
    ) -> Any:
        """One command on a pooled connection to the keys' server, following MOVED and ASK;
        ``then``: a second one on the same connection (the answer is then the pair)."""
        ...

    async def watch(self, hold: Hold) -> None:
        """Listens to the hold's lost-hold channels (returns once subscribed, or after the
        command timeout)."""
        ...

    def unwatch(self, hold: Hold) -> None: ...

    async def replaced(self, own: OwnConnection) -> bool:
        """Whether the server ``own`` reached is no longer the master (under Sentinel: the
        Sentinels name another, a failover); False elsewhere."""
        ...

    async def relocate(self, hold: Hold) -> None:
        """The keys' slot moved (cluster): listen on the node that serves it now."""
        ...

    def where(self) -> Optional[str]:
        """The node the keys' commands go to as far as the client knows now, without asking
        anyone (a cluster: the slot's master, ``host:port``); None: the one server, or not
        known."""
        ...


#: How soon a hold whose connection closed is read again while the server still holds it
#: (doubling up to ``CLOSE_RECHECK_MAX``): the server ends it as soon as it reads the close.
CLOSE_RECHECK_FIRST = 0.002
CLOSE_RECHECK_MAX = 0.1
#: How often the watchdog looks at an EPHEMERAL hold's connection, so that its close is seen at
#: once.
OWN_LOOK = 0.1


class _Renewal(enum.Enum):
    """What one renewal (or confirmation) found; ``_answer`` says it to the machine."""

    HELD = "held"  # answered 1 for every key (and, replicated, acknowledged)
    GONE = "gone"  # answered 0 for a key, or a final error
    CLOSED = "closed"  # the EPHEMERAL hold's connection failed
    NO_ANSWER = "no-answer"  # a broken connection, a timeout, a passing error
    UNACKED = "unacked"  # answered 1, but fewer replicas than asked acknowledged it
    REFUSED = "refused"  # the ACL refused the renewal or the check of its token (NOPERM)


class Unconfirmed(enum.Enum):
    """Why ``confirm`` did not confirm a grant."""

    GONE = "gone"  # the server no longer has it
    UNACKED = "unacked"  # fewer replicas than asked acknowledged it


class Hold:
    """One hold (of one key, or of several taken together): what every guard of it, its
    watchdog and the signal listener share."""

    def __init__(
        self,
        *,
        route: Route,
        watchdog: Watchdog,
        keys: KeySet,
        owner: bytes,
        tokens: tuple[int, ...],
        db: int,
        lease: float,
        renewal: Renewal,
        own: Optional[OwnConnection],
        sent_at: float,
        replied_at: float,
        on_lost: Optional[LostCallback],
        replication: Replication = NO_REPLICATION,
        abandoned: Optional[Callable[[Hold], None]] = None,
    ) -> None:
        self.route = route
        #: The client's watchdog, which renews the hold once ``start``ed.
        self._watchdog = watchdog
        self._watch: Optional[Watch] = None
        #: Who sends this hold's release in the background when this side stops believing in
        #: it while the server may still have it (the handle, which counts it: its next acquire
        #: waits for it); None: sent uncounted.
        self.abandoned = abandoned
        self.replication = replication
        #: What the last renewal's WAIT (WAITAOF) answered, for the error of an unsafe grant.
        self.acknowledged: object = None
        self.keys = keys
        self.key = keys.route
        self.owner = owner
        self.tokens = tokens
        self.token = tokens[0]
        self.db = db
        self.lease = lease
        self.own = own
        self.on_lost = on_lost
        #: Each lost-hold channel of the hold's keys (``a`` and ``{a}`` share one).
        self.channels = {lost_signal_channel(k) for k in keys.keys}
        #: ``guard.lost``: looks at the local deadline whenever it is read (``LostEvent``); by a
        #: weak reference, so that the event does not keep the hold alive.
        self.lost_event: Event = LostEvent(_looker(self))
        #: Nothing renews any more (lost, released, being released).
        self._stopped = False
        # Held while a renewal is in flight: a release waits for it, so nothing renews after.
        self._renewing = Mutex()
        # The machine asked for a renewal the watchdog has not started yet (``look``).
        self._renew_asked = False
        self._lock = threading.Lock()
        # Held while an event is applied and its loss reported (callback included): whoever
        # reads the state through it sees a loss only once the application was told of it.
        self._reporting = threading.RLock()
        self._machine = HoldMachine(
            db=db,
            owner=owner,
            tokens=dict(zip(keys.keys, tokens)),
            lease=lease,
            renewal=renewal,
            replicated=replication.on,
            ephemeral=own is not None,
            multi=keys.multi,
        )
        #: What the grant asked for: the guard handed out, or first a confirmation (``confirm``).
        self._granted = self._machine.step(life.Granted(sent_at, replied_at))
        #: The first refusal (NOPERM) of a command that keeps the hold, raised by the guard's
        #: calls once the hold ended so.
        self.denial: Optional[NoPermission] = None
        self.pid = os.getpid()
        self.loop = current_loop()
        _fork.register(self)

    # -- state -------------------------------------------------------------------------------

    @property
    def reason(self) -> Optional[LostReason]:
        return self._machine.reason

    @property
    def active(self) -> bool:
        return self._machine.active

    def not_held(self) -> NotHeld | NoPermission:
        """The error a call on a hold that is no longer active raises: the refusal that ended
        it (``NoPermission``), or ``NotHeld`` with the reason."""
        if self.reason is LostReason.NO_PERMISSION and self.denial is not None:
            return self.denial
        return NotHeld(self.reason)

    def _denied(self, e: NoPermission) -> _Renewal:
        if self.denial is None:
            self.denial = e
        return _Renewal.REFUSED

    def _event(self, event: life.Event, looking: bool = False) -> life.Actions:
        """Steps the machine with one event and carries out what it asks that needs no caller:
        a loss reported (once: ``lost`` is set, then ``on_lost`` is called), a release in the
        background, a check, a renewal handed to the watchdog (``looking``: the watchdog's own
        look, which takes it). The rest (a confirmation, a refusal, the release) is the
        caller's, from the actions returned."""
        with self._reporting:
            with self._lock:
                out = self._machine.step(event)
                # The watchdog's renewal (a grant's confirmation is ``confirm``'s).
                renewal = out.renew and self._machine.phase is Phase.HELD
                if renewal:
                    self._renew_asked = True
            if renewal and not looking:  # asked on another tick than the watchdog's: it looks now
                watch = self._watch
                if watch is not None:
                    watch.wake()
            if out.abandon:
                self.abandon()
            if out.check is not None:
                self._start_check(out.check)
            if out.lost is not None:
                self._stop_watching()
                self.lost_event.set()
                self.route.unwatch(self)
                if self.on_lost is not None:
                    try:
                        self.on_lost(out.lost)
                    except Exception:  # noqa: BLE001 - a callback's failure must not stop us
                        log.exception("the lost callback of lock %r raised", self.keys.keys)
        return out

    def abandon(self) -> None:
        """Releases the hold by its token in the background (``release_abandoned``), counted by
        the handle when it has one (from any thread: nothing here waits)."""
        if self.abandoned is not None:
            self.abandoned(self)
        else:
            spawn_from_any_thread(self.loop, "redis-lock-abandoned", self.release_abandoned)

    async def release_abandoned(self) -> None:
        """Releases a hold this side no longer believes in while the server may still have it
        (a loss it may not know of, a release that got no answer, a grant not confirmed): by
        its token (``LOCK.RELEASE key owner TOKEN t``, which never releases a later hold of the
        owner; a multi-key hold with its ``LOCK.MRELEASE``), through the route (the client's
        shared connections, which follow a Sentinel failover to the new master and a cluster
        key to its node). Sent again after no answer or a server that cannot serve it yet
        (``is_not_yet``: READONLY, LOADING, MASTERDOWN, TRYAGAIN, CLUSTERDOWN, NOREPLICAS,
        BUSY), pausing 50 ms doubling to 250 ms, for up to a lease: by then the server has
        ended the hold itself."""
        if self.keys.multi:
            args = self.keys.release(self.owner)
        else:
            args = release_token(self.key, self.owner, self.token)
        started = time.monotonic()
        pause = FAILOVER_PAUSE
        while True:
            try:
                await self.route.query(args)
                return
            except LockServerError as e:
                if not is_not_yet(str(e)):
                    return
            except LockConnectionError:
                pass
            except LockError:
                return
            if time.monotonic() - started + pause >= self.lease:
                log.debug("releasing abandoned hold %r got no answer", self.keys.keys)
                return
            await sleep(pause)
            pause = min(pause * 2, FAILOVER_PAUSE_MAX)

    def refused(self) -> None:
        """The server says the owner no longer holds it (a re-acquire answered another token
        or nil, a proclamation answered 0)."""
        self._event(life.Replaced())

    def connection_lost(self) -> None:
        """The connection this EPHEMERAL hold is bound to failed or closed. The server ends the
        hold when it sees the close, which may be a moment after this side saw it (a close of
        this side's, on a timeout, reaches the server later; a failed command may have left the
        connection alive). The machine refuses a guard being confirmed at once (it was never
        handed out); a held one is reported lost once a read on the client's connections finds
        the hold gone (the check it asks for: ``_confirm_closed``)."""
        self._event(life.ConnectionLost())

    def _start_check(self, check: life.Check) -> None:
        """Runs a check the machine asked for, in the background."""
        if check.until_gone:
            spawn(f"redis-lock-closed:{self.token}", self._confirm_closed)
        elif check.named:
            spawn_short("redis-lock-check", self._check_named, check)
        else:
            spawn("redis-lock-check", self._check, check)

    async def _confirm_closed(self) -> None:
        """Reads the hold (each key) a few milliseconds apart, then up to every 100 ms, until it
        is gone: then the machine hears it (and reports it lost: ``CONNECTION_CLOSED``). Bounded
        by the lease: the watchdog's deadline reports it at the latest."""
        started = time.monotonic()
        pause = CLOSE_RECHECK_FIRST
        own = self.own
        while self.active and time.monotonic() - started < self.lease:
            # After a failover the new master has the hold bound to nothing until its lease
            # ends, and nobody can renew it there as an EPHEMERAL hold: the binding it was
            # taken for is gone, which is reported at once.
            sent = time.monotonic()
            if await self._gone():
                read = CheckRead(LostReason.CONNECTION_CLOSED)
                self._event(Answered(read, sent, time.monotonic(), Answer.GONE))
                return
            # The new master's hold is released there (by its token): nobody waits it out.
            if own is not None and await self.route.replaced(own):
                self._event(life.MasterReplaced())
                return
            await sleep(pause)
            pause = min(pause * 2, CLOSE_RECHECK_MAX)

    async def _gone(self) -> bool:
        """Whether a read (``LOCK.INFO`` of each key, on the client's connections) finds this
        hold gone from some key; no answer is not gone."""
        for k, token in zip(self.keys.keys, self.tokens):
            try:
                reply = await self.route.query(info(k))
            except LockServerError as e:
                if is_final(str(e)):
                    return True
                return False
            except LockError:
                return False
            if holder_ttl(reply, self.owner, token) is None:
                return True
        return False

    async def closed_outcome(self) -> bool:
        """A call found this EPHEMERAL hold's connection closed and sent nothing: the server
        ends the hold as soon as it reads the close, which a read on the client's connections
        confirms (``connection_lost``). Whether the hold was reported lost within the command
        timeout (False: the server still holds it, or no read answered)."""
        own = self.own
        self.connection_lost()
        timeout = own.timeout if own is not None else 0.0
        await wait_event(self.lost_event, timeout)
        return not self.active

    def reentered(self, sent_at: float) -> None:
        self._event(life.Reentered(sent_at))

    def past_deadline(self) -> bool:
        """Whether the hold is no longer active, or its local deadline passed: then it is
        reported lost now, with the reason the watchdog would give (``UNREACHABLE``,
        ``UNREPLICATED``; a fixed lease ``LEASE_ENDED``), and released in the background (the
        server may still have it), before this returns. What every read of the guard's loss
        (``lost``, ``lost_reason``) and every fenced call looks at first, so that none is stale
        after a pause. A loss being reported meanwhile (by another thread) is reported before
        this returns."""
        now = time.monotonic()
        with self._reporting:
            self._event(life.Tick(now))
            return not self.active

    # -- I/O ---------------------------------------------------------------------------------

    async def send(
        self, args: list[Any], then: Optional[list[Any]] = None, then_timeout: float = 0.0
    ) -> Any:
        """One command about the hold: on its own connection (EPHEMERAL), else through the
        route. An EPHEMERAL hold whose keys' slot moved to another node (MOVED or ASK on its
        own connection, also after ASKING) is no longer bound to a connection (the server binds
        a hold on its connection's node only, and a migrated hold arrives unbound): from then
        on it is an ordinary hold, reached through the route, and its own connection is
        closed. One taken on a node importing the slot (an acquire that followed ASK) is sent
        there after ASKING until the slot is that node's. ``then``: a second command on the
        same connection, after the first (``WAIT``); the answer is then the pair."""
        own = self.own
        if own is not None:
            try:
                return await own.call(args, own.timeout, then=then, then_timeout=then_timeout)
            except Redirected:
                pass
            try:  # the slot is moving: this connection's node may be the one importing it
                return await own.call(
                    args, own.timeout, asking=True, then=then, then_timeout=then_timeout
                )
            except Redirected:
                if self.own is own:
                    self.own = None
                    self._event(life.Unbound())  # a plain lease from here
                await own.close()
        return await self.route.query(args, then, then_timeout)

    async def send_release(self) -> tuple[Any, bool]:
        """``LOCK.RELEASE`` (``LOCK.MRELEASE`` for several keys): its reply, and whether it
        went on the shared connections because this EPHEMERAL hold's own connection had
        closed (the server ends a hold bound to it once it reads the close: asked there, its
        answer says whether it still had it; nothing was sent on the closed one). Sent again
        after ``TRYAGAIN`` (a slot move caught between the keys of a multi-key hold: nothing
        ran), after growing pauses, up to five times, as an acquire is; never after a
        connection error (it may have run)."""
        args = self.keys.release(self.owner)
        own = self.own
        closed = own is not None and own.broken
        later = 0
        while True:
            try:
                if closed:
                    return await self.route.query(args), True
                return await self.send(args), False
            except OwnClosed:
                # Closed since it was looked at above (a kill, a close seen by the watchdog
                # meanwhile): nothing was sent on it, so it is asked on the shared connections.
                closed = True
                continue
            except LockServerError as e:
                if not is_retry_later(str(e)) or later >= len(TRYAGAIN_PAUSES):
                    raise
            await sleep(TRYAGAIN_PAUSES[later])
            later += 1

    async def fenced(self, key: bytes, token: int, command: tuple[Arg, ...]) -> Any:
        """``LOCK.GUARD key owner token command...``: the command's reply, when the server still
        holds this owner with this token on ``key``. A ``FENCED`` refusal reports the hold lost
        (through the machine: ``lost``, ``on_lost``) and raises ``Fenced``; a hold already
        lost or released raises ``NotHeld`` without sending anything. An EPHEMERAL hold whose
        connection is closed sends nothing: once a read finds the hold gone (the server ends it
        with its connection) it raises ``NotHeld`` with the loss's reason; ``LockConnectionError``
        if the server still holds it after the command timeout. Never sent again after a
        connection error (the command may have run); sent again after MOVED or ASK (followed by
        the route) and TRYAGAIN (a slot migration caught between the lock key and a data key,
        after growing pauses, up to five times), which ran nothing. Any other error is the
        command's own, raised as ``LockServerError``: no loss."""
        args = guard(key, self.owner, token, command)
        later = 0
        while True:
            # Time passing may have ended it (no renewal confirmed for a lease).
            if self.past_deadline():
                raise self.not_held()
            try:
                return await self.send(args)
            except LockServerError as e:
                line = str(e)
                refusal = fence_refusal(line)
                if refusal is not None:
                    self._event(life.Fenced(refusal))
                    raise Fenced(refusal, line) from None
                if not is_retry_later(line) or later >= len(TRYAGAIN_PAUSES):
                    raise
                await sleep(TRYAGAIN_PAUSES[later])
                later += 1
            except OwnClosed:
                if await self.closed_outcome():
                    raise self.not_held() from None
                raise
            except LockConnectionError:
                if self.own is not None:
                    self.connection_lost()  # the server ends the hold with its connection
                raise

    async def _renew(self) -> _Renewal:
        """One renewal; with ``replication``, followed on the same connection by WAIT (or
        WAITAOF), which waits for this connection's writes, the renewal included: it counts
        only when enough replicas acknowledged it."""
        rep = self.replication
        args = self.keys.renew(self.owner, self.lease)
        try:
            if rep.on:
                reply, self.acknowledged = await self.send(args, rep.command(), rep.timeout)
            else:
                reply = await self.send(args)
        except NoPermission as e:
            return self._denied(e)
        except LockServerError as e:
            return _Renewal.GONE if is_final(str(e)) else _Renewal.NO_ANSWER
        except LockConnectionError:
            return _Renewal.CLOSED if self.own is not None else _Renewal.NO_ANSWER
        renewed = self.keys.renewed(reply)
        if renewed is None:
            return _Renewal.NO_ANSWER
        if not renewed:
            return _Renewal.GONE
        # LOCK.RENEW names no token: it renews whatever hold the owner has on the key. A server
        # other than the one that granted (through Sentinel, a paused "zombie" master's grant
        # confirmed on the real master, where the owner held an older token) would answer 1
        # for a hold it does not have: the token is checked too.
        for key, token in zip(self.keys.keys, self.tokens):
            try:
                held = await self.send(check(key, self.owner, token))
            except NoPermission as e:
                # Renewed, but its token never confirmed: the hold cannot be kept, and the
                # refusal is said at once.
                return self._denied(e)
            except LockServerError as e:
                return _Renewal.GONE if is_final(str(e)) else _Renewal.NO_ANSWER
            except LockConnectionError:
                return _Renewal.CLOSED if self.own is not None else _Renewal.NO_ANSWER
            if held != 1:
                return _Renewal.GONE
        if rep.on:
            ack = self.acknowledged
            try:
                if isinstance(ack, LockError) or rep.acknowledged(ack) is None:
                    return _Renewal.UNACKED
            except UnexpectedReply:
                return _Renewal.UNACKED
        return _Renewal.HELD

    async def _read_ttl(self) -> tuple[_Renewal, Optional[float]]:
        """Each key's hold read with LOCK.INFO: HELD and the shortest ttl in seconds (``inf``:
        no lease), or GONE, or NO_ANSWER."""
        shortest: Optional[float] = None
        for key, token in zip(self.keys.keys, self.tokens):
            try:
                reply = await self.send(info(key))
            except NoPermission as e:
                return self._denied(e), None
            except LockServerError as e:
                return (_Renewal.GONE if is_final(str(e)) else _Renewal.NO_ANSWER), None
            except LockConnectionError:
                return (_Renewal.CLOSED if self.own is not None else _Renewal.NO_ANSWER), None
            ttl = holder_ttl(reply, self.owner, token)
            if ttl is None:
                return _Renewal.GONE, None
            seconds = float("inf") if ttl < 0 else ttl / 1000
            shortest = seconds if shortest is None else min(shortest, seconds)
        return _Renewal.HELD, shortest

    async def confirm(self) -> Optional[Unconfirmed]:
        """Before the guard is handed out: sends the confirmations the machine asks for (a
        grant after a long wait, or replicated), until it hands the guard out (None) or refuses
        it: ``GONE`` when the server no longer has it (or an EPHEMERAL hold's connection gave
        no answer: it is given up, ``reason`` ``CONNECTION_CLOSED``), ``UNACKED`` when (with
        ``replication``) too few replicas acknowledged it (nothing is reported: nobody was told
        of it). Raises ``LockConnectionError`` when no confirmation was answered,
        ``NoPermission`` when the ACL refused one (the server may have the hold: the caller
        releases it)."""
        out = self._granted
        while not out.deliver:
            refusal = out.refuse
            if refusal is Refusal.GONE:
                return Unconfirmed.GONE
            if refusal is Refusal.UNACKNOWLEDGED:
                return Unconfirmed.UNACKED
            if refusal is Refusal.DENIED:
                raise self.denial or NoPermission("the confirmation of the grant was refused")
            if refusal is Refusal.UNANSWERED:
                raise LockConnectionError("the grant could not be confirmed: no answer")
            sent = time.monotonic()
            if out.renew:
                found, read, left = await self._renew(), Read.RENEWAL, None
            elif out.read_lease:
                (found, left), read = await self._read_ttl(), Read.LEASE_LEFT
            else:
                raise UnexpectedReply("the grant was neither handed out nor confirmed")
            if found is _Renewal.CLOSED:
                out = self._event(life.ConnectionLost())
                if out.refuse is not None:
                    continue
            out = self._event(self._answer(read, found, sent, left))
        return None

    @staticmethod
    def _answer(read: Read, found: _Renewal, sent: float, left: Optional[float] = None) -> Answered:
        """A renewal's (or a read of the lease's) answer, as the machine hears it."""
        answer: Holds | Answer
        if found is _Renewal.HELD:
            answer = Holds(left)
        elif found is _Renewal.GONE:
            answer = Answer.GONE
        elif found is _Renewal.UNACKED:
            answer = Answer.UNACKNOWLEDGED
        elif found is _Renewal.REFUSED:
            answer = Answer.REFUSED
        else:
            answer = Answer.NOTHING
        return Answered(read, sent, time.monotonic(), answer)

    async def start(self) -> None:
        """Starts the watchdog and listens to the hold's lost-hold channels."""
        self._watch = self._watchdog.watch(f"redis-lock-watchdog:{self.token}", self)
        await self.route.watch(self)

    def _stop_watching(self) -> None:
        """Nothing renews from now on (released, or lost); the watchdog is told at once, so that
        a lost EPHEMERAL hold's connection closes now (``unwatched``)."""
        self._stopped = True
        watch = self._watch
        if watch is not None:
            watch.wake()

    # -- the watchdog: what it does at each look (``_backend.Watchdog``) ---------------------

    def look(self, now: float, renewing: bool) -> Look:
        """The watchdog's look at ``now``, which never waits (the threaded watchdog looks at
        every hold of a client on one thread): an EPHEMERAL hold's connection found closed is
        confirmed (``connection_lost``); a deadline passed is reported lost (the machine's
        ``tick``); a renewal the machine says is due (every lease / 3, sooner again after no
        answer) is asked for, unless one is under way (``renewing``). Then when to look again:
        the machine's next wake (while a renewal is under way, the deadline: its answer sets
        the next renewal), an EPHEMERAL hold's at most ``OWN_LOOK`` later; never (``OVER``)
        once the hold is stopped: lost, released, being released."""
        if self._stopped:
            return OVER
        own = self.own
        # (``self.own is own``: not one given up after a move meanwhile.)
        if own is not None and not own.alive() and self.own is own:
            self.connection_lost()  # reported once the server no longer holds it
        out = self._event(life.Tick(now), looking=True)
        wake = out.wake
        if out.lost is not None or wake is None:
            return OVER
        with self._lock:
            # The machine asks once (one renewal at a time); a renewal the watchdog still runs
            # has answered already: this one starts after it.
            renew = self._renew_asked and not renewing
            if renew:
                self._renew_asked = False
        if self.own is not None:
            wake = min(wake, now + OWN_LOOK)
        return Look(renew=renew, again=wake)

    def where(self) -> Optional[str]:
        """Where its renewals go (``Route.where``): the threaded watchdog queues the renewals
        of each node apart, so that a node that does not answer delays only its own holds'."""
        return self.route.where()

    async def renew_once(self) -> None:
        """The renewal a look asked for, and what its answer tells the machine (a renewal
        answered 0 reports the loss; no answer has it sent again soon). A release waits for it
        (``_renewing``), and none is sent once the hold is stopped."""
        async with self._renewing:
            if self._stopped:
                return
            sent = time.monotonic()
            try:
                found = await self._renew()
            except BaseException:
                # Said to the machine as no answer, so that it asks for the next one.
                self._event(self._answer(Read.RENEWAL, _Renewal.NO_ANSWER, sent))
                raise
        if found is _Renewal.CLOSED:
            self.connection_lost()  # reported once the server no longer holds it
        # Gone (one key is enough: all or nothing), refused by the ACL (said at once, released
        # in the background), no answer (again soon): the machine decides.
        self._event(self._answer(Read.RENEWAL, found, sent))

    async def unwatched(self) -> None:
        """The watchdog stopped watching (after the renewal under way, if one was): a lost
        EPHEMERAL hold's connection is closed (the server ends whatever it still binds to it);
        a released one's is closed by the release."""
        if self.own is not None and self.reason is not None:
            await self.own.close()

    # -- the lost-hold signal ------------------------------------------------------------------

    def signal(self, message: LostMessage) -> None:
        """A message of the signal listener: a hint, never evidence (anyone allowed to publish
        on the channel can send one). The machine asks for a check when it names this hold
        exactly (one ``LOCK.CHECK`` of the key it names: ``_check_named``), or concerns this
        hold's database and a key of it (a whole-key, flush or move message: one read per key,
        ``_check``). Only a read that finds the hold gone reports it lost."""
        self._event(life.Signal(message))

    async def _check_named(self, asked: life.Check) -> None:
        """``LOCK.CHECK key owner token`` of the key a message named (one round trip, O(1)): the
        hold is reported lost, with the message's reason, only when the server answers 0. No
        answer changes nothing: the watchdog's rules stand."""
        key = asked.key if asked.key is not None else self.key
        token = self._machine.tokens.get(key, self.token)
        sent = time.monotonic()
        answer: Holds | Answer
        try:
            held = await self.route.query(check(key, self.owner, token))
        except NoPermission as e:
            self._denied(e)
            answer = Answer.REFUSED
        except LockServerError as e:
            answer = Answer.GONE if is_final(str(e)) else Answer.NOTHING
        except LockError:
            answer = Answer.NOTHING
        else:
            answer = Answer.GONE if held == 0 else Holds()
        self._event(Answered(CheckRead(asked.reason), sent, time.monotonic(), answer))

    async def _check(self, asked: life.Check) -> None:
        """``LOCK.INFO`` of each key concerned (a read that changes nothing, following MOVED and
        ASK): the hold is reported lost (the check's reason) only when the server no longer
        shows this owner with this token; shown, the lease it has left is evidence too. No
        answer leaves it to the watchdog. After a move, the hold found alive is listened to
        where its keys are now."""
        sent = time.monotonic()
        answer: Holds | Answer = Holds()
        shortest: Optional[float] = None
        for k, token in zip(self.keys.keys, self.tokens):
            if asked.key is not None and k != asked.key:
                continue
            try:
                reply = await self.route.query(info(k))
            except NoPermission as e:
                self._denied(e)
                answer = Answer.REFUSED
                break
            except LockServerError as e:
                answer = Answer.GONE if is_final(str(e)) else Answer.NOTHING
                break
            except LockError:
                answer = Answer.NOTHING
                break
            ttl = holder_ttl(reply, self.owner, token)
            if ttl is None:
                answer = Answer.GONE
                break
            seconds = float("inf") if ttl < 0 else ttl / 1000
            shortest = seconds if shortest is None else min(shortest, seconds)
        if isinstance(answer, Holds):
            answer = Holds(shortest)
            if asked.moved:
                # An EPHEMERAL hold's key moved: bound to nothing on the new node, it lives on
                # (its own connection is given up at its next command there, ``send``).
                self._event(life.Unbound())
        self._event(Answered(CheckRead(asked.reason), sent, time.monotonic(), answer))
        if asked.moved and isinstance(answer, Holds) and self.active:
            await self.route.relocate(self)

    # -- release -----------------------------------------------------------------------------

    def request_release(self) -> Optional[NotHeld | NoPermission]:
        """The owner releases: None, or the error to raise (lost, or released before). Either
        way nothing renews from now on."""
        with self._reporting:
            with self._lock:
                held = self._machine.phase in (Phase.CONFIRMING, Phase.HELD)
            self._event(life.ReleaseRequested())
        self._stop_watching()
        return None if held else self.not_held()

    async def quiesce(self) -> None:
        """After ``request_release``: waits out a renewal in flight, stops listening."""
        self._stop_watching()
        async with self._renewing:
            pass
        self.route.unwatch(self)

    def release_replied(self) -> None:
        self._event(life.ReleaseReplied())

    async def close_own(self) -> None:
        if self.own is not None:
            await self.own.close()

    def after_fork(self) -> None:
        """In a forked child: the hold is the parent's. Lost without a callback (FORKED);
        nothing renews it (the watchdog does not exist here), nothing releases it."""
        self._lock = threading.Lock()
        self._reporting = threading.RLock()
        self._renewing = Mutex()
        self._machine.step(life.Forked())
        self._stopped = True
        self._watch = None  # the parent's watchdog: its threads are not here
        # A new event: a parent thread may have held the old one's internal lock at the fork.
        self.lost_event = Event()
        self.lost_event.set()
        if self.own is not None:
            self.own.after_fork()


def _looker(hold: Hold) -> Callable[[], object]:
    """What the hold's ``lost`` event calls before it answers: ``hold.past_deadline()``, while
    the hold lives (a weak reference: the event does not keep it alive)."""
    ref = weakref.ref(hold)

    def look() -> object:
        alive = ref()
        return None if alive is None else alive.past_deadline()

    return look
