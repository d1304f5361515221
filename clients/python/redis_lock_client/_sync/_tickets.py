# Generated from redis_lock_client/_async/_tickets.py by clients/python/unasync.py:
# edit that file and run the script, not this one.
"""Waiting with tickets: the waits of a client on one server share one asking connection and a
few waiting connections.

An acquire that has to wait (``LOCK.ACQUIRE|MACQUIRE|CAMPAIGN ... WAIT ms TICKET``) is sent on
the desk's **asking connection** (one per server, kept open while any ticket waits: a ticket
belongs to the connection that asked, and goes with it). The server replies the token at once,
or the name of a ticket it will push the answer into. A **waiting connection** pops the
outstanding tickets with one ``BLPOP t1 ... tk``; a new ticket interrupts it (``CLIENT
UNBLOCK``, sent on a pooled connection in a transaction behind a write, ``DEL`` of a key that
never exists: a write pause holds it as it holds the ``BLPOP``, which it postpones) so that the
next ``BLPOP`` takes it in. An answer popped goes to its waiter.

One ``BLPOP`` pops at most ``TICKETS_PER_CONNECTION`` tickets: a new ticket joins the first
group with room, else starts one (with a waiting connection of its own), and interrupts only its
group's ``BLPOP``. In a Redis Cluster a
ticket lives in its lock's slot and one ``BLPOP`` may only name keys of one slot, so the tickets
are grouped by slot too: a ``BLPOP`` (and a waiting connection) per group of a slot with a wait
in progress, per node; a connection a slot no longer needs is kept for the next slot that does, and closed
after ``IDLE`` unused. Each ``BLPOP`` there is preceded by ``ASKING`` (a ticket asked on a node
importing its slot lives there before the slot does; elsewhere ``ASKING`` changes nothing). A
``BLPOP`` the server itself redirects (the slot is migrating and the ticket is not on the source,
or the slot has moved) is followed with the pop only, on the node named: the lock is not asked
for again because of it (the answer moves with the slot; an ``ASK`` is followed for one short
pop, then the source is popped again, where the ticket may still be answered); after a
``MOVED`` away from the desk's node (the move is over, so what the old queue owed a ticket is on
the new node already), ``MOVED_EMPTY_ROUNDS`` pops in a row that find nothing there void the
group's tickets: each is withdrawn and asked again where the slot is. A ``TRYAGAIN``
(some tickets moved, some not) pops one ticket at a time until the move is over. A failover
is another matter: the queue lives in the old master's memory, and a demoted master answers a
``BLPOP`` blocked then ``UNBLOCKED``, and one its write pause postponed ``MOVED`` (it is
then a replica: ``ROLE``): either way the group's tickets are void, and asked again as when
the waiting connection breaks.

When the asking connection breaks (or no longer answers a ``PING``, asked every
``HEALTH_PERIOD`` while tickets wait), every waiter of the server is told; when a waiting
connection breaks, every waiter it popped for. Each told waiter withdraws its ticket
(``LOCK.CANCEL``: a grant nobody popped is the canceller's) and, if that gave nothing, its
acquire is sent again (it carries ONCE: a grant popped by a ``BLPOP`` whose answer was lost
answers with its token). A waiter that gives up (its timeout passed with no answer, or asyncio
cancelled it) withdraws its ticket the same way; a grant it was given by that, or popped for it
meanwhile, is released when nobody takes it: a grant is delivered once. An asyncio cancel that
lands while the acquire is being asked does not touch the asking connection (the other waits
keep their places): the ask finishes (in a task of its own), then its ticket is withdrawn (and
a grant it got released) before the cancelled acquire ends, so the handle's next acquire comes
after that release. A ticket popped ``expired`` (a grant nobody popped within its lease: the
hold is gone) is no grant: the waiter asks again while its wait lasts.

No wait outlives the loop that pops for it: a group's loop that fails (an error no round
expects) ends its group, and a waiter that sees its loop begin no round for longer than a
round can take (``STALL_MARGIN`` plus four command timeouts) ends it too (its connections
broken, so a stalled read ends): either way the group's waiters are told, as when the waiting
connection breaks, and the next ticket of the slot starts a new loop.

An EPHEMERAL acquire asks on the connection its hold will be bound to (``wait_own``: the server
binds the hold to the connection that asked), and its ticket is popped as any other; the loss
of the desk's asking connection does not touch it, the loss of its own ends the wait.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional

from redis.crc import key_slot
from redis.exceptions import ResponseError

from .. import _fork
from .._commands import (
    EXPIRED,
    TicketExpired,
    ask_again_of,
    is_retry_later,
    ticket_answer,
    ticket_of,
)
from .._common import (
    WAIT_MARGIN,
    LockConnectionError,
    LockError,
    LockServerError,
    NoPermission,
)
from .._connect import Redirected, server_error
from ._backend import (
    IO_ERRORS,
    Cancelled,
    Event,
    Mutex,
    RawConnection,
    close_connection,
    finish,
    interrupt,
    peer,
    read,
    send,
    send_packed,
    sleep,
    spawn,
    start,
    wait_event,
)
from ._connection import Connector, OwnConnection, call


log = logging.getLogger("redis_lock_client")


def _with_wait(args: list[Any], wait: float) -> list[Any]:
    """``args`` (an acquire ``... WAIT ms``) with ``wait`` seconds instead."""
    out = list(args)
    for i in range(len(out) - 1):
        if out[i] == "WAIT":
            out[i + 1] = max(1, int(wait * 1000))
            break
    return out

#: The longest one ``BLPOP`` of a waiting connection blocks; after one that answered nothing
#: the asking connection is checked with a ``PING`` (a server-side close of it voids its tickets
#: without a word).
HEALTH_PERIOD = 1.0
#: How long one ``BLPOP`` blocks on a node an ``ASK`` named, or for one ticket alone after a
#: ``TRYAGAIN`` (a slot being moved): the source is popped again after it.
SHORT_PERIOD = 0.1
#: How long the connections stay open with no ticket waiting.
IDLE = 5.0
#: The most tickets one waiting connection pops (one ``BLPOP`` names them all): the tickets of a
#: server (of a slot, in a cluster) are split over as many groups, each with its waiting
#: connection, as it takes, so that each grant costs the server a ``BLPOP`` over at most this
#: many keys (over all of them, with 2,000 waits queued, a grant cost the server 4 times a
#: blocked waiter's) and a new ticket interrupts only the ``BLPOP`` it joins.
TICKETS_PER_CONNECTION = 100
#: Full pops in a row that found nothing after a ``MOVED`` (the slot left the node that issued
#: tickets, or the desk's node) before those tickets are taken for void: the answer a queue
#: owed its tickets (the redirect written when their key left) moved with the slot, and is
#: popped at once; with none, the tickets are withdrawn and asked again where the slot is.
#: (Under slot moves back and forth, an answer was lost so: the group followed the slot away
#: and back to the desk's node, where the old rule, "popping away from the desk's node", no
#: longer held, and its waits hung with no ticket left on any node.)
MOVED_EMPTY_ROUNDS = 2
#: A group's loop that has not finished a round for this long plus four command timeouts (a
#: round is a connection opened, ``ASKING`` and a ``BLPOP`` of at most ``HEALTH_PERIOD``, each
#: bounded by the command timeout) has stalled: its waiters stop counting on it.
STALL_MARGIN = HEALTH_PERIOD + 1.0
#: How long after the time a ``redislock`` library's ticket reply names (the holder's lease end,
#: or its bound on how long an entry stays in the line unasked) the acquire is asked again.
ASK_AGAIN_MARGIN = 0.002
#: The names the two kinds of connections add to the client's connection name.
ASKING_NAME = b"tickets-ask"
WAITING_NAME = b"tickets-wait"


#: The first pause before ``CLIENT UNBLOCK`` is sent again (the ``BLPOP`` it interrupts has not
#: reached the server yet), doubled each time up to ``UNBLOCK_RETRY_MAX``.
UNBLOCK_RETRY = 0.002
UNBLOCK_RETRY_MAX = 0.1
#: The fence of ``CLIENT UNBLOCK`` (``DEL`` of a key that never exists), with the tickets' tag.
FENCE_PREFIX = b"__lock_fence__unblock"


def _fence(ticket: bytes) -> bytes:
    """The fence key of ``ticket``'s interrupts: in its slot (``__lock_fence__unblock{<tag>}``
    for a ticket ``__lock_fence__ticket{<tag>}<id>``)."""
    start = ticket.find(b"{")
    end = ticket.find(b"}", start + 1)
    if start < 0 or end <= start + 1:
        return FENCE_PREFIX  # not a name the module gives; standalone any key does
    return FENCE_PREFIX + ticket[start : end + 1]


def _bulk(arg: bytes) -> bytes:
    """``arg`` as a RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(arg), arg)


