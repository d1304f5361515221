"""How the library is laid out, where a rule of its shape can be checked by reading it: every
MOVED and ASK is followed in one place, the client's ``Redirects`` (``_client.py``)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "redis_lock_client"

#: What following a redirect takes: where it sends the next command (the node it names, whether
#: after ASKING) and the count of redirects in a row. Outside the client's ``Redirects``, code
#: may recognise a redirect (``Redirected``, ``.moved``) and send ASKING where it was told to,
#: never follow one itself.
FOLLOWING = (
    "._redirect(",
    "._node_to(",
    "._moved(",
    "e.host",
    "e.port",
    "e.asking",
    "ask.host",
    "redirected +=",
    "WAIT_REDIRECTS if this_waits",
)


def test_redirects_are_followed_in_the_client_only():
    files = sorted(PACKAGE.glob("_async/*.py")) + sorted(PACKAGE.glob("_sync/*.py"))
    assert len(files) > 10, "the sources were found"
    outside = []
    for path in files:
        if path.name == "_client.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(f in code for f in FOLLOWING):
                outside.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert not outside, "redirects followed outside _client.py:\n" + "\n".join(outside)
