"""valkey-glide 2 (Python, asyncio) against LOCK.*: what docs/clients.md says about it.

Defaults: RESP3, request_timeout 250 ms, and a timed-out request leaves the connection open.
The safe setting on the client that sends WAIT: request_timeout above the WAIT.
"""

import asyncio

from glide import (
    GlideClient,
    GlideClientConfiguration,
    GlideClusterClient,
    GlideClusterClientConfiguration,
    NodeAddress,
    ProtocolVersion,
)
from glide import Logger, LogLevel
from glide import TimeoutError as GlideTimeoutError

from harness import CLUSTER, HOST, PORT, Clock, case, check, run, unique


# Quiet glide's own log (it warns on stderr at every request timeout); not a behaviour setting.
Logger.set_logger_config(LogLevel.ERROR)


async def client(**config):
    return await GlideClient.create(GlideClientConfiguration([NodeAddress(HOST, PORT)], **config))


async def lock_stats(c):
    text = await c.custom_command(["INFO", "lock"])
    text = text.decode() if isinstance(text, bytes) else text
    return {
        k: int(v)
        for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)
        if v.strip().lstrip("-").isdigit()
    }


def sync(fn):
    """Runs an async case."""

    def wrapper():
        asyncio.run(fn())

    wrapper.__name__ = fn.__name__
    return wrapper


@case
@sync
async def acquire_renew_info_release_RESP3_default():
    c = await client()
    key = unique("glide:basic")
    token = await c.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000"])  # int or None
    check(isinstance(token, int) and token > 0, f"token {token!r}")
    check(await c.custom_command(["LOCK.ACQUIRE", key, "worker-2", "30000"]) is None, "busy")
    check(await c.custom_command(["LOCK.RENEW", key, "worker-1", "30000"]) == 1, "renew")
    info = await c.custom_command(["LOCK.INFO", key])
    check(isinstance(info, dict), f"shape {info!r}")
    check(info[b"owner"] == b"worker-1" and info[b"count"] == 1 and info[b"token"] == token, f"{info!r}")
    check(info[b"waiters"] == 0 and 0 < info[b"ttl"] <= 30000, f"{info!r}")
    check(await c.custom_command(["LOCK.RELEASE", key, "worker-1"]) == 0, "release")
    check(await c.custom_command(["LOCK.INFO", key]) is None, "free")
    await c.close()


@case
@sync
async def LOCK_INFO_under_RESP2_is_a_flat_list():
    c = await client(protocol=ProtocolVersion.RESP2)
    key = unique("glide:resp2")
    token = await c.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000"])
    info = await c.custom_command(["LOCK.INFO", key])
    check(isinstance(info, list) and info[0::2] == [b"owner", b"count", b"ttl", b"token", b"ephemeral", b"waiters", b"mode", b"holders"], f"{info!r}")
    check(info[1] == b"worker-1" and info[7] == token, f"{info!r}")
    await c.custom_command(["LOCK.RELEASE", key, "worker-1"])
    await c.close()


@case
@sync
async def defaults_time_out_at_250ms_and_keep_the_connection_so_the_abandoned_waiter_is_granted():
    admin = await client()
    key = unique("glide:defaults")
    await admin.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000"])
    before = await lock_stats(admin)
    c = await client()
    clock = Clock()
    try:
        await c.custom_command(["LOCK.ACQUIRE", key, "worker-2", "1500", "WAIT", "5000"])
        raise AssertionError("expected a timeout")
    except GlideTimeoutError:
        pass
    check(0.2 < clock.elapsed() < 1, f"gave up after {clock.elapsed():.2f}s (request_timeout 250 ms)")
    check((await admin.custom_command(["LOCK.INFO", key]))[b"waiters"] == 1, "still queued on the server")
    await admin.custom_command(["LOCK.RELEASE", key, "worker-1"])
    info = await admin.custom_command(["LOCK.INFO", key])
    check(info[b"owner"] == b"worker-2", f"granted to the caller that gave up: {info!r}")
    check(await c.custom_command(["PING"]) == b"PONG", "the client goes on (its replies stay matched)")
    d = await lock_stats(admin)
    check(d["lock_waits_started"] - before["lock_waits_started"] == 1, "sent once")
    await asyncio.sleep(1.7)
    check(await admin.custom_command(["LOCK.INFO", key]) is None, "held until its 1500 ms lease ended")
    await c.close()
    await admin.close()


