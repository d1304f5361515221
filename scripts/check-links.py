#!/usr/bin/env python3
"""Fails when a relative link of a Markdown file under DIR points at a file or folder that is not
there: `check-links.py DIR` (scripts/dist.sh runs it on the module tarball's contents before
packing them). Links with a scheme (https:, mailto:) and links inside a page (#...) are not
checked; an anchor after a path is dropped, and the path checked. Code blocks and code spans are
skipped (a `](x)` in a transcript is no link)."""

import re
import sys
from pathlib import Path

LINK = re.compile(r"\]\(([^)\s]+)\)")


def links(text: str) -> list[tuple[int, str]]:
    found = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        found += [(number, m.group(1)) for m in LINK.finditer(line)]
    return found


def main() -> int:
    root = Path(sys.argv[1]).resolve()
    broken = []
    for page in sorted(root.rglob("*.md")):
        for number, target in links(page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            resolved = (page.parent / path).resolve()
            if not resolved.exists() or not resolved.is_relative_to(root):
                broken.append(f"{page.relative_to(root)}:{number}: {target}")
    for line in broken:
        print(f"check-links: no such file in {root.name}: {line}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
