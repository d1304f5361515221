"""A few lines of test harness shared by the Python client tests (no pytest needed).

Each case prints `ok - name` or `not ok - name: why`; run.sh counts them. The servers come
from the environment: LOCK_HOST, LOCK_PORT (standalone) and LOCK_CLUSTER (comma-separated
master ports of a 3-master cluster).
"""

import os
import sys
import time
import traceback

HOST = os.environ.get("LOCK_HOST", "127.0.0.1")
PORT = int(os.environ.get("LOCK_PORT", "6379"))
CLUSTER = [int(p) for p in os.environ.get("LOCK_CLUSTER", "").split(",") if p]

_cases = []


def case(fn):
    _cases.append(fn)
    return fn


def run():
    failed = 0
    only = sys.argv[1:]
    for fn in _cases:
        if only and fn.__name__ not in only:
            continue
        name = fn.__name__.replace("_", " ")
        try:
            fn()
            print(f"ok - {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported the same way
            failed += 1
            detail = traceback.format_exc().strip().splitlines()
            print(f"not ok - {name}: {type(e).__name__}: {e}", flush=True)
            for line in detail[-6:]:
                print(f"    {line}", flush=True)
    sys.exit(1 if failed else 0)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Clock:
    """Seconds since creation."""

    def __init__(self):
        self.start = time.monotonic()

    def elapsed(self):
        return time.monotonic() - self.start


def unique(prefix):
    return f"{prefix}:{os.getpid()}:{time.monotonic_ns()}"
