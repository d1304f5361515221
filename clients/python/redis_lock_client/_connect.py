"""How the library's own connections are made from what the application gave it.

Every connection the library opens uses the application's address, credentials and TLS, with the
library's own settings on top: RESP2, bytes replies, its own read timeout, and no retries of
redis-py's (the library decides what may be sent again: only an acquire, which carries ONCE).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from redis.backoff import NoBackoff
from redis.exceptions import AskError, ResponseError
from redis.retry import Retry

from ._common import LockServerError

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
)
# Settings redis-py's pool adds for itself (RESP3 maintenance notifications, originals).
_POOL_OWN_PREFIXES = ("maint_notifications", "orig_")


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
    kwargs.setdefault("socket_connect_timeout", command_timeout)
    return kwargs


class Redirected(LockServerError):
    """MOVED or ASK: in a cluster, the key's slot is served by another node. The library
    refreshes its slot map and sends the command again (to the node that now serves the key)."""


def server_error(e: ResponseError) -> LockServerError:
    """The server's own error line (redis-py strips known codes such as ERR; put it back)."""
    code: Optional[str] = getattr(e, "status_code", None)
    text = str(e)
    line = f"{code} {text}" if code else text
    if isinstance(e, AskError):
        return Redirected(line)
    return LockServerError(line)


class RawConnection(Protocol):
    """The part of redis-py's (untyped) Connection the sync library uses."""

    def connect(self) -> None: ...
    def send_command(self, *args: Any, check_health: bool = True) -> None: ...
    def read_response(self, disable_decoding: bool = False, *, timeout: Any = ...) -> Any: ...
    def can_read(self, timeout: float = 0) -> bool: ...
    def disconnect(self, *args: Any) -> None: ...
