"""Lock handles and their guards: a handle is one owner on one key (or on several keys held
together), with its options; a guard is one acquire of it, released once."""

from __future__ import annotations

import collections
import contextvars
import logging
import os
import threading
import time
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, TypeVar, cast

from .. import _fork
from .._commands import (
    KeySet,
    Replication,
    TicketExpired,
    explained_by_role,
    is_retry_later,
    on_functions,
    refusal,
    says_not_ephemeral,
)
from .._common import (
    DEFAULT_LEASE,
    DEFAULT_REPLICAS_TIMEOUT,
    RETRIES,
    FAILOVER_PAUSE,
    FAILOVER_PAUSE_MAX,
    TRYAGAIN_PAUSES,
    WAIT_MARGIN,
    WAIT_REDIRECTS,
    Arg,
    Backend,
    Key,
    Kind,
    LockConnectionError,
    LockError,
    LockServerError,
    LockTimeout,
    LostCallback,
    LostReason,
    NoPermission,
    NotHeld,
    NotSafelyAcquired,
    Release,
    Renewal,
    UnexpectedReply,
    to_bytes,
)
from .._connect import Redirected
from ._backend import (
    Cancelled,
    Event,
    close_connection,
    new_gate,
    sleep,
    spawn,
    spawn_from_any_thread,
)
from ._connection import OwnConnection, call
from ._hold import Hold, Unconfirmed
from ._tickets import NoTickets, TicketDesk
from ._unlocked import wait_unlocked

if TYPE_CHECKING:
    from ._client import AsyncLockClient, _Node

log = logging.getLogger("redis_lock_client")

_G = TypeVar("_G", bound="_AsyncGuard")

# An acquire whose grant the server no longer had when it was confirmed: the acquire goes on.
_AGAIN: Any = object()


