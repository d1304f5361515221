# Generated from redis_lock_client/_async/_connection.py by clients/python/unasync.py:
# edit that file and run the script, not this one.
"""The library's connections to one server: a pool for ordinary commands, a fresh connection
for each wait, one connection per EPHEMERAL hold."""

from __future__ import annotations

import time
from typing import Any, Optional

from redis.exceptions import RedisError, ResponseError

from .._commands import (
    FUNCTIONS_VERSION,
    Call,
    as_is,
    library_source,
    on_functions,
    says_backend_gone,
    version_of,
)
from .._common import (
    Backend,
    LockConnectionError,
    LockServerError,
    NoPermission,
    NotSupported,
)
from .._connect import name_for, own_kwargs, server_error
from ._backend import (
    IO_ERRORS,
    Cancelled,
    Event,
    Mutex,
    RawConnection,
    ask_master,
    close_connection,
    interrupt,
    closed_by_server,
    closed_now,
    is_closed,
    new_pool,
    open_connection,
    peer,
    pool_close,
    pool_get,
    pool_in_use,
    pool_put,
    read,
    send,
    wait_event,
)

#: Under Sentinel, how often a connection that waits or listens looks whether the server it
#: reached is still the master the Sentinels name.
FOLLOW_PERIOD = 0.5


#: The commands whose 0 says a hold is gone: a renewal (a multi-key one's per key), a check,
#: a proclamation. Not a release: its 0 (no holder left) is the usual answer, and a Sentinel
#: lookup on every release would cost every release a round trip or more.
GONE_AT_ZERO = frozenset({"LOCK.RENEW", "LOCK.MRENEW", "LOCK.CHECK", "LOCK.PROCLAIM"})


def says_gone(args: list[Any], reply: Any) -> bool:
    """Whether ``reply`` to ``args`` says a hold is gone (a 0 of ``GONE_AT_ZERO``); the Rust
    library's rule too."""
    name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
    if name.upper() not in GONE_AT_ZERO:
        return False
    return bool(reply == 0 or (isinstance(reply, list) and 0 in reply))


def call(conn: RawConnection, args: list[Any], timeout: Optional[float]) -> Any:
    """One command on ``conn`` (``timeout`` None: as long as it takes). A broken, timed-out or
    cancelled connection is closed, so that no stale reply is ever read from it later."""
    try:
        send(conn, args)
        return read(conn, timeout)
    except ResponseError as e:
        raise server_error(e, args[0]) from None
    except IO_ERRORS as e:
        close_connection(conn)
        raise LockConnectionError(f"{args[0]}: {e}") from e
    except (ValueError, AttributeError) as e:
        # Closed under this call (a client closed from another thread, a hold's connection
        # closed by its watchdog): redis-py then fails on its closed socket buffer ("I/O
        # operation on closed file", "'NoneType' object has no attribute 'readline'").
        if not is_closed(conn):
            raise
        raise LockConnectionError(f"{args[0]}: the connection closed under the command") from e
    except Cancelled:
        close_connection(conn)
        raise


def detect(conn: RawConnection, timeout: float, load: bool) -> Backend:
    """What serves locks on ``conn``'s server: the module when ``COMMAND INFO`` knows
    ``LOCK.ACQUIRE``; else the ``redislock`` library when ``lock_version`` answers
    ``FUNCTIONS_VERSION`` or more; else, with ``load``, the library shipped here, loaded
    (``FUNCTION LOAD REPLACE``); else ``NotSupported``, which says what to do. An ACL that
    refuses ``COMMAND INFO`` leaves the library's answer to tell (none: the module, as the
    commands' own errors will show)."""
    try:
        known = call(conn, ["COMMAND", "INFO", "LOCK.ACQUIRE"], timeout)
        if isinstance(known, list) and known and known[0] is not None:
            return Backend.MODULE
        refused = False
    except NoPermission:
        refused = True
    try:
        version = version_of(call(conn, ["FCALL_RO", "lock_version", 0], timeout))
    except LockServerError as e:
        if refused or isinstance(e, NoPermission):
            return Backend.MODULE
        if "Function not found" not in str(e):
            raise
        version = None
    if version is not None and version >= FUNCTIONS_VERSION:
        return Backend.FUNCTIONS
    if refused:
        return Backend.MODULE
    had = "no redislock library" if version is None else f"redislock library version {version}"
    if not load:
        raise NotSupported(
            f"the server has neither the LOCK.* module nor the redislock Functions library "
            f"version {FUNCTIONS_VERSION} or newer ({had}): load the module, or load "
            f"functions/redislock.lua (FUNCTION LOAD REPLACE), or make the client with "
            f"load_functions=True"
        )
    call(conn, ["FUNCTION", "LOAD", "REPLACE", library_source()], timeout)
    return Backend.FUNCTIONS


