"""Which master to follow among the Sentinels' answers (no I/O): the one named with the highest
configuration epoch, and never another one named with a lower epoch than the master followed
already (that one stays; once a majority of the Sentinels has named it at a lower epoch for
``EPOCH_RESET_GRACE``, its epoch comes down to theirs).

Every failover raises the epoch; a Sentinel that has not heard of the latest one still names the
old master (which answers as a master for seconds after ``SENTINEL FAILOVER``), with an older
epoch. A Sentinel set re-created from scratch starts its epochs again from 0: a client that held
on to the highest epoch it followed would never follow their failovers. So a majority naming the
followed master itself at a lower epoch for ``EPOCH_RESET_GRACE`` brings the epoch down (a lag
lasts a few 2 s hello periods). A lower epoch never moves the client to another master, even
from a majority: Sentinels cut off with a master that was replaced name it at its old epoch for
as long as the partition lasts. Both flavours of ``_backend.py`` ask every Sentinel and pass the
answers here.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from redis.exceptions import NoPermissionError

from . import _fork
from ._connect import server_error

#: A master's (host, port).
Address = tuple[str, int]

#: How long a majority of the Sentinels must name the followed master at a lower epoch, none at
#: the followed one or above, before the client takes the set for re-created (its epochs
#: started again) and lowers the followed epoch to theirs (seconds). A failover's epoch reaches
#: every Sentinel within a few 2 s hello periods; the Rust library waits as long
#: (``EPOCH_RESET_GRACE``).
EPOCH_RESET_GRACE = 10.0


class FollowedMasters:
    """The master followed per service, with the epoch it was named with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._followed: dict[str, tuple[int, Address]] = {}
        #: Since when a majority of the Sentinels has named only epochs below the followed one.
        self._below_since: dict[str, float] = {}
        _fork.register(self)

    def choose(
        self,
        service_name: str,
        answers: list[tuple[int, Address]],
        majority_answered: bool = False,
        newest_heard: int = 0,
        now: Optional[float] = None,
    ) -> Optional[Address]:
        """The master to follow, given the answers ``(epoch, address)`` of the Sentinels that
        named a usable master, in the order the Sentinels were given; None when there is none.
        The highest epoch wins (a tie: the master followed already if one of them names it,
        else the first). An answer with an epoch below the followed one's never moves the
        client to another master: the followed one stays (a lagging Sentinel, or a majority of
        them cut off with the old master, would lead it back to a master the others demoted).
        Named so at a lower epoch, the followed master itself is still followed, and once a
        majority of the Sentinels has done so for ``EPOCH_RESET_GRACE`` with none at the
        followed epoch or above (a Sentinel set re-created from scratch, its epochs started
        again), the followed epoch comes down to theirs, so that their next failover is
        followed. ``majority_answered``: a majority of the Sentinels answered this time;
        ``newest_heard``: the highest epoch any of them gave, a master flagged down included;
        ``now``: ``time.monotonic()``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            followed = self._followed.get(service_name)
            if not answers:
                if followed is not None and newest_heard >= followed[0]:
                    self._below_since.pop(service_name, None)
                return None
            epoch = max(e for e, _ in answers)
            named = [address for e, address in answers if e == epoch]
            if followed is not None:
                followed_epoch, followed_address = followed
                if epoch < followed_epoch:
                    lowering = (
                        followed_address in named
                        and majority_answered
                        and newest_heard < followed_epoch
                    )
                    if not lowering:
                        self._below_since.pop(service_name, None)
                        return followed_address
                    since = self._below_since.setdefault(service_name, now)
                    if now - since < EPOCH_RESET_GRACE:
                        return followed_address
                    named = [followed_address]  # the floor comes down, on the same master
                elif epoch == followed_epoch and followed_address in named:
                    self._below_since.pop(service_name, None)
                    return followed_address
            self._below_since.pop(service_name, None)
            self._followed[service_name] = (epoch, named[0])
            return named[0]

    def pick(
        self,
        service_name: str,
        asked: list[tuple[object, object]],
        usable: Callable[[dict[str, Any]], bool],
        force_ip: Optional[str],
        not_found: type[Exception],
    ) -> Address:
        """The master to follow, from ``asked``: each Sentinel with its answer to ``SENTINEL
        MASTER <name>`` or the error it gave (``named_master`` reads each answer). Raises
        ``not_found`` (the flavour's ``MasterNotFoundError``) as redis-py does when no Sentinel
        names a usable master; ``NoPermission`` (naming ``SENTINEL|MASTER``) when none did and
        a Sentinel's ACL refused the lookup."""
        named = []
        for _, answer in asked:
            found = named_master(answer, usable, force_ip)
            if found is not None:
                named.append(found)
        # Answers that name a master at an epoch, flagged down or not (as the Rust library
        # counts them): one without an epoch says nothing about the set's epochs.
        heard = [
            found[0]
            for _, answer in asked
            if (found := named_master(answer, lambda _: True, force_ip)) is not None
        ]
        chosen = self.choose(
            service_name,
            named,
            len(heard) >= majority(len(asked)),
            max(heard, default=0),
        )
        if chosen is None:
            refused = [a for _, a in asked if isinstance(a, NoPermissionError)]
            if refused and not named:
                # Every Sentinel that answered refused (an ACL without +sentinel|master): the
                # refusal, named, not "no master".
                raise server_error(refused[0], "SENTINEL")
            errors = [f"{s} - {a!r}" for s, a in asked if isinstance(a, Exception)]
            detail = f" : {', '.join(errors)}" if errors else ""
            raise not_found(f"No master found for {service_name!r}{detail}")
        return chosen

    def after_fork(self) -> None:
        """In a forked child: a lock the parent held at the fork is not held here."""
        self._lock = threading.Lock()


#: How long the Sentinels not yet heard from are waited for once a majority answered (seconds).
STRAGGLER_GRACE = 0.1


def with_current_address(state: object, address: object) -> object:
    """A Sentinel's ``SENTINEL MASTER`` answer with the address its ``GET-MASTER-ADDR-BY-NAME``
    gives: the Sentinel leading a failover reports the new epoch with the old address in
    ``SENTINEL MASTER`` until every replica is reconfigured, while ``GET-MASTER-ADDR-BY-NAME``
    already names the promoted replica. An error stays the error; no address (nil, or anything
    else): None, no view."""
    if not isinstance(state, dict):
        return state
    if not (isinstance(address, (list, tuple)) and len(address) == 2):
        return None
    host, port = address
    host = host.decode() if isinstance(host, bytes) else host
    port = port.decode() if isinstance(port, bytes) else port
    return {**state, "ip": str(host), "port": str(port)}


def majority(sentinels: int) -> int:
    """How many answers make a majority of ``sentinels``."""
    return sentinels // 2 + 1


def named_master(
    answer: object, usable: Callable[[dict[str, Any]], bool], force_ip: Optional[str]
) -> Optional[tuple[int, Address]]:
    """A Sentinel's answer to ``SENTINEL MASTER <name>`` (as redis-py parses it) as
    ``(epoch, address)``; None for an error, an answer without a ``config-epoch`` (it cannot
    be ranked) or a malformed one, or a master ``usable`` refuses (redis-py's
    ``check_master_state``: one flagged down, or a Sentinel seeing too few others).
    ``force_ip``: the host to use whatever the Sentinel says (redis-py's ``force_master_ip``)."""
    if not isinstance(answer, dict):
        return None
    try:
        if not usable(answer):
            return None
        epoch = int(answer["config-epoch"])  # none: no view, as in the Rust library
        if epoch < 0:
            return None
        address = (str(force_ip if force_ip is not None else answer["ip"]), int(answer["port"]))
    except (KeyError, TypeError, ValueError):
        return None
    return epoch, address