class _AsyncHandle(Generic[_G]):
    """What a handle on one key and a handle on several share: its owner, its options, its
    acquire (waiting, retries, EPHEMERAL), its re-entries, its releases.

    Every command of the handle that takes or ends a hold on the server (an acquire, a release
    that sends LOCK.RELEASE, the release of a guard the garbage collector took) goes through
    the handle's gate, one at a time, in order: so an acquire (ONCE) is never answered with
    the token of a hold whose release is still on its way.
    """

    def __init__(
        self,
        client: AsyncLockClient,
        keys: KeySet,
        kind: Kind,
        limit: int,
        *,
        lease: float = DEFAULT_LEASE,
        renewal: Renewal = Renewal.WATCHDOG,
        wait_timeout: Optional[float] = None,
        ephemeral: bool = False,
        on_lost: Optional[LostCallback] = None,
        owner: Optional[bytes] = None,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        aof: bool = False,
    ) -> None:
        if lease < 0.001:
            raise ValueError("the lease must be at least 1 ms")
        if wait_timeout is not None and wait_timeout < 0:
            raise ValueError("wait_timeout must not be negative")
        if replicas < 0:
            raise ValueError("replicas must not be negative")
        if replicas_timeout <= 0:
            raise ValueError("replicas_timeout must be positive")
        self.client = client
        self.keys = keys
        self.kind = kind
        self.limit = limit
        self.lease = lease
        self.renewal = renewal
        self.wait_timeout = wait_timeout
        self.ephemeral = ephemeral
        self.on_lost = on_lost
        self.replication = Replication(replicas, replicas_timeout, aof)
        self._named = owner
        self.owner = client._owner() if owner is None else owner
        self._gate = new_gate()
        # The active hold and how many guards of it are out (changed under _books).
        self._books = threading.Lock()
        self._active: Optional[Hold] = None
        self._guards = 0
        # Holds whose guard the garbage collector took: counted down under the gate.
        self._abandoned: collections.deque[Hold] = collections.deque()
        # Holds this side stopped believing in while the server may still have them (a loss
        # the server may not know of, a release with no answer): released by their token under
        # the gate, so that the next acquire (ONCE) never gets one back.
        self._unbelieved: collections.deque[Hold] = collections.deque()
        self._stack: contextvars.ContextVar[tuple[_G, ...]] = contextvars.ContextVar(
            "redis_lock_client_guards", default=()
        )
        _fork.register(self)

    #: Whether acquiring again while holding counts one more guard (locks), or returns the one
    #: guard of the hold (an election's leadership, never counted, as LOCK.CAMPAIGN).
    _counts_reentry = True

    def _guard(self, hold: Hold) -> _G:
        raise NotImplementedError

    def after_fork(self) -> None:
        """In a forked child: the handle becomes a new owner holding nothing, so that nothing it
        sends (a re-entry, a release) can touch the parent's holds."""
        self._gate = new_gate()
        self._books = threading.Lock()
        self._active, self._guards = None, 0
        self._abandoned = collections.deque()
        self._unbelieved = collections.deque()
        # A name given by the application stays (it is the application's to keep unique).
        self.owner = self.client._owner() if self._named is None else self._named

    async def try_acquire(self) -> Optional[_G]:
        """Takes the key(s) if free (or re-enters this handle's hold), without waiting; None
        when another owner holds one or others wait for one. ``NotSupported``, before anything
        is sent, for what the server's backend cannot do (the ``redislock`` Functions library:
        shared holds, semaphores, several keys, EPHEMERAL, elections, ``lost_signal=True``)."""
        return await self._acquire(False, self.wait_timeout)

    async def acquire(self) -> _G:
        """Takes the key(s), waiting in the server as long as ``wait_timeout`` allows (with a
        ticket, or on a connection of its own: the client's ``wait_with_tickets``; on the
        ``redislock`` Functions library with a ticket too, or without ``wait_with_tickets``
        listening to the unlock message and asking again);
        raises ``LockTimeout`` when it passes, ``NotSupported`` as ``try_acquire``."""
        guard = await self._acquire(self.wait_timeout != 0, self.wait_timeout)
        if guard is None:
            raise LockTimeout(self.wait_timeout or 0.0)
        return guard

    async def __aenter__(self) -> _G:
        guard = await self.acquire()
        self._stack.set(self._stack.get() + (guard,))
        return guard

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        stack = self._stack.get()
        self._stack.set(stack[:-1])
        await stack[-1].__aexit__(exc_type, exc, tb)

    def _args(
        self,
        waits: bool,
        wait: Optional[float],
        value: Optional[bytes],
        ephemeral: Optional[bool] = None,
    ) -> list[Any]:
        """The acquire command; ``value`` is a campaign's (see ``_Candidate``); ``ephemeral``
        None: the handle's."""
        bound = self.ephemeral if ephemeral is None else ephemeral
        return self.keys.acquire(self.owner, self.lease, self.kind, self.limit, bound, wait, waits)

    def _current(self) -> Optional[Hold]:
        with self._books:
            current = self._active
        return current if current is not None and current.active else None

    async def _acquire(
        self, waits: bool, wait_timeout: Optional[float], value: Optional[bytes] = None
    ) -> Optional[_G]:
        """One acquire (or campaign): ``waits`` False is one attempt; else it waits up to
        ``wait_timeout`` (None: until granted)."""
        async with self._gate:
            await self._drain()
            await self._check_backend(value)
            until = None if wait_timeout is None else time.monotonic() + wait_timeout
            for _ in range(RETRIES + 1):
                current = self._current()
                sent = time.monotonic()
                own: Optional[OwnConnection] = None
                # An EPHEMERAL hold whose slot moved is bound to nothing any more: re-entered
                # as the ordinary hold it now is.
                unbound = self.ephemeral and current is not None and current.own is None
                if self.ephemeral and not unbound:
                    reply, own = await self._send_ephemeral(current, waits, until, value)
                else:
                    reply = await self._send_with_retries(
                        waits, until, value, False if unbound else self.ephemeral
                    )
                replied = time.monotonic()
                new_own = own if current is None or own is not current.own else None
                try:
                    tokens = self.keys.tokens(reply)
                except UnexpectedReply:
                    if new_own is not None:
                        await new_own.close()
                    raise
                got = await self._settle(current, tokens, sent, replied, own, new_own)
                if got is not _AGAIN:
                    return cast(Optional[_G], got)
            return None

    async def _check_backend(self, value: Optional[bytes]) -> None:
        """Raises ``NotSupported`` before anything is sent when the keys' server has the
        ``redislock`` Functions library and this handle asks for what it cannot do (see
        ``_commands.on_functions``), or the client asked for the lost-hold signal by name. A
        server that cannot be asked now is asked by the send (``Connector.query``, which
        refuses the same commands)."""
        try:
            node = await self.client._node_for(self.keys.route)
            if await node.commands.backend() is not Backend.FUNCTIONS:
                return
        except LockConnectionError:
            return  # found by the send, which is sent again after no answer

        on_functions(self._args(False, None, value))
        if self.client._lost_signal_asked:
            raise refusal("the lost-hold signal (lost_signal=True)")

    def _wait_left(self, waits: bool, until: Optional[float]) -> tuple[bool, Optional[float]]:
        """Whether the next send waits, and how long (None: as long as it takes)."""
        if not waits or until is None:
            return waits, None
        left = until - time.monotonic()
        return (left >= 0.001), left  # no wait left: one last attempt

    async def _send_with_retries(
        self, waits: bool, until: Optional[float], value: Optional[bytes], ephemeral: bool
    ) -> Any:
        """An acquire on a pooled connection, or a wait (with a ticket, or on a connection of
        its own): sent again after a
        broken connection (ONCE makes that safe) and after MOVED (with the slot map loaded
        again), up to twice in a row; an ASK is followed, to the node named, after ASKING; a
        TRYAGAIN (a slot move caught between keys) is sent again after growing pauses, up to
        five times. A wait the server redirected after waiting (its key migrated) starts the
        count again. Under Sentinel (``failover_timeout``) a broken connection is sent again,
        with growing pauses, until a master answers or ``failover_timeout`` passed: a wait
        whose master died is issued again on the new master, for what is left of its
        ``wait_timeout``. ``ephemeral``: the hold is one that was EPHEMERAL and is bound to
        nothing any more (its slot moved): re-entered without EPHEMERAL."""
        attempt = later = 0
        ask: Optional[Redirected] = None  # an ASK the next send follows (``client._redirect``)
        failover: Optional[float] = None  # under Sentinel: re-sent until then
        pause = FAILOVER_PAUSE
        while True:
            this_waits, wait = self._wait_left(waits, until)
            sent = time.monotonic()
            asking = False  # this send follows an ASK, after ASKING
            try:
                if this_waits:
                    node, asking = await self.client._node_to(self.keys.route, ask)
                    functions = await node.commands.backend() is Backend.FUNCTIONS
                    if functions and _desk(node) is None:
                        # No ticket (wait_with_tickets=False): the unlock message and the
                        # holder's lease have the acquire asked again.
                        once = self._args(False, None, value, ephemeral)
                        route = self.keys.route
                        return await wait_unlocked(node.commands, once, route, self.owner, until)
                    args = self._args(True, wait, value, ephemeral)
                    return await self._send_waiting(args, wait, node, asking)
                args = self._args(False, None, value, ephemeral)
                if ask is not None:  # one send, whose redirect is followed here
                    node, asking = await self.client._node_to(self.keys.route, ask)
                    return await node.commands.query(args, asking=asking)
                return await self.client._query(self.keys.route, args)
            except TicketExpired:
                # A grant that expired before it was popped: not granted; asked again while
                # the wait lasts.
                ask = None
                if until is not None and time.monotonic() >= until:
                    return None
            except LockConnectionError:
                ask = None
                if attempt < RETRIES:
                    attempt += 1
                    continue
                now = time.monotonic()
                if failover is None:
                    failover = now + self.client.failover_timeout
                if now >= failover:
                    raise
                await sleep(pause)  # a failover: the Sentinels name the new master soon
                pause = min(pause * 2, FAILOVER_PAUSE_MAX)
            except Redirected as e:
                if time.monotonic() - sent > self.client.command_timeout:
                    attempt = 0  # it waited, then its key moved: no failed send
                if attempt >= (WAIT_REDIRECTS if this_waits else RETRIES):
                    raise
                attempt += 1
                ask = await self.client._redirect(e, asked=asking)
            except LockServerError as e:
                if not is_retry_later(str(e)) or later >= len(TRYAGAIN_PAUSES):
                    raise
                ask = None
                await sleep(TRYAGAIN_PAUSES[later])
                later += 1

    async def _send_waiting(
        self, args: list[Any], wait: Optional[float], node: _Node, asking: bool
    ) -> Any:
        """A wait on ``node`` (``asking``: the node an ASK named, preceded by ASKING): with a
        ticket (the client's ``wait_with_tickets``), else on a connection of its own (named for
        the owner), closed after. Under Sentinel the connection is closed as soon as the
        Sentinels name another master (the wait is then sent again, to it)."""
        tickets = _desk(node)
        if tickets is not None:
            release = self.keys.release(self.owner)
            held = self._current() is not None
            try:
                return await tickets.wait(
                    args,
                    wait,
                    self.keys.multi,
                    release,
                    asking=asking,
                    held=held,
                    route=self.keys.route,
                )
            except NoTickets:
                pass
        connector = node.commands
        conn = await connector.new(self.owner)
        done = Event()
        if connector.sentinel:  # a wait on a master the Sentinels replaced ends at once
            spawn("redis-lock-follow", connector.follow, conn, done)
        try:
            if asking:
                await call(conn, ["ASKING"], self.client.command_timeout)
            return await call(conn, args, None if wait is None else wait + WAIT_MARGIN)
        finally:
            done.set()
            await close_connection(conn)

    async def _send_ephemeral(
        self,
        current: Optional[Hold],
        waits: bool,
        until: Optional[float],
        value: Optional[bytes],
    ) -> tuple[Any, Optional[OwnConnection]]:
        """An EPHEMERAL acquire: on the hold's own connection (a re-entry), else on a new one
        that the hold will own (``_send_new_ephemeral``). A re-entry is never sent again after
        its connection broke (it is the hold's)."""
        if current is None or current.own is None:
            return await self._send_new_ephemeral(waits, until, value)
        this_waits, wait = self._wait_left(waits, until)
        timeout: Optional[float] = self.client.command_timeout
        if this_waits:
            timeout = None if wait is None else wait + WAIT_MARGIN
        args = self._args(this_waits, wait, value)
        try:
            return await current.own.call(args, timeout), current.own
        except LockConnectionError:
            current.connection_lost()
            raise

    def _master(self) -> Optional[tuple[str, int]]:
        """Under Sentinel: the master the Sentinels named last; None elsewhere."""
        single = self.client._single
        return None if single is None else single.commands.master_address()

    async def _send_new_ephemeral(
        self, waits: bool, until: Optional[float], value: Optional[bytes]
    ) -> tuple[Any, Optional[OwnConnection]]:
        """A new EPHEMERAL hold (not a re-entry), asked on a new connection
        (``_ask_ephemeral``). Under Sentinel (``failover_timeout``), an acquire a failover
        ended (the master it asked was replaced, or cannot be reached) is asked again on the
        master the Sentinels name, as a plain one is, with growing pauses, for what is left of
        its wait, until ``failover_timeout`` passed (counted from the first failure after the
        last change of master). A grant the old master made in it and replicated before it died
        is bound to nothing on the new master, which answers the owner's EPHEMERAL ask with
        ``ERR the owner's hold is not EPHEMERAL``: that hold is this handle's (its owner is
        the handle's, and the handle holds nothing), so it is released there and the acquire
        asked again, once."""
        failover: Optional[float] = None  # under Sentinel: asked again until then
        pause = FAILOVER_PAUSE
        released = False
        while True:
            master = self._master()
            try:
                return await self._ask_ephemeral(waits, until, value)
            except LockConnectionError:
                if self.client.failover_timeout <= 0:
                    raise
                now = time.monotonic()
                if failover is None or self._master() != master:
                    # The first failure, or one on a master replaced meanwhile: a failover.
                    failover, pause = now + self.client.failover_timeout, FAILOVER_PAUSE
                if now + pause >= failover:
                    raise
                await sleep(pause)
                pause = min(pause * 2, FAILOVER_PAUSE_MAX)
            except LockServerError as e:
                if failover is None or released or not says_not_ephemeral(str(e)):
                    raise
                released = True
                await self.client._query(self.keys.route, self.keys.release(self.owner))

    async def _ask_ephemeral(
        self, waits: bool, until: Optional[float], value: Optional[bytes]
    ) -> tuple[Any, Optional[OwnConnection]]:
        """A new EPHEMERAL hold asked on a new connection, which the hold will own; after
        MOVED, TRYAGAIN or an ASK (to the node named, after ASKING), on another new one."""
        this_waits, wait = self._wait_left(waits, until)
        timeout: Optional[float] = self.client.command_timeout
        if this_waits:
            timeout = None if wait is None else wait + WAIT_MARGIN
        args = self._args(this_waits, wait, value)
        attempt = later = 0
        ask: Optional[Redirected] = None  # an ASK the next ask follows (``client._redirect``)
        while True:
            node, asking = await self.client._node_to(self.keys.route, ask)
            connector = node.commands
            own = OwnConnection(await connector.new(self.owner), self.client.command_timeout)
            sent = time.monotonic()
            done = Event()
            if connector.sentinel and this_waits:  # a replaced master: the wait ends at once
                spawn("redis-lock-follow", connector.follow, own.conn, done)
            try:
                desk = _desk(node) if this_waits else None
                if desk is not None:
                    try:
                        release = self.keys.release(self.owner)
                        multi = self.keys.multi
                        return await desk.wait_own(own, args, wait, multi, release, asking), own
                    except NoTickets:
                        pass
                if asking:
                    await own.call(["ASKING"], self.client.command_timeout)
                return await own.call(args, timeout), own
            except TicketExpired:
                # Not granted (the grant lapsed before it was popped): asked again, on a new
                # connection, while the wait lasts.
                await own.close()
                ask = None
                this_waits, wait = self._wait_left(waits, until)
                if not this_waits:
                    return None, None
                args = self._args(this_waits, wait, value)
            except Redirected as e:
                await own.close()
                if time.monotonic() - sent > self.client.command_timeout:
                    attempt = 0  # it waited, then its key moved: no failed send
                if attempt >= (WAIT_REDIRECTS if this_waits else RETRIES):
                    raise
                attempt += 1
                ask = await self.client._redirect(e, asked=asking)
                this_waits, wait = self._wait_left(waits, until)
                args = self._args(this_waits, wait, value)
            except LockServerError as e:
                await own.close()
                if not is_retry_later(str(e)) or later >= len(TRYAGAIN_PAUSES):
                    raise
                ask = None
                await sleep(TRYAGAIN_PAUSES[later])
                later += 1
            except (LockError, Cancelled):
                await own.close()
                raise
            finally:
                done.set()

    async def _settle(
        self,
        current: Optional[Hold],
        tokens: Optional[tuple[int, ...]],
        sent: float,
        replied: float,
        own: Optional[OwnConnection],
        new_own: Optional[OwnConnection],
    ) -> Any:
        """What the acquire's reply makes of the handle's hold: the guard, None, or _AGAIN."""
        if tokens is not None and current is not None and current.tokens == tokens:
            with self._books:
                reentry = self._active is current
                if reentry and self._counts_reentry:
                    self._guards += 1
            if reentry:
                current.reentered(sent)
                return self._guard(current)
        if current is not None:
            if own is not None and own is current.own:
                current.own = None  # the new hold owns the connection now
            # The server answered other tokens, or nil: the handle's hold is not there.
            current.refused()
        with self._books:
            self._active, self._guards = None, 0
        if tokens is None:
            if new_own is not None:
                await new_own.close()
            return None
        hold = Hold(
            route=self.client._route(self.keys.route),
            watchdog=self.client._watchdog,
            keys=self.keys,
            owner=self.owner,
            tokens=tokens,
            db=self.client._db(),
            lease=self.lease,
            renewal=self.renewal,
            own=own,
            sent_at=sent,
            replied_at=replied,
            on_lost=self.on_lost,
            replication=self.replication,
            abandoned=_counted_by(self),
        )
        try:
            unconfirmed = await hold.confirm()
        except Cancelled:  # a grant nobody will hold: released
            await _release_rest(hold)
            raise
        except NoPermission:
            # The ACL refused the confirmation: the server may still have it (the machine's
            # ``release``). Released by its token in the background, again until a master
            # answers; the next acquire waits for it.
            await hold.close_own()
            self._release_unbelieved(hold)
            raise
        except LockConnectionError:
            # No answer: the machine asked for its release in the background (``abandon``,
            # counted by this handle: the next acquire waits for it).
            await hold.close_own()
            raise
        except LockError:
            await hold.close_own()
            raise
        if unconfirmed is Unconfirmed.GONE:
            # An EPHEMERAL grant whose connection failed before its confirmation answered: the
            # master ends it with the connection, but a replica it reached has it bound to
            # nothing (the machine's ``abandon`` queued its release): released before it is
            # asked again (the gate is held here).
            await hold.close_own()
            await self._drain()
            return _AGAIN
        if unconfirmed is Unconfirmed.UNACKED:
            await self._unsafe(hold)
        with self._books:
            self._active, self._guards = hold, 1
        try:
            await hold.start()
        except Cancelled:  # cancelled before the guard was handed out: released
            try:
                await self._end(hold)
            except LockError:
                log.debug("releasing a cancelled grant of %r failed", hold.keys.keys)
            raise
        except NoPermission:
            # The ACL refused a lost-hold channel (the error names it): the grant is released
            # before the refusal is raised, as one the replicas did not acknowledge.
            try:
                await self._end(hold)
            except LockError:
                log.debug("releasing a grant of %r whose channel was refused failed",
                          hold.keys.keys)
            raise
        return self._guard(hold)

    async def _unsafe(self, hold: Hold) -> None:
        """A grant too few replicas acknowledged: released by its token before the refusal
        (the gate is held: the next acquire comes after), sent again until a master answers,
        for up to a lease; then ``NotSafelyAcquired`` (or the server's error for WAIT/WAITAOF,
        e.g. WAITAOF on a server without it or without appendonly) is raised."""
        ack = hold.acknowledged
        try:
            await hold.release_abandoned()
        finally:
            await hold.close_own()
        if isinstance(ack, LockError):
            raise ack
        rep = self.replication
        why = rep.shortfall(ack)
        try:  # too few replicas connected is said first (read once, here)
            why = explained_by_role(why, rep.replicas, await hold.send(["ROLE"]))
        except LockError:
            pass
        raise NotSafelyAcquired(hold.tokens, rep.count(ack), rep.replicas, why)

    # -- ends of guards ----------------------------------------------------------------------

    async def _release(self, hold: Hold) -> Release:
        """A guard of ``hold`` is released by the application."""
        with self._books:
            if self._active is not hold:
                raise hold.not_held()
            if self._guards > 1 or (hold.reason is not None and not hold.keys.multi):
                # Not the last guard, or a lost hold of one key (nothing to send): no gate.
                self._guards -= 1
                if self._guards == 0:
                    self._active = None
                if hold.reason is not None:
                    raise hold.not_held()
                return Release.STILL_HELD
        async with self._gate:
            await self._drain()
            return await self._end(hold)

    async def _end(self, hold: Hold) -> Release:
        """One guard of ``hold`` ends (the gate is held). The last one stops the watchdog,
        waits out a renewal in flight and sends LOCK.RELEASE (LOCK.MRELEASE for several keys;
        sent again only after TRYAGAIN, which ran nothing); earlier ones only count down."""
        with self._books:
            if self._active is not hold:
                raise hold.not_held()
            self._guards -= 1
            if self._guards > 0:
                if hold.reason is not None:
                    raise hold.not_held()
                return Release.STILL_HELD
            self._active = None
        error = hold.request_release()
        await hold.quiesce()
        if error is not None:
            if hold.keys.multi:
                await _release_rest(hold)
            else:
                await hold.close_own()
            raise error
        try:
            reply, closed = await hold.send_release()
        except LockConnectionError:
            # No answer (a failover may have come between): the server may still hold it.
            # Sent again by its token in the background, wherever the master is now; the
            # handle's next acquire waits for it, and never gets this hold back.
            self._release_unbelieved(hold)
            raise
        finally:
            hold.release_replied()
            await hold.close_own()
        if not hold.keys.released(reply):
            # Its connection closed: the server ended the hold with it.
            raise NotHeld(LostReason.CONNECTION_CLOSED if closed else None)
        return Release.RELEASED

    def _abandoned_guard(self, hold: Hold) -> None:
        """The garbage collector took a guard of ``hold`` unreleased (from any thread, at any
        allocation: nothing here waits). Its end is queued; the handle's next acquire or
        release, or a background task, carries it out under the gate, in order."""
        self._abandoned.append(hold)
        spawn_from_any_thread(hold.loop, "redis-lock-collected", self._drain_gated)

    def _release_unbelieved(self, hold: Hold) -> None:
        """``hold`` is lost to this side while the server may still have it: its release by
        token is queued and carried out under the gate (from any thread: nothing here waits),
        before the handle's next acquire."""
        self._unbelieved.append(hold)
        spawn_from_any_thread(hold.loop, "redis-lock-unbelieved", self._drain_gated)

    async def _drain_gated(self) -> None:
        async with self._gate:
            await self._drain()

    async def _drain(self) -> None:
        """Releases the holds this side stopped believing in, and ends the guards the garbage
        collector took (the gate is held)."""
        while True:
            try:
                lost = self._unbelieved.popleft()
            except IndexError:
                break
            try:
                await lost.release_abandoned()
            except Exception:  # noqa: BLE001 - best effort: the lease ends it
                log.debug("releasing lost hold %r failed", lost.keys.keys, exc_info=True)
        while True:
            try:
                hold = self._abandoned.popleft()
            except IndexError:
                return
            try:
                await self._end(hold)
            except Exception:  # noqa: BLE001 - best effort: the lease ends it
                log.debug("releasing a collected guard of %r failed", hold.keys.keys, exc_info=True)