@case
@sync
async def request_timeout_above_the_WAIT_granted_returns_the_token_timeout_None():
    admin = await client()
    key = unique("glide:wait")
    first = await admin.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000"])
    waiter = await client(request_timeout=15000)  # above the longest WAIT it sends

    async def release_soon():
        await asyncio.sleep(0.6)
        await admin.custom_command(["LOCK.RELEASE", key, "worker-1"])

    task = asyncio.create_task(release_soon())
    token = await waiter.custom_command(["LOCK.ACQUIRE", key, "worker-2", "30000", "WAIT", "10000"])
    await task
    check(isinstance(token, int) and token > first, f"granted {token!r} after {first} (0.6 s > 250 ms)")
    check(await waiter.custom_command(["LOCK.RELEASE", key, "worker-2"]) == 0, "release")
    await admin.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000"])
    clock = Clock()
    reply = await waiter.custom_command(["LOCK.ACQUIRE", key, "worker-2", "30000", "WAIT", "1000"])
    check(reply is None and 0.9 < clock.elapsed() < 2, f"{reply!r} after {clock.elapsed():.2f}s")
    await admin.custom_command(["LOCK.RELEASE", key, "worker-1"])
    await waiter.close()
    await admin.close()


@case
@sync
async def on_a_client_side_timeout_close_the_client_and_the_waiter_leaves_the_queue():
    admin = await client()
    key = unique("glide:close")
    await admin.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000"])
    c = await client()
    try:
        await c.custom_command(["LOCK.ACQUIRE", key, "worker-2", "30000", "WAIT", "5000"])
        raise AssertionError("expected a timeout")
    except GlideTimeoutError:
        await c.close()
    await asyncio.sleep(0.2)
    check((await admin.custom_command(["LOCK.INFO", key]))[b"waiters"] == 0, "no waiter left")
    check(await admin.custom_command(["LOCK.RELEASE", key, "worker-1"]) == 0, "release")
    check(await admin.custom_command(["LOCK.INFO", key]) is None, "nobody was granted")
    await admin.close()


# EPHEMERAL: a GlideClient is one connection, and glide reconnects it by itself after a drop:
# the next command runs on the new connection, and only LOCK.RENEW's 0 tells the hold is gone.
# Its request timeouts keep the connection, so they do not end a hold; close() does.
@case
@sync
async def EPHEMERAL_renewals_and_a_request_timeout_on_a_dedicated_client_keep_the_hold_a_drop_reconnects_silently_close_ends_it():
    admin = await client()
    holder = await client()
    key = unique("glide:ephemeral")
    await holder.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000", "EPHEMERAL"])
    client_id = await holder.custom_command(["CLIENT", "ID"])
    for _ in range(3):
        await asyncio.sleep(0.2)
        check(await holder.custom_command(["LOCK.RENEW", key, "worker-1", "30000"]) == 1, "renewed")
    # A request timeout (250 ms by default) on the holder keeps its connection, and the hold.
    busy = unique("glide:ephemeral-busy")
    await admin.custom_command(["LOCK.ACQUIRE", busy, "other", "30000"])
    try:
        await holder.custom_command(["LOCK.ACQUIRE", busy, "worker-1", "30000", "WAIT", "600"])
        raise AssertionError("expected a request timeout")
    except GlideTimeoutError:
        pass
    await asyncio.sleep(0.6)  # the abandoned WAIT gives up on the server
    info = await admin.custom_command(["LOCK.INFO", key])
    check(info[b"ephemeral"] == client_id, f"held on the holder's connection {client_id}: {info!r}")
    check(await holder.custom_command(["CLIENT", "ID"]) == client_id, "the same connection")
    await admin.custom_command(["LOCK.FORCERELEASE", busy])
    await admin.custom_command(["CLIENT", "KILL", "ID", str(client_id)])
    await asyncio.sleep(0.3)
    check(await admin.custom_command(["LOCK.INFO", key]) is None, "gone with the connection")
    renewed = await holder.custom_command(["LOCK.RENEW", key, "worker-1", "30000"])
    check(renewed == 0, f"no error: the renewal ran on a new connection and answers 0: {renewed!r}")
    check(await holder.custom_command(["CLIENT", "ID"]) != client_id, "a new connection")
    key = unique("glide:ephemeral-close")
    await holder.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000", "EPHEMERAL"])
    await holder.close()
    await asyncio.sleep(0.1)
    check(await admin.custom_command(["LOCK.INFO", key]) is None, "close() ended the hold")
    await admin.close()


