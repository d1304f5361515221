"""Generates the sync library from the asyncio one: each module of redis_lock_client/_async/ is
rewritten into redis_lock_client/_sync/ by the renames below (``async def`` → ``def``,
``await x`` → ``x``, ``AsyncLockClient`` → ``LockClient``, ...), except ``_backend.py``, where
the two truly differ (tasks and threads, asyncio's and threading's locks and events,
redis.asyncio's and redis-py's connections): each has its own, by hand, with the same names.

    python clients/python/unasync.py           writes redis_lock_client/_sync/
    python clients/python/unasync.py --check   exit 1 (and says which) when a generated file
                                               differs from what it would write (run-tests.sh)

The idea is httpcore's (its scripts/unasync.py); the rules are this library's.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "redis_lock_client" / "_async"
TARGET = HERE / "redis_lock_client" / "_sync"
HAND_WRITTEN = {"_backend.py"}

RULES = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\baclose\b", "close"),
    (r"\b_Async([A-Z])", r"_\1"),
    (r"\bAsync([A-Z])", r"\1"),
    (r"\bredis\.asyncio\.", "redis."),
    (r"The asyncio library \(the source: ``_sync/`` is generated from it by ``unasync.py``\)",
     "The sync library (threads), generated from ``_async/`` by ``unasync.py``"),
]
COMPILED = [(re.compile(pattern), replacement) for pattern, replacement in RULES]


def header(name: str) -> str:
    return (
        f"# Generated from redis_lock_client/_async/{name} by clients/python/unasync.py:\n"
        f"# edit that file and run the script, not this one.\n"
    )


def unasync(name: str, text: str) -> str:
    for pattern, replacement in COMPILED:
        text = pattern.sub(replacement, text)
    return header(name) + text


def main(argv: list[str]) -> int:
    check = argv[1:] == ["--check"]
    if argv[1:] and not check:
        print(__doc__, file=sys.stderr)
        return 2
    stale = []
    expected = set(HAND_WRITTEN)
    for source in sorted(SOURCE.glob("*.py")):
        if source.name in HAND_WRITTEN:
            continue
        expected.add(source.name)
        out = unasync(source.name, source.read_text())
        target = TARGET / source.name
        if target.exists() and target.read_text() == out:
            continue
        if check:
            stale.append(source.name)
        else:
            TARGET.mkdir(exist_ok=True)
            target.write_text(out)
            print(f"unasync: wrote {target.relative_to(HERE)}")
    for extra in sorted(TARGET.glob("*.py")):
        if extra.name not in expected:
            if check:
                stale.append(f"{extra.name} (no source in _async/)")
            else:
                extra.unlink()
                print(f"unasync: removed {extra.relative_to(HERE)}")
    if stale:
        print(
            "unasync: redis_lock_client/_sync/ is stale for "
            + ", ".join(stale)
            + ": run `python clients/python/unasync.py`",
            file=sys.stderr,
        )
        return 1
    if check:
        print("unasync: redis_lock_client/_sync/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
