#!/usr/bin/env python3
"""Writes (or, with --check, checks) the table of slot tags inside functions/redislock.lua.

The module names the fencing-token counter of cluster slot s `__lock_fence__{<tag>}`, where
<tag> is the first string of a fixed enumeration (base-36 digits `0-9a-z`, length 1 to 4, in
counting order) whose CRC16 hashes to s (core/src/slot.rs `slot_tags`). A Lua function cannot
afford that enumeration per call (up to about 200,000 CRCs) nor at load (Redis gives a library's
load 500 ms), so the library carries the result: 16,384 tags, each padded to four characters
with '.', 64 to a line, between the BEGIN/END SLOT TAGS markers.

    python3 functions/slot-tags.py          # rewrite the table in place
    python3 functions/slot-tags.py --check  # exit 1 if the table is not what the rule gives
"""

from __future__ import annotations

import sys
from pathlib import Path

SLOTS = 16384
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
LIBRARY = Path(__file__).resolve().parent / "redislock.lua"
BEGIN = "-- BEGIN SLOT TAGS (functions/slot-tags.py writes this block)\n"
END = "-- END SLOT TAGS\n"


def _crc16_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ b) & 0xFF]
    return crc


def key_slot(key: bytes) -> int:
    """The cluster slot of a key, hash tags honoured as Redis does."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key) & (SLOTS - 1)


def slot_tags() -> list[str]:
    """core/src/slot.rs `slot_tags`, step for step: the first tag found for each slot."""
    tags: list[str | None] = [None] * SLOTS
    missing = SLOTS
    for length in range(1, 5):
        for n in range(36**length):
            digits = []
            for _ in range(length):
                digits.append(DIGITS[n % 36])
                n //= 36
            tag = "".join(reversed(digits))
            slot = crc16(tag.encode()) & (SLOTS - 1)
            if tags[slot] is None:
                tags[slot] = tag
                missing -= 1
                if missing == 0:
                    return [t for t in tags if t is not None]
    raise AssertionError("some slot has no tag of at most four characters")


def block() -> str:
    cells = [t.ljust(4, ".") for t in slot_tags()]
    lines = ["".join(cells[i : i + 64]) for i in range(0, SLOTS, 64)]
    return BEGIN + "local SLOT_TAGS = [[\n" + "\n".join(lines) + "\n]]\n" + END


def main() -> int:
    text = LIBRARY.read_text()
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        print(f"{LIBRARY}: the SLOT TAGS markers are missing", file=sys.stderr)
        return 1
    new = head + block() + tail
    if sys.argv[1:] == ["--check"]:
        if new != text:
            print(f"{LIBRARY}: the slot tags are not the module's; run {sys.argv[0]}", file=sys.stderr)
            return 1
        return 0
    LIBRARY.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