def _blpop(wires: list[bytes], block: float) -> bytes:
    """``BLPOP <tickets> <block>`` in RESP, from the tickets' names encoded once each: a
    ``BLPOP`` is sent for each answer popped, over every outstanding ticket, and redis-py's
    encoding of each name, every time, made the client's cost of a grant grow with the tickets
    outstanding (with 2,000 queued, about 2 ms a ``BLPOP``)."""
    head = b"*%d\r\n$5\r\nBLPOP\r\n" % (len(wires) + 2)
    return b"".join([head, *wires, _bulk(repr(block).encode())])


class NoTickets(Exception):
    """The server refused TICKET (a module without it): the wait blocks instead."""


class _Waiting:
    """A waiting connection: where it reaches, and its client id (for ``CLIENT UNBLOCK``)."""

    def __init__(
        self, conn: RawConnection, client_id: Optional[int], via: Connector, home: bool
    ) -> None:
        self.conn = conn
        self.id = client_id
        #: The connections of the node it reaches (``CLIENT UNBLOCK`` goes there).
        self.via = via
        #: Whether it reaches the desk's own node (else: a node a redirection named).
        self.home = home
        #: Under Sentinel: set when the connection closes (ends its follower).
        self.following: Optional[Event] = None
        #: When it was last put back unused.
        self.since = 0.0

    def at(self, target: tuple[str, int, bool]) -> bool:
        """Whether it reaches the node ``target`` names."""
        return not self.home and peer(self.conn) == (target[0], target[1])

    def abort(self) -> None:
        if self.following is not None:
            self.following.set()
        interrupt(self.conn)

    def close(self) -> None:
        if self.following is not None:
            self.following.set()
        close_connection(self.conn)