class Connector:
    """Makes the library's connections to one server and runs one command on one, as the
    server's backend takes it (the module's ``LOCK.*`` commands, or the ``redislock``
    library's ``FCALL``s: ``_commands.on_functions``), found at the first command."""

    def __init__(
        self, cls: type[Any], kwargs: dict[str, Any], timeout: float, load_functions: bool = False
    ) -> None:
        self.cls = cls
        self.kwargs = own_kwargs(kwargs, timeout)
        self.timeout = timeout
        self.load_functions = load_functions
        self._backend: Optional[Backend] = None
        self._detecting = Mutex()
        self.db = int(self.kwargs.get("db", 0) or 0)
        self.pool = new_pool(cls, self.kwargs)
        self._asked = 0.0
        #: Under Sentinel: the master named when it was last looked at (see
        #: ``_leave_old_master``).
        self._master_seen: Optional[tuple[str, int]] = None

    def new(self, owner: Optional[bytes] = None) -> RawConnection:
        """A connection of its own; one bound to ``owner`` carries the owner in its name."""
        kwargs = self.kwargs
        if owner is not None:
            kwargs = {**kwargs, "client_name": name_for(kwargs["client_name"], owner)}
        try:
            return open_connection(self.cls, kwargs)
        except ResponseError as e:  # refused on connect (CLIENT SETNAME, SELECT: an ACL)
            raise server_error(e) from None
        except IO_ERRORS as e:
            raise LockConnectionError(f"connect: {e}") from e

    def backend(self) -> Backend:
        """The server's backend, found once (``detect``); again after an answer says it is
        gone (``query``)."""
        known = self._backend
        if known is not None:
            return known
        with self._detecting:
            if self._backend is None:
                # On a pooled connection, disconnected after: the next command on it connects
                # again, to the master of its time (under Sentinel, not one a failover left).
                conn = self._pooled()
                try:
                    self._backend = detect(conn, self.timeout, self.load_functions)
                finally:
                    close_connection(conn)
                    pool_put(self.pool, conn)
            return self._backend

    def sent_as(self, args: list[Any]) -> Call:
        """``args`` as the server's backend takes them (``NotSupported`` when it cannot)."""
        if self.backend() is Backend.FUNCTIONS:
            return on_functions(args)
        return Call(args, as_is)

    def query(
        self,
        args: list[Any],
        asking: bool = False,
        then: Optional[list[Any]] = None,
        then_timeout: float = 0.0,
    ) -> Any:
        """One command on a pooled connection, as the server's backend takes it; ``asking``:
        preceded by ASKING (the answer to an ASK redirection, good for that one command).
        ``then``: a second command sent on the same connection after the first answered
        (``WAIT`` after a write: it waits for this connection's writes), read with
        ``then_timeout`` more; the answer is then the pair (a server error of the second is
        returned in it, not raised). An error that says the backend is gone (the module
        unloaded, the library flushed) has the backend found again and the command sent once
        more, as the backend found takes it."""
        try:
            return self._query(args, asking, then, then_timeout)
        except LockServerError as e:
            if not says_backend_gone(str(e)):
                raise
            self._backend = None
        return self._query(args, asking, then, then_timeout)

    def _query(
        self,
        args: list[Any],
        asking: bool,
        then: Optional[list[Any]],
        then_timeout: float,
    ) -> Any:
        sent_as = self.sent_as(args)
        conn = self._pooled()
        sent = time.monotonic()
        try:
            if asking:
                call(conn, ["ASKING"], self.timeout)
            try:
                first = call(conn, sent_as.args, self.timeout)
            except LockServerError:
                # A refusal (FENCED, an error of the hold) may end a hold: believed only from
                # the master the Sentinels name now, asked afresh (see ``_still_master``).
                self._still_master(conn, sent, args, fresh=True)
                raise
            first = sent_as.answer(first)
            self._still_master(conn, sent, args, fresh=says_gone(args, first))
            if then is None:
                return first
            try:
                return first, call(conn, then, self.timeout + then_timeout)
            except LockServerError as e:  # the first command's reply stands
                return first, e
        finally:
            pool_put(self.pool, conn)

    def fenced(self, args: list[Any], fence: bytes, asking: bool = False) -> Any:
        """``args`` behind a write, on a pooled connection: ``MULTI``, ``DEL fence`` (a key
        that never exists, of the node's), ``args``, ``EXEC`` (sent at once once ``MULTI`` was
        answered); ``args``'s reply.
        A write pause (``CLIENT PAUSE WRITE``, a failover's) holds the whole transaction until
        it ends, as it holds any write; a refused ``MULTI`` or ``DEL`` (an ACL) runs nothing.
        ``asking``: preceded by ASKING (the node imports the fence's slot)."""
        sent = (self.sent_as(args)).args
        conn = self._pooled()
        try:
            if asking:
                call(conn, ["ASKING"], self.timeout)
            # MULTI answered first: refused (an ACL), what follows would run on its own.
            call(conn, ["MULTI"], self.timeout)
            commands: list[list[Any]] = [["DEL", fence], sent, ["EXEC"]]
            for command in commands:
                send(conn, command)
            refused: Optional[ResponseError] = None
            for _ in commands[:-1]:
                try:
                    read(conn, self.timeout)
                except ResponseError as e:  # not queued: EXEC answers EXECABORT
                    refused = refused or e
            try:
                replies = read(conn, self.timeout)
            except ResponseError as e:
                raise server_error(refused or e) from None
            if not isinstance(replies, list) or len(replies) != 2:
                raise LockServerError(f"EXEC answered {replies!r}")
            if isinstance(replies[1], ResponseError):
                raise server_error(replies[1])
            return replies[1]
        except IO_ERRORS as e:
            close_connection(conn)
            raise LockConnectionError(f"{args[0]}: {e}") from e
        except Cancelled:
            close_connection(conn)
            raise
        finally:
            pool_put(self.pool, conn)

    def _pooled(self) -> RawConnection:
        """A connection of the pool (put it back with ``pool_put``)."""
        try:
            conn = pool_get(self.pool)
        except ResponseError as e:  # refused on connect (CLIENT SETNAME, SELECT: an ACL)
            raise server_error(e) from None
        except IO_ERRORS as e:
            raise LockConnectionError(f"connect: {e}") from e
        if self.sentinel:
            # A pooled connection opened before a failover may still reach the old master (a
            # paused one keeps its connections open and answers again once resumed, until the
            # Sentinels demote it): it is closed, and reconnects to the master named now.
            master = self.current_master()
            reached = peer(conn)
            if master is not None and reached is not None and reached != master:
                close_connection(conn)
        return conn

    def _still_master(
        self, conn: RawConnection, sent: float, args: list[Any], fresh: bool = False
    ) -> None:
        """Under Sentinel: an answer that came from a server the Sentinels no longer name is
        taken for none (LockConnectionError, the connection closed): it may come from the old
        master, paused and continued, which no longer counts (a release it answered leaves the
        hold on the new master), or one cut off from the Sentinels that still serves this
        client (a partition: it does not have the holds the new master granted). A command
        that took ``FOLLOW_PERIOD`` or more, and an answer that says a hold is gone
        (``fresh``), ask the Sentinels afresh: the last answer may be up to ``FOLLOW_PERIOD``
        old, and a hold is reported lost only on the word of the master named now."""
        if not self.sentinel:
            return
        if fresh or time.monotonic() - sent >= FOLLOW_PERIOD:
            self._asked = 0.0
        master = self.current_master()
        reached = peer(conn)
        if master is not None and reached is not None and master != reached:
            close_connection(conn)
            raise LockConnectionError(
                f"{args[0]}: the master changed (a failover) while the command was on its way"
            )

    @property
    def sentinel(self) -> bool:
        """Whether the connections are to the master Sentinel names (which may change)."""
        return hasattr(self.kwargs.get("connection_pool"), "get_master_address")

    def current_master(self) -> Optional[tuple[str, int]]:
        """Under Sentinel: the master the Sentinels name now, asked at most every
        ``FOLLOW_PERIOD`` (between, the last answer); None elsewhere."""
        if not self.sentinel:
            return None
        now = time.monotonic()
        if now - self._asked >= FOLLOW_PERIOD:
            self._asked = now
            try:
                ask_master(self.kwargs["connection_pool"])
            except (RedisError, ReferenceError, OSError):
                pass  # no Sentinel answers: the last answer stands
        master = self.master_address()
        if master is not None and master != self._master_seen:
            self._master_seen = master
            self._leave_old_master(master)
        return master

    def _leave_old_master(self, master: tuple[str, int]) -> None:
        """The Sentinels name ``master``, another server than before: a pooled connection
        taken out to another server (a command on it, or its connect's handshake) is broken
        now. On a paused master it would wait out the command timeout, for an answer that no
        longer counts (see ``_still_master``); broken, its read fails as on a connection the
        server closed, and its caller goes on as after no answer (a connect tries again, to
        the master named now)."""
        for conn in pool_in_use(self.pool):
            if peer(conn) not in (None, master):
                interrupt(conn)

    def follow(self, conn: RawConnection, done: Event) -> None:
        """Under Sentinel, while ``done`` is not set: closes ``conn`` as soon as the Sentinels
        name a master other than the server it reached (a failover that did not break it: a
        paused master keeps its connections open), so that what waits on it ends at once."""
        reached = peer(conn)
        while not wait_event(done, FOLLOW_PERIOD):
            master = self.current_master()
            if master is not None and reached is not None and master != reached:
                interrupt(conn)
                return

    def master_address(self) -> Optional[tuple[str, int]]:
        """Under Sentinel: the master the Sentinels named when a connection last connected
        (redis-py's Sentinel pool keeps it); None elsewhere. It changes with a failover, once
        a connection to the old master broke and a new one asked."""
        pool = self.kwargs.get("connection_pool")
        try:
            address = getattr(pool, "master_address", None)
        except ReferenceError:  # the application's Sentinel pool is gone
            return None
        if isinstance(address, tuple) and len(address) == 2:
            return (str(address[0]), int(address[1]))
        return None

    def close(self) -> None:
        pool_close(self.pool)