def _desk(node: _Node) -> Optional[TicketDesk]:
    """``node``'s ticket desk, when the client waits with tickets and the server has them."""
    tickets = node.tickets
    return tickets if tickets is not None and not tickets.unsupported else None


async def _release_rest(hold: Hold) -> None:
    """A lost multi-key hold: LOCK.MRELEASE for the keys the owner may still hold (it ends the
    owner's holds only, nobody else's). Best effort: a failure leaves them to their lease."""
    try:
        await hold.send_release()
    except LockError:
        log.debug("releasing the rest of lost hold %r failed", hold.keys.keys, exc_info=True)
    finally:
        await hold.close_own()


def _counted_by(handle: _AsyncHandle[Any]) -> Callable[[Hold], None]:
    """What a hold calls to be released in the background: counted by ``handle`` while it
    lives (its next acquire waits for the release), else sent uncounted."""
    ref = weakref.ref(handle)

    def release(hold: Hold) -> None:
        alive = ref()
        if alive is not None:
            alive._release_unbelieved(hold)
        else:
            spawn_from_any_thread(hold.loop, "redis-lock-abandoned", hold.release_abandoned)

    return release


def _abandon(handle: _AsyncHandle[Any], hold: Hold, pid: int) -> None:
    """The finalizer of a guard collected unreleased (never in a forked child, whose holds are
    the parent's)."""
    if os.getpid() == pid:
        handle._abandoned_guard(hold)