async def moved_per_node():
    out = {}
    for port in CLUSTER:
        c = await GlideClient.create(GlideClientConfiguration([NodeAddress(HOST, port)]))
        text = (await c.custom_command(["INFO", "errorstats"])).decode()
        out[port] = sum(
            int(line.split("count=")[1]) for line in text.splitlines() if line.startswith("errorstat_MOVED")
        )
        await c.close()
    return out


async def keys_on_every_node(prefix):
    c = await GlideClient.create(
        GlideClientConfiguration([NodeAddress(HOST, CLUSTER[0])], protocol=ProtocolVersion.RESP2)
    )
    ranges = [(low, high, master[1]) for low, high, master, *_ in await c.custom_command(["CLUSTER", "SLOTS"])]
    keys = {}
    i = 0
    while len(keys) < len(CLUSTER):
        key = f"{prefix}:{i}"
        slot = await c.custom_command(["CLUSTER", "KEYSLOT", key])
        keys.setdefault(next(p for low, high, p in ranges if low <= slot <= high), key)
        i += 1
    await c.close()
    return list(keys.values())


@case
@sync
async def cluster_custom_command_goes_straight_to_the_key_s_node_WAIT_included():
    config = GlideClusterClientConfiguration([NodeAddress(HOST, CLUSTER[0])], request_timeout=15000)
    c = await GlideClusterClient.create(config)
    keys = await keys_on_every_node(unique("glide:cluster"))
    before = await moved_per_node()
    for key in keys:
        token = await c.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000"])
        check(isinstance(token, int), f"token {token!r}")
        check((await c.custom_command(["LOCK.INFO", key]))[b"token"] == token, "info")
        check(await c.custom_command(["LOCK.RENEW", key, "worker-1", "30000"]) == 1, "renew")
        check(await c.custom_command(["LOCK.RELEASE", key, "worker-1"]) == 0, "release")
    key = keys[1]
    first = await c.custom_command(["LOCK.ACQUIRE", key, "worker-1", "30000"])
    waiter = await GlideClusterClient.create(config)

    async def release_soon():
        await asyncio.sleep(0.6)
        await c.custom_command(["LOCK.RELEASE", key, "worker-1"])

    task = asyncio.create_task(release_soon())
    token = await waiter.custom_command(["LOCK.ACQUIRE", key, "worker-2", "30000", "WAIT", "10000"])
    await task
    check(isinstance(token, int) and token > first, f"granted {token!r}")
    check(await waiter.custom_command(["LOCK.RELEASE", key, "worker-2"]) == 0, "release")
    after = await moved_per_node()
    check(after == before, f"no MOVED: {before} -> {after}")
    await c.close()
    await waiter.close()


if __name__ == "__main__":
    run()