class _Slot:
    """The tickets one ``BLPOP`` pops (standalone: a server's; in a cluster: of one slot; at
    most ``TICKETS_PER_CONNECTION``), and its waiting connection."""

    def __init__(self, slot: Optional[int], number: int) -> None:
        self.slot = slot
        #: Its key in the desk's groups: its slot and its number.
        self.key = (slot, number)
        self.tickets: dict[bytes, _Ticket] = {}
        self.wake = Event()
        #: Rounds (``BLPOP`` sent) and the last whose answer was read.
        self.round = 0
        self.read = 0
        self.blocked = False  # a BLPOP is out
        self.waiting: Optional[_Waiting] = None
        #: Where the next pop goes after the server redirected one: (host, port, sticky); an
        #: ASK is followed for one pop (not sticky), a MOVED until the node says otherwise.
        self.away: Optional[tuple[str, int, bool]] = None
        #: A TRYAGAIN: the next pop names one ticket.
        self.one_by_one = False
        #: The connection to the node an ASK named, kept while pops alternate between the two.
        self.spare: Optional[_Waiting] = None
        #: When its loop last began a round (its waiters watch it: ``_stalled``).
        self.alive_at = time.monotonic()
        #: Its loop ended (failed, or stalled): a ticket of its slot starts another group.
        self.ended = False


class _Ticket:
    """One waiting acquire's ticket, as the desk and its waiter share it (under the desk's
    books)."""

    def __init__(self, name: bytes, release: list[Any], group: _Slot) -> None:
        self.name = name
        #: The name as a ``BLPOP`` argument in RESP, encoded once (``_blpop``).
        self.wire = _bulk(name)
        #: What releases a grant nobody takes (the waiter gave up); routed by the ticket's name
        #: (in the lock's slot).
        self.release = release
        self.group = group
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
        #: An EPHEMERAL wait's ticket, asked on the hold's own connection (not the desk's
        #: asking connection: its loss does not touch it).
        self.own = False
        #: The node that issued it (its queue is there), if known.
        self.issuer: Optional[tuple[str, int]] = None
        #: A ``MOVED`` of its group named another node than its issuer since it was issued: its
        #: slot left the issuer, whose queue wrote its answer (a redirect, or a grant) before
        #: the key left, to move with the slot. Found nowhere after ``MOVED_EMPTY_ROUNDS``
        #: pops, it is void (withdrawn, asked again).
        self.moved = False
        #: A ``redislock`` library's ticket (no timer runs in a function): when its acquire is
        #: asked again (``_ask_again``), and that acquire (without TICKET). None: the module's.
        self.ask_again_at: Optional[float] = None
        self.args: list[Any] = []
        #: No timer in the server answers it ``timeout`` (a ``redislock`` library's ticket):
        #: the wait ends at its own deadline, withdrawing the ticket at once.
        self.untimed = False


