"""What must be disarmed in a forked child (``os.fork``, ``multiprocessing`` with fork): holds,
handles, clients and listeners register here, and each one's ``after_fork()`` runs in the child
right after the fork."""

from __future__ import annotations

import os
import weakref
from typing import Any, Protocol


class Forkable(Protocol):
    def after_fork(self) -> None: ...


_forkable: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register(obj: Forkable) -> None:
    _forkable.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_forkable):
        obj.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
