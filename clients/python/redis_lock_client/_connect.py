"""How the library's own connections are made from what the application gave it (no I/O).

Every connection the library opens uses the application's address, credentials and TLS, with the
library's own settings on top: RESP2, bytes replies, its own read timeout, no retries of
redis-py's (the library decides what may be sent again: only an acquire, which carries ONCE), a
client name (``CLIENT SETNAME``) and the library in ``CLIENT SETINFO LIB-NAME``.
"""

from __future__ import annotations

from typing import Any, Optional

from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import AskError, MovedError, NoPermissionError, ResponseError
from redis.retry import Retry

from ._common import CLIENT_NAME, LockServerError, NoPermission, __version__

# Settings of the application's client that the library replaces with its own.
_REPLACED = (
    "socket_timeout",
    "retry",
    "retry_on_timeout",
    "retry_on_error",
    "decode_responses",
    "protocol",
    "health_check_interval",
    "redis_connect_func",
    "driver_info",
    "lib_name",
    "lib_version",
)
# Settings redis-py's pool adds for itself (RESP3 maintenance notifications, originals).
_POOL_OWN_PREFIXES = ("maint_notifications", "orig_")


def driver_info() -> DriverInfo:
    """``CLIENT SETINFO LIB-NAME redis-py(redis-lock-client_v<version>)`` and ``LIB-VER <redis-py's
    version>`` (the convention for a library on top of a client; servers before Redis 7.2 have
    no CLIENT SETINFO, and redis-py then sends nothing)."""
    return DriverInfo().add_upstream_driver("redis-lock-client", __version__)


def own_kwargs(connection_kwargs: dict[str, Any], command_timeout: float) -> dict[str, Any]:
    kwargs = {
        k: v
        for k, v in connection_kwargs.items()
        if k not in _REPLACED and not k.startswith(_POOL_OWN_PREFIXES)
    }
    kwargs["socket_timeout"] = command_timeout
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["decode_responses"] = False
    kwargs["protocol"] = 2
    kwargs["driver_info"] = driver_info()
    kwargs["client_name"] = kwargs.get("client_name") or CLIENT_NAME
    kwargs.setdefault("socket_connect_timeout", command_timeout)
    return kwargs


def name_for(base: str, owner: bytes) -> str:
    """The name of a connection bound to ``owner`` (a wait, an EPHEMERAL hold):
    ``<base>:<owner>``, each byte a name cannot hold (a space, a control, a non-ASCII byte)
    written ``?``."""
    shown = "".join(chr(b) if 0x21 <= b <= 0x7E else "?" for b in owner)
    return f"{base}:{shown}"


class Redirected(LockServerError):
    """MOVED or ASK: in a cluster, the key's slot is served by another node. ``asking``: an ASK
    (the slot is being moved: send ``ASKING`` and the command to ``host``:``port`` once);
    else a MOVED (``host``:``port`` serves ``slot`` now: send the command there, and reload
    the slot map)."""

    def __init__(
        self,
        line: str,
        asking: bool,
        host: Optional[str],
        port: Optional[int],
        slot: Optional[int] = None,
    ) -> None:
        super().__init__(line)
        self.asking = asking
        self.host = host
        self.port = port
        self.slot = slot

    @property
    def moved(self) -> bool:
        """A MOVED: the slot moved for good (not an ASK: still moving), so the node that
        answered no longer serves it."""
        return not self.asking


def server_error(e: ResponseError, command: Any = None) -> LockServerError:
    """The server's own error line (redis-py strips known codes such as ERR; put it back); a
    refusal of the ACL (``NOPERM``) as ``NoPermission``, named after ``command`` (the command
    sent) when the line names none."""
    code: Optional[str] = getattr(e, "status_code", None)
    text = str(e)
    line = f"{code} {text}" if code else text
    if isinstance(e, NoPermissionError) or line.startswith("NOPERM"):
        if not line.startswith("NOPERM"):
            line = f"NOPERM {line}"
        name = command.decode() if isinstance(command, bytes) else str(command or "")
        return NoPermission(line, name)
    if isinstance(e, AskError):  # MovedError is an AskError
        host = getattr(e, "host", None)
        port = getattr(e, "port", None)
        slot = str(getattr(e, "slot_id", ""))
        return Redirected(
            line,
            asking=not isinstance(e, MovedError),
            host=host if isinstance(host, str) else None,
            port=port if isinstance(port, int) else None,
            slot=int(slot) if slot.isdigit() else None,
        )
    return LockServerError(line)


def redirected(line: str) -> Optional[Redirected]:
    """``ASK <slot> <host:port>`` or ``MOVED <slot> <host:port>`` (an error line, as a ticket
    holds it) as ``Redirected``; None for any other line."""
    parts = line.split(" ")
    if len(parts) != 3 or parts[0] not in ("ASK", "MOVED"):
        return None
    host, _, port = parts[2].rpartition(":")
    return Redirected(
        line,
        asking=parts[0] == "ASK",
        host=host or None,
        port=int(port) if port.isdigit() else None,
        slot=int(parts[1]) if parts[1].isdigit() else None,
    )