class TicketDesk:
    """The waits of one client on one server (standalone, Sentinel's master, or one cluster
    master: ``cluster`` is then the client, which routes a command by its key and knows the
    other nodes)."""

    def __init__(self, connector: Connector, cluster: Any = None) -> None:
        self._connector = connector
        self._cluster = cluster
        self._books = threading.Lock()
        #: The groups, by slot and number (the first of a slot with room takes a new ticket).
        self._slots: dict[tuple[Optional[int], int], _Slot] = {}
        self._started = 0
        #: Waiting connections to this node that no slot uses now, the last put back last.
        self._idle: list[_Waiting] = []
        self._ask: Optional[RawConnection] = None
        self._ask_mutex = Mutex()
        self._closed = False
        #: The server refused TICKET (a module without it): waits block, as without tickets.
        self.unsupported = False
        #: An ACL refused the interrupt's transaction: the BLPOPs are not interrupted.
        self._no_interrupt = False
        #: Tickets issued and answers popped (what the tests count).
        self.issued = 0
        self.answered = 0
        _fork.register(self)

    # -- a waiter's side ---------------------------------------------------------------------

    def wait(
        self,
        args: list[Any],
        wait: Optional[float],
        multi: bool,
        release: list[Any],
        asking: bool = False,
        held: bool = False,
        route: bytes = b"",
    ) -> Any:
        """An acquire with ``WAIT`` (``args``, without TICKET): the reply the acquire without
        TICKET would have given (token(s), or nil when ``wait`` passed). ``asking``: preceded
        by ASKING (an ASK named this node). ``held``: the owner holds the keys already (a grant
        at once is then that hold, never released here); ``route``: the key that routes
        ``release`` (in a cluster). Raises ``LockConnectionError`` when
        the connections broke and the ticket held no grant (the caller sends the acquire
        again), ``TicketExpired`` when the grant expired before it was popped (the caller asks
        again while its wait lasts), the server's error as the blocking wait would."""
        # The ask runs on its own: a cancel of the waiter meanwhile must not break the asking
        # connection (every other wait's ticket goes with it).
        asked = start(self._ask_for(args + ["TICKET"], release, asking))
        try:
            ticket = finish(asked)
        except Cancelled:
            # Not left to the background: the handle's gate is held until a grant the ask got
            # is released (the handle's next acquire, ONCE, would re-enter it just before).
            finish(start(self._withdraw(asked, multi, release, held, route)))
            raise
        if not isinstance(ticket, _Ticket):
            return ticket
        # The module answers ``timeout`` into the ticket when the wait ends: awaited a margin
        # longer. The library has no timer: the wait ends at its deadline.
        margin = 0.0 if ticket.untimed else WAIT_MARGIN
        until = None if wait is None else time.monotonic() + wait + margin
        try:
            if ticket.unblock is not None:
                self._unblock(ticket)
            while True:
                answered = self._await_answer(ticket, until)
                if answered is not None:
                    break
                again = self._ask_again(ticket, until, multi, release, held, route)
                if not isinstance(again, _Ticket):
                    return again  # granted at the ask: the old ticket left the line
                if again is not ticket:
                    ticket = again  # passed over (it asked too late): in the line again
                    if ticket.unblock is not None:
                        self._unblock(ticket)
        except Cancelled:
            self._give_up(ticket, multi, keep=False)
            raise
        except LockConnectionError:
            answered = True  # the asking connection broke: every ticket of it was told
        except LockError:
            self._give_up(ticket, multi, keep=False)
            raise
        if not answered:
            return self._give_up(ticket, multi, keep=True)
        if ticket.answer is not None:
            if ticket.answer == EXPIRED:
                raise TicketExpired()
            return ticket_answer(ticket.answer, multi)
        # The connections broke: withdrawn; a grant nobody popped is the caller's.
        granted = self._cancel(ticket.name)
        if granted is not None:
            return granted
        raise LockConnectionError("the connection a ticket waited on closed")

    def _ask_again(
        self,
        ticket: _Ticket,
        until: Optional[float],
        multi: bool,
        release: list[Any],
        held: bool,
        route: bytes,
    ) -> Any:
        """A ``redislock`` library's ticket whose time to ask again came: its acquire asked
        again (what is left of the wait): the same ticket (its place kept, ``ask_again_at``
        moved on), another (it had been passed over: in the line again, at the back), or the
        acquire's grant (the old ticket leaves the desk). With no wait left, nothing is asked
        (the wait ends at ``until``). A cancel meanwhile lets the ask finish, then withdraws
        what it got."""
        args = ticket.args
        if until is not None:
            left = until - time.monotonic()
            if left < 0.001:
                ticket.ask_again_at = None
                return ticket
            args = _with_wait(args, left)
        asked = start(self._ask_for(args + ["TICKET"], release, False, again=ticket))
        try:
            return finish(asked)
        except Cancelled:
            finish(start(self._withdraw(asked, multi, release, held, route)))
            raise

    def _await_answer(
        self, ticket: _Ticket, until: Optional[float], own: Optional[OwnConnection] = None
    ) -> Optional[bool]:
        """Waits for ``ticket``'s answer (or its loss) until ``until`` (None: as long as it
        takes): whether it came; None when its acquire is to be asked again first
        (``_Ticket.ask_again_at``, a ``redislock`` library's ticket). Looked at every
        ``HEALTH_PERIOD``: a loop that stalled (``_stalled``) is ended and its waiters told, as
        when its connection breaks (they withdraw their tickets and ask again), so that no wait
        outlives the loop that pops for it; ``own`` (an EPHEMERAL wait's connection) closed
        raises ``LockConnectionError``."""
        while not ticket.event.is_set():
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                return False
            step = HEALTH_PERIOD if left is None else min(HEALTH_PERIOD, left)
            if ticket.ask_again_at is not None:
                due = ticket.ask_again_at - time.monotonic()
                if due <= 0:
                    return None
                step = min(step, due)
            if wait_event(ticket.event, step):
                break
            if own is not None and not own.alive():
                raise LockConnectionError("an EPHEMERAL wait's connection closed")
            if self._stalled(ticket.group):
                self._end_group(ticket.group)
        return True

    def _stalled(self, group: _Slot) -> bool:
        """Whether ``group``'s loop has not begun a round for longer than a round can take."""
        bound = STALL_MARGIN + 4 * self._connector.timeout
        return not group.ended and time.monotonic() - group.alive_at > bound

    def _end_group(self, group: _Slot) -> None:
        """``group``'s loop failed or stalled: its connections broken (a stalled read ends),
        the group forgotten (the next ticket of its slot starts another loop) and each of its
        waiters told, as when its waiting connection breaks."""
        with self._books:
            group.ended = True
            if self._slots.get(group.key) is group:
                del self._slots[group.key]
            lost = list(group.tickets.values())
            group.tickets.clear()
        for waiting in (group.waiting, group.spare):
            if waiting is not None:
                waiting.abort()
        group.wake.set()
        self._tell_lost(lost)

    def _withdraw(
        self, asked: Any, multi: bool, release: list[Any], held: bool, route: bytes
    ) -> bool:
        """After a waiter was cancelled while its acquire was asked: once the ask is answered,
        its ticket is withdrawn, and a grant it got (at once, or by the withdrawal) released
        (awaited by the cancelled waiter, under its handle's gate). False when nothing was
        asked, or the asking connection broke (its tickets went with it)."""
        try:
            got = finish(asked)
        except (LockError, NoTickets, Cancelled):
            return False
        if isinstance(got, _Ticket):
            self._give_up(got, multi, keep=False)
        elif got is not None and not held:
            self._release(route, release)
        return True

    def _ask_for(
        self, args: list[Any], release: list[Any], asking: bool, again: Optional[_Ticket] = None
    ) -> Any:
        """Sends the acquire on the asking connection (as the server's backend takes it): its
        reply, or the ``_Ticket`` it waits with, registered (under the asking connection's
        mutex: an idle desk closes that connection only when no ticket waits). ``again``: the
        ticket this ask is asked again for (``_ask_again``): returned when the server names it
        again, else it leaves the desk."""
        connector = self._connector
        with self._ask_mutex:
            self._closed = False  # a client used again after close() opens them again
            master = connector.current_master()
            if self._ask is not None and master is not None and peer(self._ask) != master:
                self._drop_ask()  # the Sentinels named another master
            if self._ask is None:
                self._ask = connector.new(ASKING_NAME)
            try:
                if asking:
                    call(self._ask, ["ASKING"], connector.timeout)
                sent_as = connector.sent_as(args)
                sent = time.monotonic()
                reply = sent_as.answer(call(self._ask, sent_as.args, connector.timeout))
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
            ask_again = ask_again_of(reply)
            at = None if ask_again is None else sent + ask_again + ASK_AGAIN_MARGIN
            if again is not None:
                if name == again.name:
                    again.ask_again_at = at
                    return again
                self._leave(again)
            if name is None:
                return reply
            ticket = self._register(name, release, own=False, issuer=peer(self._ask))
            ticket.args, ticket.ask_again_at = args[:-1], at
            ticket.untimed = at is not None
            return ticket

    def _leave(self, ticket: _Ticket) -> None:
        """A ticket the server no longer answers (its acquire, asked again, was granted or
        given another): out of its group; an answer popped for it later is dropped."""
        with self._books:
            if ticket.group.tickets.get(ticket.name) is ticket:
                del ticket.group.tickets[ticket.name]

    def _register(
        self, name: bytes, release: list[Any], own: bool, issuer: Optional[tuple[str, int]]
    ) -> _Ticket:
        """A ticket the server issued, given to the ``BLPOP`` of its slot (started if none)."""
        slot = key_slot(name) if self._cluster is not None else None
        with self._books:
            self._closed = False
            group = next(
                (
                    g
                    for g in self._slots.values()
                    if g.slot == slot and not g.ended and len(g.tickets) < TICKETS_PER_CONNECTION
                ),
                None,
            )
            begin = group is None
            if group is None:
                self._started += 1
                group = _Slot(slot, self._started)
                self._slots[group.key] = group
            if not group.tickets:
                group.alive_at = time.monotonic()  # idle until now: no round was due
            ticket = _Ticket(name, release, group)
            ticket.own = own
            ticket.issuer = issuer
            self.issued += 1
            group.tickets[name] = ticket
            if group.blocked:
                ticket.unblock = group.round
            group.wake.set()
        if begin:
            spawn("redis-lock-tickets", self._run, group)
        return ticket

    def wait_own(
        self,
        own: OwnConnection,
        args: list[Any],
        wait: Optional[float],
        multi: bool,
        release: list[Any],
        asking: bool = False,
    ) -> Any:
        """An EPHEMERAL acquire with ``WAIT`` (``args``, without TICKET), asked on ``own``, the
        connection the hold will be bound to (a ticket belongs to the connection that asked:
        the hold is bound to it too); the ticket is popped as any other. The reply the acquire
        without TICKET would have given. ``own`` is looked at every ``HEALTH_PERIOD`` while the
        ticket waits: once it closed, its ticket is void and ``LockConnectionError`` raised (as
        for a blocking EPHEMERAL wait whose connection broke). When the waiting connection
        broke, the ticket is withdrawn and, with no grant in it, asked again on ``own`` (ONCE:
        a grant popped and lost answers with its token). ``NoTickets``: a module without
        TICKET (nothing was asked)."""
        until = None if wait is None else time.monotonic() + wait
        while True:
            try:
                if asking:
                    own.call(["ASKING"], own.timeout)
                reply = own.call(args + ["TICKET"], own.timeout)
            except LockServerError as e:
                if "syntax error" in str(e):
                    self.unsupported = True
                    raise NoTickets() from e
                raise
            name = ticket_of(reply)
            if name is None:
                return reply
            ticket = self._register(name, release, own=True, issuer=peer(own.conn))
            limit = None if until is None else until + WAIT_MARGIN
            try:
                if ticket.unblock is not None:
                    self._unblock(ticket)
                self._await_answer(ticket, limit, own)
            except (LockConnectionError, Cancelled):
                self._give_up(ticket, multi, keep=False)
                raise
            if not ticket.event.is_set():
                return self._give_up(ticket, multi, keep=True)
            if ticket.answer is not None:
                if ticket.answer == EXPIRED:
                    raise TicketExpired()
                return ticket_answer(ticket.answer, multi)
            granted = self._cancel(ticket.name)  # the waiting connection broke
            if granted is not None:
                return granted
            # Asked again on the same connection for what is left of the wait.
            if until is not None:
                left = until - time.monotonic()
                if left <= 0.001:
                    return None
                args = _with_wait(args, left)

    def _unblock(self, ticket: _Ticket) -> None:
        """Interrupts the ``BLPOP`` out when ``ticket`` was issued (it answers nil) so that the
        next one takes the new ticket in; sent again (after 2 ms, doubling up to 100 ms) while
        that ``BLPOP`` has not reached the server yet. ``CLIENT UNBLOCK`` is sent behind a
        write (``Connector.fenced``): a ``BLPOP`` sent during a write pause is postponed
        (it is a write), and unblocking a postponed client kills Redis 7.0 (newer servers
        answer 0); the pause holds the fenced one until it ends, when the ``BLPOP`` is no
        longer postponed. A user refused ``MULTI`` or ``DEL`` never interrupts: the ``BLPOP``
        ends within ``HEALTH_PERIOD``, and the next takes the ticket in."""
        if self._no_interrupt:
            return
        group, at = ticket.group, ticket.unblock
        if group.waiting is not None and group.waiting.id is None:
            return  # no CLIENT ID: the BLPOP ends within HEALTH_PERIOD anyway
        fence = _fence(ticket.name)
        pause = UNBLOCK_RETRY
        until = time.monotonic() + HEALTH_PERIOD
        while True:
            waiting = group.waiting
            if waiting is None:
                return
            try:
                done = waiting.via.fenced(
                    ["CLIENT", "UNBLOCK", waiting.id],
                    fence,
                    asking=self._cluster is not None and not waiting.home,
                )
            except LockServerError as e:
                if "NOPERM" in str(e):
                    self._no_interrupt = True  # an ACL refuses MULTI or DEL: never sent again
                return  # the BLPOP ends within HEALTH_PERIOD anyway
            except LockError:
                return
            with self._books:
                moved_on = group.round != at or not group.blocked
            if done == 1 or moved_on or time.monotonic() >= until:
                return  # past HEALTH_PERIOD, the BLPOP ended by itself
            sleep(pause)
            pause = min(2 * pause, UNBLOCK_RETRY_MAX)

    def _give_up(self, ticket: _Ticket, multi: bool, keep: bool) -> Any:
        """The waiter stops waiting: the ticket is withdrawn (``LOCK.CANCEL``), and a ``BLPOP``
        that may have popped it meanwhile is waited out. ``keep``: a grant got either way is
        the caller's (returned); else it is released. An answer that came first counts as it
        would have."""
        with self._books:
            if ticket.answer is None:
                ticket.abandoned = True
                ticket.last_round = ticket.group.round
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
                if ticket.untimed and ticket.group.blocked:
                    # Nothing will end the BLPOP that may have popped it: interrupted, so that
                    # the wait ends now, not at the BLPOP's own end.
                    ticket.unblock = ticket.last_round
                    self._unblock(ticket)
                wait_event(ticket.event, HEALTH_PERIOD + self._connector.timeout)
                granted = self._granted(ticket, multi, keep)
        if granted is None or keep:
            return granted
        self._release(ticket.name, ticket.release)
        return None

    def _granted(self, ticket: _Ticket, multi: bool, keep: bool) -> Any:
        """The grant popped for ``ticket``, if any (an error popped is raised when ``keep``;
        ``expired`` is none)."""
        if ticket.answer is None or ticket.answer == EXPIRED:
            return None
        try:
            return ticket_answer(ticket.answer, multi)
        except LockError:
            if keep:
                raise
            return None

    def _route(self, key: bytes, args: list[Any]) -> Any:
        """A command on a pooled connection to the node serving ``key`` (in a cluster: routed
        by the client, following MOVED and ASK)."""
        if self._cluster is not None:
            return self._cluster._query(key, args)
        return self._connector.query(args)

    def _cancel(self, name: bytes) -> Any:
        """``LOCK.CANCEL``: nil, or the grant the ticket held (the caller's now)."""
        return self._route(name, ["LOCK.CANCEL", name])

    def _release(self, route: bytes, release: list[Any]) -> None:
        try:
            self._route(route, release)
        except LockError:
            pass  # its lease ends it

    # -- the waiting connections -------------------------------------------------------------

    def _run(self, group: _Slot) -> None:
        """One group's loop (``_loop``). One that fails (an error no round expects) ends its
        group, and its waiters are told, as when its connection breaks: they ask again."""
        try:
            self._loop(group)
        except Cancelled:  # the loop shuts down (asyncio)
            self._end_group(group)
            raise
        except Exception:  # noqa: BLE001 - whatever it was, no waiter may wait on it
            self._end_group(group)
            log.warning("the ticket loop of slot %s failed", group.slot, exc_info=True)
            self._close_idle()

    def _loop(self, group: _Slot) -> None:
        """One group's loop: ``BLPOP`` over its outstanding tickets, each answer to its waiter;
        its connection put back after a round with nothing to wait for, and the group ended
        after ``IDLE`` with nothing to wait for (or once a waiter found it stalled)."""
        checked = time.monotonic()
        # The pops' way through MOVED and ASK (the client's: counted there, as every command's).
        redirects = None if self._cluster is None else self._cluster._redirects()
        refused = 0  # pops refused in a row (TRYAGAIN, another error)
        gone_empty = 0  # pops answered nothing on the node a MOVED named, in a row
        while not group.ended:
            group.alive_at = time.monotonic()
            if refused > 1:
                sleep(SHORT_PERIOD / 2)  # not a spin
            with self._books:
                names = [t.wire for t in group.tickets.values() if not t.abandoned]
                if names:
                    group.round += 1
                    group.blocked = True
                else:
                    group.wake.clear()
                at = group.round
            if not names:
                self._forget_abandoned(group)  # no BLPOP is out
                if self._linger(group):
                    break
                continue
            try:
                waiting = self._waiting_for(group)
                reply = self._pop(group, waiting, names, at)
            except Redirected as e:
                refused = 0
                self._round_read(group, at)
                home = group.waiting is not None and group.waiting.home
                if e.moved and home and self._demoted():
                    self._break_waiting(group)  # its tickets are void: asked again
                    continue
                away = None if redirects is None else redirects.follow_pop(e)
                if away is not None:
                    group.away = away
                    if away[2]:
                        self._slot_left_issuers(group, (away[0], away[1]))
                self._forget_abandoned(group)
                continue
            except LockServerError as e:  # TRYAGAIN: a slot move caught between tickets
                refused += 1
                self._round_read(group, at)
                if is_retry_later(str(e)):
                    group.one_by_one = True
                else:
                    self._break_waiting(group)
                    sleep(SHORT_PERIOD)
                self._forget_abandoned(group)
                continue
            except (LockError, *IO_ERRORS):
                self._break_waiting(group)
                continue
            refused = 0
            if redirects is not None:
                redirects.answered()
            self._round_read(group, at)
            moved_away = self._moved_away(group)
            if isinstance(reply, list) and len(reply) == 2:
                gone_empty = 0
                self._deliver(group, bytes(reply[0]), bytes(reply[1]))
            elif (moved_away or self._any_moved(group)) and (
                gone_empty := gone_empty + 1
            ) >= MOVED_EMPTY_ROUNDS:
                # The slot left the desk's node (or a ticket's issuer): an answer its queue owed
                # moved along (written when the key left), and is not here. Nothing will
                # answer these tickets.
                gone_empty = 0
                if moved_away:
                    self._break_waiting(group)
                else:
                    self._void_moved(group)
                continue
            elif time.monotonic() - checked >= HEALTH_PERIOD:
                checked = time.monotonic()
                self._check_asking()
            self._forget_abandoned(group)
        self._close_idle()

    def _slot_left_issuers(self, group: _Slot, owner: tuple[str, int]) -> None:
        """A ``MOVED`` named ``owner``: the group's tickets another node issued are marked."""
        with self._books:
            for ticket in group.tickets.values():
                if ticket.issuer != owner:
                    ticket.moved = True

    def _any_moved(self, group: _Slot) -> bool:
        with self._books:
            return any(t.moved and not t.abandoned for t in group.tickets.values())

    def _void_moved(self, group: _Slot) -> None:
        """The group's marked tickets (``_Ticket.moved``) found nowhere: each waiter is told, as
        when its connection breaks (it withdraws its ticket, then asks again); the others wait
        on."""
        with self._books:
            lost = [t for t in group.tickets.values() if t.moved and not t.abandoned]
            for ticket in lost:
                del group.tickets[ticket.name]
        self._tell_lost(lost)

    def _moved_away(self, group: _Slot) -> bool:
        """Whether the group pops on another node than the desk's because a ``MOVED`` said so
        (its slot left the desk's node)."""
        away = group.away
        if away is None or not away[2]:
            return False
        home = self._connector.kwargs
        return (away[0], away[1]) != (home.get("host"), home.get("port"))

    def _demoted(self) -> bool:
        """Whether the desk's node is no longer a master (after a ``MOVED`` of a pop there):
        a failover demoted it, and its queues went with its role, so its tickets are never
        answered (a ``BLPOP`` blocked then is answered ``UNBLOCKED``, one the failover's write
        pause postponed is ``MOVED``); a slot moved away instead takes its tickets along."""
        try:
            role = self._connector.query(["ROLE"])
        except LockError:
            return False
        return isinstance(role, list) and bool(role) and role[0] in (b"slave", "slave")

    def _round_read(self, group: _Slot, at: int) -> None:
        with self._books:
            group.blocked = False
            group.read = at

    def _pop(
        self, group: _Slot, waiting: _Waiting, names: list[bytes], at: int
    ) -> Any:
        """One ``BLPOP`` over ``names`` (the tickets' ``wire``s; in a cluster after
        ``ASKING``): its reply, or the server's error raised (``Redirected``, TRYAGAIN)."""
        block = HEALTH_PERIOD
        asked = not waiting.home and group.away is None  # an ASK's target, for one pop
        if group.one_by_one or (asked and len(names) > 1):
            # TRYAGAIN, or a node importing the slot (it refuses a BLPOP naming a ticket it
            # does not have beside others: TRYAGAIN): one ticket at a time, in turn.
            group.one_by_one = False
            names, block = [names[at % len(names)]], SHORT_PERIOD
        elif asked:
            block = SHORT_PERIOD  # the source is popped again soon
        conn, timeout = waiting.conn, self._connector.timeout
        if self._cluster is not None:
            try:
                send(conn, ["ASKING"])
                send_packed(conn, [_blpop(names, block)])
                read(conn, timeout)
            except ResponseError as e:  # the BLPOP's reply would be read as ASKING's
                waiting.abort()
                raise LockConnectionError(f"ASKING: {e}") from e
        else:
            send_packed(conn, [_blpop(names, block)])
        try:
            return read(conn, block + timeout)
        except ResponseError as e:
            raise server_error(e) from None

    def _waiting_for(self, group: _Slot) -> _Waiting:
        """The connection the group's next ``BLPOP`` is sent on: to the desk's node (its own,
        or one put back by another group), or to the node a redirection named."""
        target = group.away
        if target is not None and not target[2]:
            group.away = None  # an ASK: one pop there
        current = group.waiting
        if current is not None and (current.home if target is None else current.at(target)):
            return current
        group.waiting = None
        if current is not None and not current.home:
            if group.spare is not None:
                group.spare.close()
            group.spare = current  # pops alternate between the source and an ASK's target
        elif current is not None:
            self._put_back(current)
        if target is None:
            with self._books:
                waiting = self._idle.pop() if self._idle else None
            if waiting is None:
                waiting = self._open(self._connector, home=True)
        elif group.spare is not None and group.spare.at(target):
            waiting, group.spare = group.spare, None
        else:
            host, port, _ = target
            connector = self._elsewhere(host, port)
            if connector is None:
                group.away = None
                raise LockConnectionError(f"no node at {host}:{port}")
            waiting = self._open(connector, home=False)
        group.waiting = waiting
        return waiting

    def _elsewhere(self, host: str, port: int) -> Optional[Connector]:
        """The connections of the cluster node at ``host``:``port`` (a redirection named it)."""
        if self._cluster is None:
            return None
        node = self._cluster._node_at(host, port)
        return None if node is None else node.commands

    def _open(self, connector: Connector, home: bool) -> _Waiting:
        conn = connector.new(WAITING_NAME)
        try:
            waiting_id: Optional[int] = int(
                call(conn, ["CLIENT", "ID"], connector.timeout)
            )
        except NoPermission:
            # An ACL without CLIENT ID: never interrupted (as without MULTI or DEL), each
            # BLPOP ends within HEALTH_PERIOD and the next takes new tickets in.
            waiting_id = None
        except LockError:
            close_connection(conn)
            raise
        waiting = _Waiting(conn, waiting_id, connector, home)
        if connector.sentinel:  # a master the Sentinels replaced: left at once
            waiting.following = Event()
            spawn("redis-lock-follow", connector.follow, conn, waiting.following)
        return waiting

    def _put_back(self, waiting: _Waiting) -> None:
        """A connection a group no longer needs: kept for another (to the desk's node), else
        closed."""
        if waiting.home and not self._closed:
            waiting.since = time.monotonic()
            with self._books:
                self._idle.append(waiting)
        else:
            waiting.close()

    def _linger(self, group: _Slot) -> bool:
        """A group with nothing to wait for: its connection put back; True once it ended
        (``IDLE`` passed, or the desk closed, with still nothing to wait for)."""
        waiting, group.waiting = group.waiting, None
        spare, group.spare = group.spare, None
        group.away = None
        if waiting is not None:
            self._put_back(waiting)
        if spare is not None:
            spare.close()
        woken = wait_event(group.wake, IDLE)
        group.alive_at = time.monotonic()
        with self._books:
            if group.tickets or (woken and not self._closed):
                return False
            if self._slots.get(group.key) is group:
                del self._slots[group.key]
        return True

    def _deliver(self, group: _Slot, name: bytes, value: bytes) -> None:
        """An answer popped: to its waiter (one that gave up takes it after its LOCK.CANCEL)."""
        with self._books:
            self.answered += 1
            ticket = group.tickets.pop(name, None)
            if ticket is not None:
                ticket.answer = value
        if ticket is not None:
            ticket.event.set()

    def _forget_abandoned(self, group: _Slot) -> None:
        """Tickets given up that no BLPOP out may pop any more: their waiters are told."""
        with self._books:
            done = [
                t for t in group.tickets.values() if t.abandoned and t.last_round <= group.read
            ]
            for ticket in done:
                del group.tickets[ticket.name]
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

    def _break_waiting(self, group: _Slot) -> None:
        """A group's waiting connection broke: an answer it popped may be lost, so each of the
        group's waiters is told (it withdraws its ticket, then asks again)."""
        waiting, group.waiting = group.waiting, None
        if waiting is not None:
            waiting.abort()
        spare, group.spare = group.spare, None
        if spare is not None:
            spare.abort()
        with self._books:
            group.blocked = False
            group.read = group.round
            lost = list(group.tickets.values())
            group.tickets.clear()
        self._tell_lost(lost)

    def _lose_all(self) -> None:
        """Every outstanding ticket the desk's asking connection asked for is told its
        connections broke (an EPHEMERAL wait's ticket belongs to its own connection)."""
        with self._books:
            lost = []
            for group in self._slots.values():
                for ticket in list(group.tickets.values()):
                    if not ticket.own or self._closed:
                        lost.append(ticket)
                        del group.tickets[ticket.name]
        self._tell_lost(lost)

    @staticmethod
    def _tell_lost(lost: list[_Ticket]) -> None:
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
        """After a group ended: the waiting connections unused for ``IDLE`` closed, and with no
        group left and none kept, the asking connection."""
        now = time.monotonic()
        with self._books:
            stale = [w for w in self._idle if self._closed or now - w.since >= IDLE - 0.05]
            self._idle = [w for w in self._idle if w not in stale]
        for waiting in stale:
            waiting.close()
        with self._ask_mutex:
            with self._books:
                idle = not self._slots and not self._idle
            if idle and self._ask is not None:
                close_connection(self._ask)
                self._ask = None

    def close(self) -> None:
        """The client closes: every connection closed (a wait still out asks again on new
        ones, as a blocking wait keeps its connection)."""
        self._closed = True
        with self._books:
            groups = list(self._slots.values())
            kept, self._idle = self._idle, []
        for group in groups:
            for waiting in (group.waiting, group.spare):
                if waiting is not None:
                    waiting.abort()
            group.wake.set()
        for waiting in kept:
            waiting.close()
        with self._ask_mutex:
            if self._ask is not None:
                close_connection(self._ask)
                self._ask = None
            self._lose_all()

    def after_fork(self) -> None:
        """In a forked child: the parent's connections and loop are not the child's."""
        self._books = threading.Lock()
        self._ask_mutex = Mutex()
        self._slots = {}
        self._idle = []
        self._ask = None
