#!/usr/bin/env python3
"""Fails when a paragraph, a list item or a table cell of the user's docs runs over LIMIT words
(`check-prose.py [FILE ...]`; default: README.md, each library's README and docs/*.md). A new
user read paragraphs of 150-400 words as walls (review 4); a fact needing more words gets its own
paragraph, list or table. Code blocks are not counted."""

import re
import sys
from pathlib import Path

LIMIT = 120
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")


def blocks(text: str) -> list[tuple[int, str, str]]:
    """(first line, kind, words) of each paragraph, list item and table cell outside code."""
    found: list[tuple[int, str, str]] = []
    fenced = False
    current: list[str] = []
    start = 0
    kind = "paragraph"

    def close() -> None:
        nonlocal current
        if current:
            found.append((start, kind, " ".join(current)))
        current = []

    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            close()
            continue
        if line.lstrip().startswith("|"):
            close()
            for cell in line.strip().strip("|").split("|"):
                found.append((number, "table cell", cell))
            continue
        if ITEM.match(line):
            close()
            start, kind = number, "list item"
            current = [ITEM.sub("", line)]
            continue
        if not current:
            start, kind = number, "paragraph"
        current.append(line)
    close()
    return found


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    files = [Path(a) for a in sys.argv[1:]] or [
        root / "README.md",
        root / "clients/python/README.md",
        root / "clients/rust/README.md",
        *sorted((root / "docs").glob("*.md")),
    ]
    long = 0
    for path in files:
        for line, kind, words in blocks(path.read_text()):
            count = len(words.split())
            if count > LIMIT:
                long += 1
                print(f"check-prose: {path}:{line}: a {kind} of {count} words (at most {LIMIT})",
                      file=sys.stderr)
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