class OwnClosed(LockConnectionError):
    """The EPHEMERAL hold's connection was closed before the command: nothing was sent (the
    server ends the hold once it reads the close)."""


class OwnConnection:
    """The connection an EPHEMERAL hold is bound to: never replaced, never reconnected. Any
    error on it closes it for good (the server then ends the hold, if it has not already)."""

    def __init__(self, conn: RawConnection, timeout: float) -> None:
        self.conn = conn
        #: The read timeout of an ordinary command on it (renew, release).
        self.timeout = timeout
        self.mutex = Mutex()
        self.broken = False

    def call(
        self,
        args: list[Any],
        timeout: Optional[float],
        asking: bool = False,
        then: Optional[list[Any]] = None,
        then_timeout: float = 0.0,
    ) -> Any:
        """One command on the connection; ``asking``: preceded by ASKING (the keys' slot is
        being imported by this connection's node); ``then``: as for ``Connector.query``."""
        with self.mutex:
            # Looked at before anything is sent: a command written to a connection the server
            # closed never runs, and its caller is told so (``OwnClosed``), not "no answer".
            if self.broken or closed_now(self.conn):
                self.broken = True
                raise OwnClosed("the EPHEMERAL hold's connection is closed: nothing was sent")
            try:
                if asking:
                    call(self.conn, ["ASKING"], timeout)
                first = call(self.conn, args, timeout)
                if then is None:
                    return first
                more = None if timeout is None else timeout + then_timeout
                try:
                    return first, call(self.conn, then, more)
                except LockServerError as e:  # the first command's reply stands
                    return first, e
            except (LockConnectionError, Cancelled):
                self.broken = True
                raise
            except (ValueError, AttributeError) as e:
                # Closed under this call: redis-py then fails on its closed socket buffer. That
                # is the connection's loss, not an error of the command.
                if not (self.broken or is_closed(self.conn)):
                    raise
                self.broken = True
                raise LockConnectionError(f"the EPHEMERAL hold's connection closed: {e}") from e

    def alive(self) -> bool:
        """False once the server closed it (nothing else may arrive on an idle connection)."""
        if not self.broken:
            try:
                self.broken = closed_by_server(self.conn, self.mutex)
            except IO_ERRORS:
                self.broken = True
        return not self.broken

    def close(self) -> None:
        """Closes it for good. A command reading on it meanwhile (another thread's, another
        task's) is broken first and ends with a connection error; the connection is shut down
        once that command let go of it, never under it (redis-py's reads on a connection closed
        under them fail with errors of their own: ``'NoneType' object has no attribute
        'readline'``, ``I/O operation on closed file``)."""
        self.broken = True
        interrupt(self.conn)
        with self.mutex:
            close_connection(self.conn)

    def after_fork(self) -> None:
        """In a forked child: the parent's socket is never used, nor shut down, here."""
        self.mutex = Mutex()
        self.broken = True

