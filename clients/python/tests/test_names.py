"""The library's connections carry a name (CLIENT SETNAME) and, where the server has CLIENT
SETINFO (Redis >= 7.2, Valkey), the library in lib-name: CLIENT LIST shows which connection
holds an EPHEMERAL hold, or waits for a lock, and whose it is."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from conftest import Server, info, wait_until
from redis_lock_client import AsyncLockClient, LockClient, __version__


def clients(server: Server) -> dict[str, dict[str, str]]:
    """CLIENT LIST, by connection id."""
    out = {}
    for line in server.client().execute_command("CLIENT", "LIST").decode().splitlines():
        entry = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
        out[entry["id"]] = entry
    return out


def has_setinfo(server: Server) -> bool:
    try:
        server.client().execute_command("CLIENT", "SETINFO", "LIB-NAME", "probe")
        return True
    except redis.ResponseError:
        return False


@pytest.mark.scenario("connection-names")
def test_every_connection_is_named_and_an_ephemeral_holds_connection_names_its_owner(server, key):
    with LockClient.from_url(server.url) as client:
        lock = client.lock(key, ephemeral=True)
        guard = lock.acquire()
        conn = clients(server)[str(info(server, key)[b"ephemeral"])]  # LOCK.INFO's id
        assert conn["name"] == "redis-lock-client:" + guard.owner.decode()
        lib = f"redis-py(redis-lock-client_v{__version__})"
        if has_setinfo(server):
            assert conn["lib-name"] == lib
        # The pool's and the signal listener's connections: the library's name, no owner.
        mine = [c for c in clients(server).values() if c["name"].startswith("redis-lock-client")]
        assert {c["name"] for c in mine} == {"redis-lock-client", conn["name"]}
        assert any(c["cmd"] in ("subscribe", "ssubscribe") for c in mine)
        # The waits: a ticket asked on one connection and popped on another, named for it.
        waiter = client.lock(key, wait_timeout=10)
        waiting = threading.Thread(target=lambda: waiter.acquire().release(), daemon=True)
        waiting.start()
        popping = lambda: [c for c in clients(server).values() if c["cmd"] == "blpop"]  # noqa: E731
        wait_until(popping, "the wait's ticket is popped")
        (blpop,) = popping()
        assert blpop["name"] == "redis-lock-client:tickets-wait"
        names = {c["name"] for c in clients(server).values()}
        assert "redis-lock-client:tickets-ask" in names
        guard.release()
        waiting.join(5)
    # A blocking wait (wait_with_tickets=False), on a connection of its own, named for its owner.
    with LockClient.from_url(server.url, wait_with_tickets=False) as client:
        guard = client.lock(key).acquire()
        waiter = client.lock(key, wait_timeout=10)
        waiting = threading.Thread(target=lambda: waiter.acquire().release(), daemon=True)
        waiting.start()
        wait_until(lambda: server.blocked_clients("lock.acquire"), "the wait is in the server")
        (blocked,) = server.blocked_clients("lock.acquire")
        assert blocked["name"] == "redis-lock-client:" + waiter.owner.decode()
        guard.release()
        waiting.join(5)


@pytest.mark.scenario("connection-names")
def test_a_name_the_application_gave_its_connections_is_kept(server, key):
    app = redis.Redis(host="127.0.0.1", port=server.port, client_name="billing")
    with LockClient(app) as client:
        guard = client.lock(key, ephemeral=True, owner=b"billing worker 7").acquire()
        conn = clients(server)[str(info(server, key)[b"ephemeral"])]
        assert conn["name"] == "billing:billing?worker?7"  # a name holds no spaces
        guard.release()


@pytest.mark.scenario("connection-names")
def test_async_connections_are_named_alike(server, key):
    async def main() -> None:
        async with AsyncLockClient.from_url(server.url) as client:
            guard = await client.lock(key, ephemeral=True).acquire()
            conn = clients(server)[str(info(server, key)[b"ephemeral"])]
            assert conn["name"] == "redis-lock-client:" + guard.owner.decode()
            if has_setinfo(server):
                assert conn["lib-name"] == f"redis-py(redis-lock-client_v{__version__})"
            await guard.release()
    asyncio.run(main())
