# Generated from redis_lock_client/_async/_tickets.py by clients/python/unasync.py:
# edit that file and run the script, not this one.
"""Waiting with tickets: every wait of a client on one server shares two connections.

An acquire that has to wait (``LOCK.ACQUIRE|MACQUIRE|CAMPAIGN ... WAIT ms TICKET``) is sent on
the desk's **asking connection** (one, kept open while any ticket waits: a ticket belongs to the
connection that asked, and goes with it). The server replies the token at once, or the name of a
ticket it will push the answer into. The desk's **waiting connection** pops every outstanding
ticket with one ``BLPOP t1 ... tk``; a new ticket interrupts it (``CLIENT UNBLOCK``, sent on a
pooled connection) so that the next ``BLPOP`` takes it in. An answer popped goes to its waiter.

When either connection breaks (or the asking one no longer answers a ``PING``, asked every
``HEALTH_PERIOD`` while tickets wait), every waiter is told: each withdraws its ticket
(``LOCK.CANCEL``: a grant nobody popped is the canceller's) and, if that gave nothing, its
acquire is sent again (it carries ONCE: a grant popped by a ``BLPOP`` whose answer was lost
answers with its token). A waiter that gives up (its timeout passed with no answer, or asyncio
cancelled it) withdraws its ticket the same way; a grant it was given by that, or popped for it
meanwhile, is released when nobody takes it: a grant is delivered once.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from .. import _fork
from .._commands import ticket_answer, ticket_of
from .._common import WAIT_MARGIN, LockConnectionError, LockError, LockServerError
from ._backend import (
    IO_ERRORS,
    Cancelled,
    Event,
    Mutex,
    RawConnection,
    close_connection,
    interrupt,
    peer,
    read,
    send,
    sleep,
    spawn,
    wait_event,
)
from ._connection import Connector, call

#: The longest one ``BLPOP`` of the waiting connection blocks; after one that answered nothing
#: the asking connection is checked with a ``PING`` (a server-side close of it voids its tickets
#: without a word).
HEALTH_PERIOD = 1.0
#: How long the two connections stay open with no ticket waiting.
IDLE = 5.0
#: The names the two connections add to the client's connection name.
ASKING_NAME = b"tickets-ask"
WAITING_NAME = b"tickets-wait"


class NoTickets(Exception):
    """The server refused TICKET (a module without it): the wait blocks instead."""


class _Ticket:
    """One waiting acquire's ticket, as the desk and its waiter share it (under the desk's
    books)."""

    def __init__(self, name: bytes, release: list[Any]) -> None:
        self.name = name
        #: What releases a grant nobody takes (the waiter gave up).
        self.release = release
        self.event = Event()
        #: What was popped for it (set once, then ``event``).
        self.answer: Optional[bytes] = None
        #: The desk's connections broke before an answer came (then ``event``).
        self.lost = False
        #: The waiter gave up: an answer popped now is the desk's to dispose of.
        self.abandoned = False
        #: The ``BLPOP`` out when it was issued (to be interrupted), if one was.
        self.unblock: Optional[int] = None
        #: The last ``BLPOP`` that may have popped it (an abandoned ticket is never asked for
        #: again: once that round is read, the ticket is forgotten).
        self.last_round = 0


class TicketDesk:
    """The waits of one client on one server (standalone or Sentinel's master)."""

    def __init__(self, connector: Connector) -> None:
        self._connector = connector
        self._books = threading.Lock()
        self._tickets: dict[bytes, _Ticket] = {}
        self._ask: Optional[RawConnection] = None
        self._ask_mutex = Mutex()
        self._running = False
        self._wake = Event()
        #: Rounds (``BLPOP`` sent) and the last whose answer was read.
        self._round = 0
        self._read = 0
        self._blocked = False  # a BLPOP is out
        self._waiting_id: Optional[int] = None
        self._waiting: Optional[RawConnection] = None
        self._closed = False
        #: The server refused TICKET (a module without it): waits block, as without tickets.
        self.unsupported = False
        #: Tickets issued and answers popped (what the tests count).
        self.issued = 0
        self.answered = 0
        _fork.register(self)

    # -- a waiter's side ---------------------------------------------------------------------

    def wait(
        self, args: list[Any], wait: Optional[float], multi: bool, release: list[Any]
    ) -> Any:
        """An acquire with ``WAIT`` (``args``, without TICKET): the reply the acquire without
        TICKET would have given (token(s), or nil when ``wait`` passed). Raises
        ``LockConnectionError`` when the connections broke and the ticket held no grant (the
        caller sends the acquire again), the server's error as the blocking wait would."""
        ticket = self._ask_for(args + ["TICKET"], release)
        if not isinstance(ticket, _Ticket):
            return ticket
        limit = None if wait is None else wait + WAIT_MARGIN
        try:
            if ticket.unblock is not None:
                self._unblock(ticket.unblock)
            answered = wait_event(ticket.event, limit)
        except Cancelled:
            self._give_up(ticket, multi, keep=False)
            raise
        if not answered:
            return self._give_up(ticket, multi, keep=True)
        if ticket.answer is not None:
            return ticket_answer(ticket.answer, multi)
        # The connections broke: withdrawn; a grant nobody popped is the caller's.
        granted = self._cancel(ticket.name)
        if granted is not None:
            return granted
        raise LockConnectionError("the connection a ticket waited on closed")

    def _ask_for(self, args: list[Any], release: list[Any]) -> Any:
        """Sends the acquire on the asking connection: its reply, or the ``_Ticket`` it waits
        with, registered (under the asking connection's mutex: an idle desk closes that
        connection only when no ticket waits)."""
        connector = self._connector
        with self._ask_mutex:
            self._closed = False  # a client used again after close() opens them again
            master = connector.current_master()
            if self._ask is not None and master is not None and peer(self._ask) != master:
                self._drop_ask()  # the Sentinels named another master
            if self._ask is None:
                self._ask = connector.new(ASKING_NAME)
            try:
                reply = call(self._ask, args, connector.timeout)
            except LockServerError as e:
                if "syntax error" in str(e):
                    self.unsupported = True  # a module without TICKET
                    raise NoTickets() from e
                raise
            except (LockConnectionError, Cancelled):
                self._ask = None  # closed by call: its tickets are void
                self._lose_all()
                raise
            name = ticket_of(reply)
            if name is None:
                return reply
            ticket = _Ticket(name, release)
            with self._books:
                self.issued += 1
                self._tickets[name] = ticket
                start = not self._running
                self._running = True
                if self._blocked and not start:
                    ticket.unblock = self._round
                self._wake.set()
        if start:
            spawn("redis-lock-tickets", self._run)
        return ticket

    def _unblock(self, at: int) -> None:
        """Interrupts the ``BLPOP`` of round ``at`` (it answers nil) so that the next one takes
        the new ticket in; sent again while that ``BLPOP`` has not reached the server yet."""
        for _ in range(100):
            waiting_id = self._waiting_id
            if waiting_id is None:
                return
            try:
                done = self._connector.query(["CLIENT", "UNBLOCK", waiting_id])
            except LockError:
                return  # the BLPOP ends within HEALTH_PERIOD anyway
            with self._books:
                moved_on = self._round != at or not self._blocked
            if done == 1 or moved_on:
                return
            sleep(0.002)

    def _give_up(self, ticket: _Ticket, multi: bool, keep: bool) -> Any:
        """The waiter stops waiting: the ticket is withdrawn (``LOCK.CANCEL``), and a ``BLPOP``
        that may have popped it meanwhile is waited out. ``keep``: a grant got either way is
        the caller's (returned); else it is released. An answer that came first counts as it
        would have."""
        with self._books:
            if ticket.answer is None:
                ticket.abandoned = True
                ticket.last_round = self._round
        if not ticket.abandoned:
            granted = self._granted(ticket, multi, keep)
        else:
            try:
                granted = self._cancel(ticket.name)
            except LockConnectionError:
                if keep:
                    raise
                return None  # a grant it held goes with the asking connection, or expires
            if granted is None:
                wait_event(ticket.event, HEALTH_PERIOD + self._connector.timeout)
                granted = self._granted(ticket, multi, keep)
        if granted is None or keep:
            return granted
        self._release(ticket.release)
        return None

    def _granted(self, ticket: _Ticket, multi: bool, keep: bool) -> Any:
        """The grant popped for ``ticket``, if any (an error popped is raised when ``keep``)."""
        if ticket.answer is None:
            return None
        try:
            return ticket_answer(ticket.answer, multi)
        except LockError:
            if keep:
                raise
            return None

    def _cancel(self, name: bytes) -> Any:
        """``LOCK.CANCEL``: nil, or the grant the ticket held (the caller's now)."""
        return self._connector.query(["LOCK.CANCEL", name])

    def _release(self, release: list[Any]) -> None:
        try:
            self._connector.query(release)
        except LockError:
            pass  # its lease ends it

    # -- the waiting connection --------------------------------------------------------------

    def _run(self) -> None:
        """The waiting connection's loop: ``BLPOP`` over every outstanding ticket, each answer
        to its waiter; closed with the asking connection after ``IDLE`` with nothing to wait
        for."""
        checked = time.monotonic()
        idle_since: Optional[float] = None
        while True:
            with self._books:
                names = [t.name for t in self._tickets.values() if not t.abandoned]
                if not names:
                    self._wake.clear()
                    now = time.monotonic()
                    idle_since = idle_since or now
                    if self._closed or now - idle_since >= IDLE:
                        self._running = False
                        break
                else:
                    idle_since = None
                    self._round += 1
                    self._blocked = True
                at = self._round
            if not names:
                wait_event(self._wake, IDLE)
                continue
            try:
                conn = self._waiting_connection()
                send(conn, ["BLPOP", *names, HEALTH_PERIOD])
                reply = read(conn, HEALTH_PERIOD + self._connector.timeout)
            except (LockError, *IO_ERRORS):
                self._break_waiting()
                continue
            with self._books:
                self._blocked = False
                self._read = at
            if isinstance(reply, list) and len(reply) == 2:
                self._deliver(bytes(reply[0]), bytes(reply[1]))
            elif time.monotonic() - checked >= HEALTH_PERIOD:
                checked = time.monotonic()
                self._check_asking()
            self._forget_abandoned()
        self._close_idle()

    def _waiting_connection(self) -> RawConnection:
        if self._waiting is None:
            conn = self._connector.new(WAITING_NAME)
            try:
                waiting_id = call(conn, ["CLIENT", "ID"], self._connector.timeout)
            except LockError:
                close_connection(conn)
                raise
            self._waiting, self._waiting_id = conn, int(waiting_id)
            if self._connector.sentinel:  # a master the Sentinels replaced: left at once
                done = Event()
                self._following = done
                spawn("redis-lock-follow", self._connector.follow, conn, done)
        return self._waiting

    _following: Optional[Event] = None

    def _deliver(self, name: bytes, value: bytes) -> None:
        """An answer popped: to its waiter (one that gave up takes it after its LOCK.CANCEL)."""
        with self._books:
            self.answered += 1
            ticket = self._tickets.pop(name, None)
            if ticket is not None:
                ticket.answer = value
        if ticket is not None:
            ticket.event.set()

    def _forget_abandoned(self) -> None:
        """Tickets given up that no BLPOP out may pop any more: their waiters are told."""
        with self._books:
            done = [t for t in self._tickets.values() if t.abandoned and t.last_round <= self._read]
            for ticket in done:
                del self._tickets[ticket.name]
        for ticket in done:
            ticket.event.set()

    def _check_asking(self) -> None:
        """A ``PING`` on the asking connection (unless an acquire is using it: its reply tells):
        a connection the server closed has voided its tickets."""
        if self._ask_mutex.locked():
            return
        with self._ask_mutex:
            if self._ask is None:
                return
            try:
                call(self._ask, ["PING"], self._connector.timeout)
            except LockConnectionError:
                self._ask = None
                self._lose_all()

    def _break_waiting(self) -> None:
        """The waiting connection broke: an answer it popped may be lost, so every waiter is
        told (it withdraws its ticket, then asks again)."""
        conn, self._waiting, self._waiting_id = self._waiting, None, None
        if self._following is not None:
            self._following.set()
            self._following = None
        if conn is not None:
            interrupt(conn)
        with self._books:
            self._blocked = False
            self._read = self._round
        self._lose_all()

    def _lose_all(self) -> None:
        """Every outstanding ticket is told its connections broke."""
        with self._books:
            lost = list(self._tickets.values())
            self._tickets.clear()
        for ticket in lost:
            ticket.lost = True
            ticket.event.set()

    def _drop_ask(self) -> None:
        """Closes the asking connection (its mutex is held): its tickets are void."""
        if self._ask is not None:
            close_connection(self._ask)
            self._ask = None
        self._lose_all()

    def _close_idle(self) -> None:
        if self._waiting is not None:
            conn = self._waiting
            self._break_waiting()
            close_connection(conn)
        with self._ask_mutex:
            with self._books:
                idle = not self._running and not self._tickets
            if idle and self._ask is not None:
                close_connection(self._ask)
                self._ask = None

    def close(self) -> None:
        """The client closes: both connections closed (a wait still out asks again on new
        ones, as a blocking wait keeps its connection)."""
        self._closed = True
        if self._waiting is not None:
            interrupt(self._waiting)
        self._wake.set()
        with self._ask_mutex:
            if self._ask is not None:
                close_connection(self._ask)
                self._ask = None
            self._lose_all()

    def after_fork(self) -> None:
        """In a forked child: the parent's connections and loop are not the child's."""
        self._books = threading.Lock()
        self._ask_mutex = Mutex()
        self._tickets = {}
        self._ask = self._waiting = None
        self._waiting_id = None
        self._following = None
        self._running = self._blocked = False
        self._wake = Event()