class _AsyncGuard:
    """What the guard of one key and the guard of several share: ``lost``, the release,
    ``async with``.

    A guard the garbage collector takes unreleased is released in the background, in order
    with the handle's next acquire (which never gets that hold's token back): do not rely on
    it, release with ``async with`` or ``release()``.
    """

    def __init__(self, handle: _AsyncHandle[Any], hold: Hold) -> None:
        self._handle = handle
        self._hold = hold
        self._released = False
        self._finalizer = weakref.finalize(self, _abandon, handle, hold, os.getpid())

    @property
    def owner(self) -> bytes:
        return self._hold.owner

    @property
    def lost(self) -> Event:
        """Set when the hold is lost (never after a release): an ``asyncio.Event`` in the
        asyncio library (``await guard.lost.wait()``), a ``threading.Event`` in the sync one
        (``guard.lost.wait(timeout)``). Never stale: reading it, and the event's ``is_set()``
        and ``wait()`` (also on an event kept from before), look at the hold's local deadline
        first (the send time of the last renewal the server answered, plus the lease, minus a
        tenth of it for clock drift), so a process paused past its lease sees it set, with
        ``lost_reason`` ``UNREACHABLE`` (a fixed lease: ``LEASE_ENDED``), the instant it
        resumes, before the watchdog has run; the hold is then released in the background, as
        the watchdog does."""
        self._hold.past_deadline()
        return self._hold.lost_event

    @property
    def lost_reason(self) -> Optional[LostReason]:
        """Why the hold was lost (None while held or after a release); never stale, as ``lost``."""
        self._hold.past_deadline()
        return self._hold.reason

    async def _fenced(self, key: bytes, token: int, command: tuple[Arg, ...]) -> Any:
        if self._released:
            raise NotHeld(None)
        if self._hold.pid != os.getpid():
            raise NotHeld(LostReason.FORKED)
        return await self._hold.fenced(key, token, command)

    async def release(self) -> Release:
        """Releases this guard. The last guard of a hold stops the watchdog, waits out a renewal
        in flight, and sends LOCK.RELEASE (LOCK.MRELEASE for several keys; sent again only after
        ``TRYAGAIN``, a slot move caught between its keys, which ran nothing: up to five times,
        after growing pauses); earlier ones only count down.

        Raises ``NotHeld`` when the hold was lost (with the reason) or the server no longer
        knew it (on any of its keys; an EPHEMERAL hold whose connection closed is released on
        the shared connections instead, and raises ``NotHeld(CONNECTION_CLOSED)`` when the
        server had already ended it), ``LockConnectionError`` when the release could not be
        sent or answered: it is then sent again in the background by its token (``LOCK.RELEASE
        key owner TOKEN t``, which never releases a later hold), wherever the master is now,
        for up to a lease, and the handle's next acquire waits for it. A multi-key hold lost
        on some of its keys may still hold the others: its last release sends LOCK.MRELEASE
        all the same (frees them at once instead of at their lease end), then raises
        ``NotHeld``.
        """
        if self._released:
            return Release.ALREADY_RELEASED
        self._released = True
        self._finalizer.detach()
        hold = self._hold
        if hold.pid != os.getpid():
            raise NotHeld(LostReason.FORKED)
        return await self._handle._release(hold)

    async def __aenter__(self: _G) -> _G:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Releases. ``NotHeld`` is raised if the hold was lost during the block, unless the
        block itself raised (its exception is not masked)."""
        try:
            await self.release()
        except LockError:
            if exc_type is None:
                raise


class AsyncLock(_AsyncHandle["AsyncLockGuard"]):
    """A handle: one owner on one key, with its options.

    - ``lease`` (seconds, default 30): the hold's lease on the server, renewed every
      ``lease / 3`` (10 s) by the watchdog.
    - ``renewal``: ``Renewal.WATCHDOG`` (default) or ``Renewal.FIXED`` (nothing renews; the hold
      is reported lost, ``LEASE_ENDED``, at its lease end).
    - ``wait_timeout`` (seconds, default None = until granted): how long ``acquire()`` waits in
      the server (FIFO, no polling) before ``LockTimeout``; 0: one attempt.
    - ``ephemeral`` (default False): the hold is bound to a connection the guard owns; its close
      (crash, ``CLIENT KILL``) ends the hold in the server, and any error on it reports the hold
      lost.
    - ``on_lost`` (default None): ``on_lost(reason: LostReason) -> None``, called once when a
      hold of this handle is lost, on the library's thread (or in the event loop) that saw it
      (keep it short).
    - ``owner`` (default: ``<client id>:<n>``, a name of its own): the owner name on the server.

    Re-entry is per handle: acquiring again through a handle that holds the key succeeds at once
    with the same token; the hold ends with its last guard. Two handles are two owners.

    A hold granted after a wait that took a third of its lease or more is confirmed (one
    renewal, sent at once) before ``acquire()`` returns it: its lease on the server counts from
    the grant, which may be long after the acquire was sent.
    """

    def __init__(
        self, client: AsyncLockClient, key: bytes, kind: Kind, limit: int, **options: Any
    ) -> None:
        super().__init__(client, KeySet((key,), multi=False), kind, limit, **options)
        self.key = key

    def _guard(self, hold: Hold) -> AsyncLockGuard:
        return AsyncLockGuard(self, hold)


class AsyncMultiLock(_AsyncHandle["AsyncMultiLockGuard"]):
    """A handle: one owner on several keys held together (``client.multi_lock(keys)``), with
    the options of :class:`AsyncLock`.

    ``acquire()`` takes every key at one instant or none (``LOCK.MACQUIRE``); a wait stands in
    every key's FIFO queue at once and is granted when it heads them all, so two handles taking
    the same keys in opposite orders cannot deadlock. The hold is one hold: one watchdog renews
    every key with one ``LOCK.MRENEW``, it is lost when any key's hold is lost, and its release
    (``LOCK.MRELEASE``) frees every key. Re-entry is per handle, as for :class:`AsyncLock`.
    """

    def __init__(
        self,
        client: AsyncLockClient,
        given: tuple[Key, ...],
        keys: KeySet,
        kind: Kind,
        **options: Any,
    ) -> None:
        super().__init__(client, keys, kind, 0, **options)
        self.given = given

    def _guard(self, hold: Hold) -> AsyncMultiLockGuard:
        return AsyncMultiLockGuard(self, hold)


class AsyncLockGuard(_AsyncGuard):
    """A hold on a key: its fencing token, its ``lost`` event, its release (``async with``
    releases it on exit)."""

    @property
    def token(self) -> int:
        """The hold's fencing token: pass it with every write you protect, and have the resource
        refuse a token lower than the highest it has seen."""
        return self._hold.token

    @property
    def key(self) -> bytes:
        return self._hold.key

    async def execute(self, *command: Arg) -> Any:
        """Runs ``command`` on the server only while this hold is the key's, checked there in
        the same step (``LOCK.GUARD key owner token command...``), and returns its reply as
        redis-py gives it (bytes, int, list, None; RESP2): ``guard.execute("SET", "orders:42:
        state", "paid")``. A write of a hold that is gone never lands, however late it comes.

        Raises ``Fenced`` (a ``NotHeld``) when the server refused it because the hold is gone
        (``lost_reason`` ``HOLD_GONE``) or its token is not current (``TOKEN_NOT_CURRENT``):
        the command did not run, and the hold is reported lost (``lost``, ``on_lost``).
        ``NotHeld`` without sending anything when the guard was released or the hold lost
        before, also when only its local deadline says so (see ``lost``). The command's own
        errors (``WRONGTYPE``, ``NOPERM``, a write through a shared hold, ...) raise
        ``LockServerError`` and are no loss. ``LockConnectionError`` when no
        answer came: the command may have run (it is never sent again).

        The keys of the command must be in the lock key's slot in a Redis Cluster (give them
        its hash tag: ``orders:{42}`` and ``orders:{42}:state``); the call goes to the lock
        key's master. It never blocks (a blocking command answers at once) and never runs a
        ``LOCK.*`` command or one on the lock key itself: see the module's ``LOCK.GUARD``.
        """
        hold = self._hold
        return await self._fenced(hold.key, hold.token, command)

    def __repr__(self) -> str:
        return (
            f"AsyncLockGuard(key={self.key!r}, owner={self.owner!r}, token={self.token}, "
            f"lost={self.lost_reason})"
        )


class AsyncMultiLockGuard(_AsyncGuard):
    """A hold on several keys: a fencing token per key, one ``lost`` event, one release."""

    @property
    def tokens(self) -> dict[Key, int]:
        """Each key's fencing token, keyed by the keys as given to ``multi_lock`` (str stays
        str), in that order: ``guard.tokens["a"]``. Fence each key's writes with its own."""
        handle = cast(AsyncMultiLock, self._handle)
        return dict(zip(handle.given, self._hold.tokens))

    @property
    def keys(self) -> tuple[bytes, ...]:
        return self._hold.keys.keys

    async def execute(self, key: Key, *command: Arg) -> Any:
        """Runs ``command`` fenced by the hold of ``key`` (one of this guard's keys, as given or
        as bytes): ``LOCK.GUARD key owner token command...`` with that key's token. As
        :meth:`AsyncLockGuard.execute`; a refusal reports the whole hold lost (all or
        nothing)."""
        wanted = to_bytes(key)
        for k, token in zip(self._hold.keys.keys, self._hold.tokens):
            if k == wanted:
                return await self._fenced(k, token, command)
        raise ValueError(f"{key!r} is not a key of this hold")

    def __repr__(self) -> str:
        return (
            f"AsyncMultiLockGuard(keys={self.keys!r}, owner={self.owner!r}, "
            f"tokens={self._hold.tokens}, lost={self.lost_reason})"
        )

