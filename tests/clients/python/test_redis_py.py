"""redis-py 8 (sync and asyncio) against LOCK.*: what docs/clients.md says about it.

redis-py 8.1 defaults: RESP3, socket_timeout 5 s, and 10 retries of a command whose read timed
out (the connection is closed and the command sent again). The safe setting on the connection
that sends WAIT: socket_timeout above the WAIT (or None) and retry=Retry(NoBackoff(), 0).
"""

import asyncio
import threading
import time
import uuid

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from harness import CLUSTER, HOST, PORT, Clock, case, check, run, unique


def admin():
    return redis.Redis(host=HOST, port=PORT)


def lock_stats(r):
    return {k: v for k, v in r.info("lock").items() if isinstance(v, int)}


def delta(before, after):
    return {k: after[k] - before[k] for k in after}


def release_later(key, owner, seconds):
    def go():
        time.sleep(seconds)
        admin().execute_command("LOCK.RELEASE", key, owner)

    t = threading.Thread(target=go)
    t.start()
    return t


# --- the snippets of docs/clients.md -------------------------------------------------------


def waiting_client():
    # The connection that sends WAIT: no read timeout below the WAIT, no retries.
    return redis.Redis(host=HOST, port=PORT, socket_timeout=None, retry=Retry(NoBackoff(), 0))


@case
def sync_acquire_renew_info_release_RESP3_default():
    r = redis.Redis(host=HOST, port=PORT)
    key = unique("py:basic")
    token = r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)  # int, or None if busy
    check(isinstance(token, int) and token > 0, f"token {token!r}")
    check(r.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000) is None, "busy lock: None")
    check(r.execute_command("LOCK.RENEW", key, "worker-1", 30000) == 1, "renew: 1")
    info = r.execute_command("LOCK.INFO", key)
    # RESP3 (redis-py 8's default): a dict with bytes keys.
    check(isinstance(info, dict), f"LOCK.INFO shape {info!r}")
    check(info[b"owner"] == b"worker-1" and info[b"count"] == 1, f"{info!r}")
    check(info[b"token"] == token and info[b"waiters"] == 0, f"{info!r}")
    check(0 < info[b"ttl"] <= 30000, f"{info!r}")
    names = [b"owner", b"count", b"ttl", b"token", b"ephemeral", b"waiters", b"mode", b"holders"]
    check(list(info) == names, f"the fields the guide's comment shows: {list(info)!r}")
    check(info[b"ephemeral"] is None and info[b"mode"] == b"exclusive", f"{info!r}")
    check(info[b"holders"][0][b"owner"] == b"worker-1", f"{info!r}")
    check(r.execute_command("LOCK.RELEASE", key, "worker-1") == 0, "release: 0 = free")
    check(r.execute_command("LOCK.RELEASE", key, "worker-1") is None, "not held: None")
    check(r.execute_command("LOCK.RENEW", key, "worker-1", 30000) == 0, "not held: renew 0")
    check(r.execute_command("LOCK.INFO", key) is None, "free: None")


@case
def sync_LOCK_INFO_under_RESP2_is_a_flat_list():
    r = redis.Redis(host=HOST, port=PORT, protocol=2)
    key = unique("py:resp2")
    token = r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
    info = r.execute_command("LOCK.INFO", key)
    check(isinstance(info, list) and len(info) == 16, f"LOCK.INFO shape {info!r}")
    fields = dict(zip(info[0::2], info[1::2]))
    check(info[0::2] == [b"owner", b"count", b"ttl", b"token", b"ephemeral", b"waiters", b"mode", b"holders"], f"{info!r}")
    check(fields[b"owner"] == b"worker-1" and fields[b"token"] == token, f"{info!r}")
    r.execute_command("LOCK.RELEASE", key, "worker-1")


@case
def sync_WAIT_granted_returns_the_token():
    key = unique("py:wait")
    holder = admin()
    first = holder.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
    t = release_later(key, "worker-1", 0.3)
    r = waiting_client()
    token = r.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 10000)
    t.join()
    check(isinstance(token, int) and token > first, f"granted token {token!r} after {first}")
    try:
        check(r.execute_command("LOCK.INFO", key)[b"owner"] == b"worker-2", "worker-2 holds it")
    finally:
        check(r.execute_command("LOCK.RELEASE", key, "worker-2") == 0, "release: 0")


@case
def sync_WAIT_timeout_is_None():
    key = unique("py:timeout")
    admin().execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
    clock = Clock()
    reply = waiting_client().execute_command("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 300)
    check(reply is None, f"reply {reply!r}")
    check(0.25 < clock.elapsed() < 2, f"elapsed {clock.elapsed():.2f}s")
    admin().execute_command("LOCK.FORCERELEASE", key)


@case
def sync_defaults_cut_a_WAIT_over_5s_and_send_it_again():
    # Defaults: socket_timeout 5 s, 10 retries. The lock's lease ends at 6 s; a WAIT 5500 is
    # answered nil by the server at 5.5 s, but redis-py gives up at 5 s, closes the connection
    # and sends the WAIT again: the second wait is granted at 6 s, past what the caller asked.
    key = unique("py:defaults")
    defaults = redis.Redis(host=HOST, port=PORT)
    check(defaults.connection_pool.connection_kwargs["socket_timeout"] == 5, "default socket_timeout 5 s")
    check(defaults.get_retry().get_retries() == 10, "default retries: 10")
    a = admin()
    first = a.execute_command("LOCK.ACQUIRE", key, "worker-1", 6000)
    before = lock_stats(a)
    clock = Clock()
    reply = defaults.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 5500)
    elapsed = clock.elapsed()
    d = delta(before, lock_stats(a))
    check(isinstance(reply, int) and reply > first, f"reply {reply!r}")
    check(elapsed > 5.8, f"returned after {elapsed:.2f}s, later than the 5.5 s asked")
    check(d["lock_waits_started"] == 2, f"the server saw 2 waits: {d}")
    check(d["lock_wait_cancelled"] == 1, f"the first left at the reconnect: {d}")
    a.execute_command("LOCK.RELEASE", key, "worker-2")


@case
def sync_timeout_above_the_WAIT_and_no_retries_keep_the_WAIT_as_asked():
    # Same scene with the setting: one wait, answered nil at 5.5 s.
    key = unique("py:setting")
    a = admin()
    a.execute_command("LOCK.ACQUIRE", key, "worker-1", 6000)
    before = lock_stats(a)
    clock = Clock()
    r = redis.Redis(host=HOST, port=PORT, socket_timeout=7, retry=Retry(NoBackoff(), 0))
    reply = r.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 5500)
    elapsed = clock.elapsed()
    d = delta(before, lock_stats(a))
    check(reply is None, f"reply {reply!r}")
    check(5.4 < elapsed < 6.5, f"elapsed {elapsed:.2f}s")
    check(d["lock_waits_started"] == 1 and d["lock_wait_timeouts"] == 1, f"{d}")


@case
def sync_with_retries_on_ONCE_keeps_a_retried_WAIT_from_counting_twice():
    # redis-py's retry race: a WAIT granted just as the client's own socket timeout fires. The
    # client closes with the grant unread and sends the WAIT again; without ONCE the server
    # counts that as a re-entry. With ONCE a repeat by the holder returns its token and resets
    # the lease without counting, so whatever the race does, one release frees the lock. The
    # release is timed around the client's timeout to hit the race now and then.
    import random
    a = admin()
    timeout = 0.2
    for trial in range(20):
        key = unique("py:race")
        a.execute_command("LOCK.ACQUIRE", key, "holder", 30000)
        r = redis.Redis(host=HOST, port=PORT, socket_timeout=timeout, retry=Retry(NoBackoff(), 3))
        threading.Thread(
            target=lambda k=key: (time.sleep(timeout + random.uniform(-0.0005, 0.0015)),
                                  admin().execute_command("LOCK.RELEASE", k, "holder")),
        ).start()
        try:
            token = r.execute_command("LOCK.ACQUIRE", key, "app", 30000, "WAIT", 2000, "ONCE")
        except redis.exceptions.TimeoutError:
            token = None
        held = a.execute_command("LOCK.INFO", key)
        if token is not None:
            check(held[b"owner"] == b"app" and held[b"count"] == 1,
                  f"trial {trial}: holds {held} after one acquire")
            check(held[b"token"] == token, f"trial {trial}: token {token} vs {held}")
            check(r.execute_command("LOCK.RELEASE", key, "app") == 0, f"trial {trial}: one release frees it")
        a.execute_command("LOCK.FORCERELEASE", key)
        r.close()


@case
def sync_a_read_timeout_closes_the_connection_so_the_waiter_leaves_the_queue():
    key = unique("py:close")
    a = admin()
    a.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
    r = redis.Redis(host=HOST, port=PORT, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        r.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 3000)
        raise AssertionError("expected a TimeoutError")
    except redis.exceptions.TimeoutError:
        pass
    time.sleep(0.1)
    check(a.execute_command("LOCK.INFO", key)[b"waiters"] == 0, "no waiter left queued")
    check(r.ping(), "the client reconnects for the next command")
    a.execute_command("LOCK.FORCERELEASE", key)


@case
def asyncio_acquire_wait_renew_info_release():
    async def main():
        r = redis.asyncio.Redis(host=HOST, port=PORT)
        waiter = redis.asyncio.Redis(
            host=HOST, port=PORT, socket_timeout=None,
            retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
        )
        key = unique("py:async")
        first = await r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
        check(await r.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000) is None, "busy")

        async def release_soon():
            await asyncio.sleep(0.3)
            await r.execute_command("LOCK.RELEASE", key, "worker-1")

        task = asyncio.create_task(release_soon())
        token = await waiter.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 10000)
        await task
        check(isinstance(token, int) and token > first, f"token {token!r}")
        check(await waiter.execute_command("LOCK.RENEW", key, "worker-2", 30000) == 1, "renew")
        info = await r.execute_command("LOCK.INFO", key)
        check(isinstance(info, dict) and info[b"owner"] == b"worker-2", f"{info!r}")
        check(info[b"token"] == token, f"{info!r}")
        check(await waiter.execute_command("LOCK.RELEASE", key, "worker-2") == 0, "release")
        clock = Clock()
        await r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
        reply = await waiter.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 300)
        check(reply is None and clock.elapsed() < 2, f"timeout: {reply!r}")
        await r.execute_command("LOCK.RELEASE", key, "worker-1")
        await r.aclose()
        await waiter.aclose()

    asyncio.run(main())


# --- the recommended pattern of docs/clients.md ----------------------------------------------

WAIT_MS = 10_000
# One connection for blocking acquires: its read timeout above the WAIT, no retries.
waiting = redis.Redis(host=HOST, port=PORT, socket_timeout=WAIT_MS / 1000 + 5, retry=Retry(NoBackoff(), 0))
commands = redis.Redis(host=HOST, port=PORT)  # renew, release: ordinary commands


def with_lock(key, lease_ms, work):
    """Runs work(token) while holding `key`; returns (True, its result), or (False, None) when
    the lock was not granted within WAIT_MS."""
    owner = str(uuid.uuid4())
    token = waiting.execute_command("LOCK.ACQUIRE", key, owner, lease_ms, "WAIT", WAIT_MS)
    if token is None:
        return False, None
    stop = threading.Event()

    def renew():  # at a third of the lease; 0 means the lease ran out: the lock is lost
        while not stop.wait(lease_ms / 3000):
            if commands.execute_command("LOCK.RENEW", key, owner, lease_ms) != 1:
                return

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        return True, work(token)  # pass the token with every write to the protected resource
    finally:
        stop.set()
        renewer.join()
        commands.execute_command("LOCK.RELEASE", key, owner)


class FencedStore:
    """A protected resource: refuses a write whose token is below the highest it has seen."""

    def __init__(self):
        self.highest = 0
        self.value = 0
        self.refused = 0
        self.mutex = threading.Lock()

    def write(self, token, value):
        with self.mutex:
            if token < self.highest:
                self.refused += 1
                return False
            self.highest = token
            self.value = value
            return True


@case
def pattern_with_lock_renews_fences_and_releases():
    key = unique("py:pattern")
    store = FencedStore()
    done = []

    def increment(token):
        value = store.value
        time.sleep(0.01)
        check(store.write(token, value + 1), "the holder's write is accepted")
        return token

    def worker():
        for _ in range(5):
            acquired, token = with_lock(key, 30000, increment)
            check(acquired, "granted within the WAIT")
            done.append(token)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(store.value == 15 and store.refused == 0, f"15 increments, none lost: {store.value}")
    check(sorted(done) == sorted(set(done)), "every hold had its own token")
    check(admin().execute_command("LOCK.INFO", key) is None, "released")

    # Work longer than the lease: the renewals keep the lock; the next holder's token is higher,
    # so the store refuses a write made with the old one.
    def slow(token):
        time.sleep(1.5)
        info = admin().execute_command("LOCK.INFO", key)
        check(info is not None and info[b"token"] == token, f"still held after 1.5 s of a 600 ms lease: {info!r}")
        return token

    _, old = with_lock(key, 600, slow)
    _, new = with_lock(key, 600, lambda token: token)
    check(new > old and store.write(new, 1) and not store.write(old, 2), "the stale token is refused")


@case
def fencing_one_resource_with_two_token_families_refuses_the_one_and_lets_stale_tokens_of_the_other_through():
    # Redisson's RFencedLock numbers its holds 1, 2, 3, ... from a counter of its own; an INCR
    # counter stands in for it here. The module's tokens never fall below the server clock in
    # microseconds (about 1.8e15).
    r = admin()
    key = unique("py:fence-families")
    counter = unique("py:fence-counter")
    stale = r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
    r.execute_command("LOCK.RELEASE", key, "worker-1")
    current = r.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000)
    r.execute_command("LOCK.RELEASE", key, "worker-2")
    check(current > stale >= (time.time() - 60) * 1_000_000, f"module tokens {stale} {current}")
    counted = [r.incr(counter) for _ in range(1000)]
    check(counted[:3] == [1, 2, 3], f"the counter's tokens {counted[:3]}")
    # A resource that has seen a module token refuses every token of the counter.
    store = FencedStore()
    check(store.write(current, "module"), "the module holder's write")
    check(not any(store.write(t, "counter") for t in counted), "every counter token is refused")
    check(store.refused == len(counted), f"refused {store.refused}")
    # A counter token says nothing about a module token: after the counter's holders wrote, the
    # superseded module hold's token passes the fence; fenced with module tokens only, it does not.
    store = FencedStore()
    check(all(store.write(t, "counter") for t in counted), "the counter's holders write in turn")
    check(store.write(stale, "stale"), "a stale module token passes a fence that saw counter tokens")
    store = FencedStore()
    check(store.write(current, "module") and not store.write(stale, "stale"), "one family: refused")


# --- the lock family and LOCK.INFO's shape ----------------------------------------------------

EXCLUSIVE_FIELDS = [b"owner", b"count", b"ttl", b"token", b"ephemeral", b"waiters", b"mode", b"holders"]
HOLDER_FIELDS = [b"owner", b"mode", b"count", b"ttl", b"token", b"ephemeral"]


@case
def LOCK_INFO_fields_in_order_under_RESP2_for_each_kind_of_key():
    r = redis.Redis(host=HOST, port=PORT, protocol=2)
    key = unique("py:info-shape")
    token = r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
    info = r.execute_command("LOCK.INFO", key)
    check(info[::2] == EXCLUSIVE_FIELDS, f"exclusive: {info!r}")
    holder = info[-1][0]
    check(holder[::2] == HOLDER_FIELDS, f"holder entry: {holder!r}")
    check(holder[1::2][:2] == [b"worker-1", b"exclusive"] and holder[11] is None, f"{holder!r}")
    check(info[7] == token and info[9] is None, "token, ephemeral nil")
    r.execute_command("LOCK.RELEASE", key, "worker-1")
    r.execute_command("LOCK.ACQUIRE", key, "reader-1", 30000, "SHARED")
    info = r.execute_command("LOCK.INFO", key)
    check(info[::2] == [b"waiters", b"mode", b"holders"], f"shared: {info!r}")
    r.execute_command("LOCK.FORCERELEASE", key)
    r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "LIMIT", 3)
    info = r.execute_command("LOCK.INFO", key)
    check(info[::2] == [b"waiters", b"mode", b"limit", b"holders"], f"semaphore: {info!r}")
    r.execute_command("LOCK.FORCERELEASE", key)


@case
def SHARED_readers_share_and_exclude_a_writer():
    r = redis.Redis(host=HOST, port=PORT)
    key = unique("py:shared")
    t1 = r.execute_command("LOCK.ACQUIRE", key, "reader-1", 30000, "SHARED")  # a token
    t2 = r.execute_command("LOCK.ACQUIRE", key, "reader-2", 30000, "SHARED")
    check(isinstance(t1, int) and t2 > t1, f"tokens {t1} {t2}")
    check(r.execute_command("LOCK.ACQUIRE", key, "writer", 30000) is None, "writer: None")
    info = r.execute_command("LOCK.INFO", key)  # RESP3: a dict, no top-level owner
    check(info[b"mode"] == b"shared" and b"owner" not in info, f"{info!r}")
    check(sorted(h[b"owner"] for h in info[b"holders"]) == [b"reader-1", b"reader-2"], f"{info!r}")
    check([h[b"mode"] for h in info[b"holders"]] == [b"shared", b"shared"], f"holder mode: {info!r}")
    check(r.execute_command("LOCK.RELEASE", key, "reader-1") == 0, "reader-1 holds nothing now")
    check(r.execute_command("LOCK.RELEASE", key, "reader-2") == 0, "reader-2 too")
    check(isinstance(r.execute_command("LOCK.ACQUIRE", key, "writer", 30000), int), "writer")
    check(r.execute_command("LOCK.ACQUIRE", key, "reader-3", 30000, "SHARED") is None, "reader: None")
    r.execute_command("LOCK.RELEASE", key, "writer")


@case
def LIMIT_counts_permits():
    r = redis.Redis(host=HOST, port=PORT)
    key = unique("py:limit")
    check(isinstance(r.execute_command("LOCK.ACQUIRE", key, "a", 30000, "LIMIT", 2), int), "a")
    check(isinstance(r.execute_command("LOCK.ACQUIRE", key, "b", 30000, "LIMIT", 2), int), "b")
    check(r.execute_command("LOCK.ACQUIRE", key, "c", 30000, "LIMIT", 2) is None, "c: None")
    info = r.execute_command("LOCK.INFO", key)
    check(info[b"mode"] == b"semaphore" and info[b"limit"] == 2 and len(info[b"holders"]) == 2, f"{info!r}")
    check([h[b"mode"] for h in info[b"holders"]] == [b"permit", b"permit"], f"holder mode: {info!r}")
    r.execute_command("LOCK.RELEASE", key, "a")
    check(isinstance(r.execute_command("LOCK.ACQUIRE", key, "c", 30000, "LIMIT", 2), int), "c")
    r.execute_command("LOCK.FORCERELEASE", key)


# --- EPHEMERAL ----------------------------------------------------------------------------------


def held(key):
    return admin().execute_command("LOCK.INFO", key) is not None


@case
def EPHEMERAL_on_a_dedicated_connection_renewed_on_it_lives_until_that_connection_closes():
    holder = redis.Redis(host=HOST, port=PORT, single_connection_client=True)
    key = unique("py:ephemeral")
    token = holder.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
    check(isinstance(token, int), f"token {token!r}")
    info = holder.execute_command("LOCK.INFO", key)
    check(info[b"ephemeral"] == holder.client_id(), f"bound to this connection: {info!r}")
    check(holder.execute_command("LOCK.RENEW", key, "worker-1", 30000) == 1, "renewed on it")
    holder.close()
    time.sleep(0.1)
    check(not held(key), "ended with the connection")


# The dedicated connection dropped (CLIENT KILL stands in for a network cut or a server-side
# close). With the default retry, redis-py reconnects silently: the next command succeeds on a new
# connection and only LOCK.RENEW's 0 tells the hold is gone. With retry=Retry(NoBackoff(), 0) the
# first command after the drop raises redis.ConnectionError; the one after it reconnects.
@case
def EPHEMERAL_dedicated_connection_killed_default_retry_reconnects_silently_no_retry_raises_ConnectionError():
    for retry in (None, Retry(NoBackoff(), 0)):
        options = {} if retry is None else {"retry": retry}
        holder = redis.Redis(host=HOST, port=PORT, single_connection_client=True, **options)
        key = unique("py:ephemeral-killed")
        holder.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
        first_id = holder.client_id()
        admin().client_kill_filter(_id=first_id)
        time.sleep(0.1)
        check(not held(key), "the hold ended with the connection")
        if retry is None:
            renewed = holder.execute_command("LOCK.RENEW", key, "worker-1", 30000)
            check(renewed == 0, f"default: the renewal goes through on a new connection and answers 0: {renewed!r}")
            check(holder.client_id() != first_id, "a new connection")
        else:
            try:
                holder.execute_command("LOCK.RENEW", key, "worker-1", 30000)
                raise AssertionError("no retry: the renewal should have raised")
            except redis.ConnectionError:
                pass
            check(holder.ping() is True and holder.client_id() != first_id, "the next command reconnects")
        holder.close()


@case
def EPHEMERAL_through_a_pool_is_dropped_when_redis_py_closes_its_connection():
    # A redis.Redis that goes out of scope closes its pool: the hold ends.
    def scoped(key):
        r = redis.Redis(host=HOST, port=PORT)
        r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")

    key = unique("py:eph-scope")
    scoped(key)
    import gc
    gc.collect()
    time.sleep(0.1)
    check(not held(key), "out of scope: dropped")
    # pool.disconnect() (what close() does) drops it too, and the client goes on working on a
    # new connection.
    for how in ("pool.disconnect()", "close()"):
        r = redis.Redis(host=HOST, port=PORT)
        key = unique("py:eph-disconnect")
        r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
        bound = r.execute_command("LOCK.INFO", key)[b"ephemeral"]
        check(bound == r.client_id(), "held on the pool's connection")
        if how == "close()":
            r.close()
        else:
            r.connection_pool.disconnect()
        time.sleep(0.1)
        check(not held(key), f"{how}: dropped")
        check(r.ping() and r.client_id() != bound, f"{how}: the client goes on, on a new connection")
    # Another thread's command that times out on the same pooled connection (the acquire
    # returned it to the pool, the thread took it next): redis-py closes it, the hold ends.
    r = redis.Redis(host=HOST, port=PORT, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    key = unique("py:eph-timeout")
    r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
    errors = []

    def slow():
        try:
            r.execute_command("BLPOP", unique("py:nolist"), 2)
        except redis.TimeoutError as e:
            errors.append(e)

    t = threading.Thread(target=slow)
    t.start()
    t.join()
    time.sleep(0.1)
    check(len(errors) == 1 and not held(key), "a timed-out command elsewhere dropped it")
    check(r.ping(), "and the client goes on as if nothing happened")


@case
def EPHEMERAL_asyncio_aclose_and_leaving_async_with_drop_the_hold():
    async def main():
        key = unique("py:eph-aclose")
        r = redis.asyncio.Redis(host=HOST, port=PORT)
        await r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
        bound = (await r.execute_command("LOCK.INFO", key))[b"ephemeral"]
        check(held(key) and bound == await r.client_id(), "held on the client's connection")
        await r.aclose()
        await asyncio.sleep(0.1)
        check(not held(key), "aclose(): dropped")
        check(await r.ping() and await r.client_id() != bound, "aclose(): the client goes on")
        await r.aclose()
        key = unique("py:eph-async-with")
        async with redis.asyncio.Redis(host=HOST, port=PORT) as r:
            await r.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
            bound = (await r.execute_command("LOCK.INFO", key))[b"ephemeral"]
            check(held(key) and bound == await r.client_id(), "held inside, on the client's connection")
        await asyncio.sleep(0.1)
        check(not held(key), "leaving async with: dropped")
        check(await r.ping() and await r.client_id() != bound, "after async with: the client goes on")
        await r.aclose()

    asyncio.run(main())


@case
def EPHEMERAL_asyncio_single_connection_client_keeps_every_command_on_the_holding_connection():
    async def main():
        holder = redis.asyncio.Redis(host=HOST, port=PORT, single_connection_client=True)
        key = unique("py:eph-async-single")
        await holder.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
        bound = (await holder.execute_command("LOCK.INFO", key))[b"ephemeral"]
        # Commands of concurrent tasks, renewals included, all go over the holding connection.
        ids = await asyncio.gather(*[holder.client_id() for _ in range(5)])
        renewals = [holder.execute_command("LOCK.RENEW", key, "worker-1", 30000) for _ in range(5)]
        check(set(ids) == {bound}, f"one connection: {ids}, hold on {bound}")
        check(await asyncio.gather(*renewals) == [1] * 5, "renewed on it")
        # Without it, concurrent commands take a pooled connection each.
        pooled = redis.asyncio.Redis(host=HOST, port=PORT)
        ids = await asyncio.gather(*[pooled.client_id() for _ in range(5)])
        check(len(set(ids)) == 5, f"the default client: {ids}")
        await pooled.aclose()
        check(held(key), "still held")
        await holder.aclose()
        await asyncio.sleep(0.1)
        check(not held(key), "ended with its connection")

    asyncio.run(main())


@case
def EPHEMERAL_server_timeout_closes_an_idle_holder_unless_renewals_go_on_its_connection():
    a = admin()
    old = a.config_get("timeout")["timeout"]
    a.config_set("timeout", 2)
    try:
        # Renewals every 1.5 s from ANOTHER connection: the holder's connection is idle for
        # the server, which closes it after 2 s, and the hold ends with it.
        holder = redis.Redis(host=HOST, port=PORT, single_connection_client=True)
        other = redis.Redis(host=HOST, port=PORT)
        key = unique("py:eph-idle")
        holder.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
        renewed = []
        for _ in range(3):
            time.sleep(1.5)
            renewed.append(other.execute_command("LOCK.RENEW", key, "worker-1", 30000))
        check(renewed[0] == 1 and renewed[-1] == 0 and not held(key), f"renewals {renewed}")
        holder.close()
        # Renewals ON the holding connection keep it active: the hold lives.
        holder = redis.Redis(host=HOST, port=PORT, single_connection_client=True)
        key = unique("py:eph-renewed")
        holder.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
        for _ in range(3):
            time.sleep(1.5)
            check(holder.execute_command("LOCK.RENEW", key, "worker-1", 30000) == 1, "renewed")
        check(held(key), "still held after 4.5 s")
        holder.close()
    finally:
        a.config_set("timeout", old)


# --- cluster ---------------------------------------------------------------------------------


def node_stats():
    """Per node: (MOVED errors so far, LOCK.ACQUIRE calls executed so far)."""
    out = {}
    for port in CLUSTER:
        n = redis.Redis(host=HOST, port=port)
        errors = n.info("errorstats")
        commands = n.info("commandstats")
        out[port] = (
            errors.get("errorstat_MOVED", {}).get("count", 0),
            commands.get("cmdstat_lock.acquire", {}).get("calls", 0),
        )
    return out


def keys_on_every_node(prefix):
    """One key per master (by the slot each master serves)."""
    r = redis.Redis(host=HOST, port=CLUSTER[0], protocol=2)
    owners = {}
    for low, high, master, *_ in r.execute_command("CLUSTER", "SLOTS"):
        owners[(low, high)] = master[1]
    keys = {}
    i = 0
    while len(keys) < len(CLUSTER):
        key = f"{prefix}:{i}"
        slot = r.execute_command("CLUSTER", "KEYSLOT", key)
        port = next(p for (low, high), p in owners.items() if low <= slot <= high)
        keys.setdefault(port, key)
        i += 1
    return keys


@case
def cluster_sync_commands_go_straight_to_the_key_s_node():
    rc = RedisCluster(host=HOST, port=CLUSTER[0], socket_timeout=None, retry=Retry(NoBackoff(), 0))
    keys = keys_on_every_node(unique("py:cluster"))
    before = node_stats()
    for port, key in keys.items():
        token = rc.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
        check(isinstance(token, int), f"token {token!r}")
        info = rc.execute_command("LOCK.INFO", key)
        check(info[b"owner"] == b"worker-1", f"{info!r}")
        check(rc.execute_command("LOCK.RENEW", key, "worker-1", 30000) == 1, "renew")
        check(rc.execute_command("LOCK.RELEASE", key, "worker-1") == 0, "release")
    after = node_stats()
    for port in CLUSTER:
        check(after[port][0] == before[port][0], f"no MOVED on {port}: {before} -> {after}")
        check(after[port][1] - before[port][1] == 1, f"one acquire on {port}: {before} -> {after}")
    # WAIT through the cluster client.
    key = keys[CLUSTER[1]]
    first = rc.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000)
    t = threading.Thread(target=lambda: (time.sleep(0.3), rc.execute_command("LOCK.RELEASE", key, "worker-1")))
    waiter = RedisCluster(host=HOST, port=CLUSTER[0], socket_timeout=None, retry=Retry(NoBackoff(), 0))
    before = node_stats()
    t.start()
    token = waiter.execute_command("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 10000)
    t.join()
    check(isinstance(token, int) and token > first, f"granted {token!r}")
    check(waiter.execute_command("LOCK.RELEASE", key, "worker-2") == 0, "release")
    after = node_stats()
    for port in CLUSTER:
        check(after[port][0] == before[port][0], f"WAIT: no MOVED on {port}: {before} -> {after}")
    check(after[CLUSTER[1]][1] - before[CLUSTER[1]][1] == 1, f"the WAIT ran on the key's node: {before} -> {after}")


def moved_total():
    return sum(m for m, _ in node_stats().values())


@case
def cluster_asyncio_first_command_may_be_redirected_then_every_command_is_direct():
    async def main():
        keys = keys_on_every_node(unique("py:acluster"))
        # Without initialize(): the first command is sent before the client knows the slot
        # map, so it may land on another node (one MOVED); from then on every command is direct.
        rc = redis.asyncio.cluster.RedisCluster(host=HOST, port=CLUSTER[0])
        first_key = keys[CLUSTER[2]]
        before = moved_total()
        check(await rc.execute_command("LOCK.INFO", first_key) is None, "first command")
        first = moved_total() - before
        check(first <= 1, f"first command: {first} MOVED")
        print(f"# asyncio cluster without initialize(): first command {first} MOVED", flush=True)
        before = node_stats()
        for key in keys.values():
            check(isinstance(await rc.execute_command("LOCK.ACQUIRE", key, "w", 30000), int), "token")
            check((await rc.execute_command("LOCK.INFO", key))[b"owner"] == b"w", "info")
            check(await rc.execute_command("LOCK.RELEASE", key, "w") == 0, "release")
        after = node_stats()
        for port in CLUSTER:
            check(after[port][0] == before[port][0], f"no MOVED on {port}: {before} -> {after}")
            check(after[port][1] - before[port][1] == 1, f"one acquire on {port}")
        await rc.aclose()
        # With initialize() first, the first command is direct too.
        rc = redis.asyncio.cluster.RedisCluster(host=HOST, port=CLUSTER[0])
        await rc.initialize()
        before = moved_total()
        check(await rc.execute_command("LOCK.INFO", first_key) is None, "first command")
        check(moved_total() == before, "initialize(): no MOVED")
        await rc.aclose()

    asyncio.run(main())


@case
def cluster_EPHEMERAL_through_RedisCluster_is_dropped_by_close():
    rc = RedisCluster(host=HOST, port=CLUSTER[0])
    key = unique("py:cluster-eph")
    rc.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
    check(rc.execute_command("LOCK.INFO", key) is not None, "held")
    rc.close()
    time.sleep(0.1)
    fresh = RedisCluster(host=HOST, port=CLUSTER[0])
    check(fresh.execute_command("LOCK.INFO", key) is None, "dropped")
    # redis-py 8.1.0's close() leaves the object without a default node: a command it sends to
    # another node than its key's fails with AttributeError, until it reloads its slot map.
    check(rc.get_default_node() is None, "no default node after close()")
    outcomes = []
    for i in range(25):
        try:
            rc.execute_command("LOCK.INFO", f"{key}:{i}")
            outcomes.append(".")
        except AttributeError:
            outcomes.append("A")
    outcomes = "".join(outcomes)
    check("A" in outcomes[:20] and outcomes.endswith("....."), f"after close(): {outcomes}")
    check(fresh.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000) is not None, "a new client works")
    fresh.execute_command("LOCK.RELEASE", key, "worker-1")


@case
def cluster_asyncio_EPHEMERAL_is_dropped_by_aclose_and_the_client_goes_on():
    async def main():
        rc = redis.asyncio.cluster.RedisCluster(host=HOST, port=CLUSTER[0])
        key = unique("py:acluster-eph")
        await rc.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
        check(await rc.execute_command("LOCK.INFO", key) is not None, "held")
        await rc.aclose()
        await asyncio.sleep(0.1)
        check(RedisCluster(host=HOST, port=CLUSTER[0]).execute_command("LOCK.INFO", key) is None, "dropped")
        for i in range(10):
            check(await rc.execute_command("LOCK.INFO", f"{key}:{i}") is None, "the client goes on")
        check(await rc.execute_command("LOCK.ACQUIRE", key, "worker-1", 30000) is not None, "acquire")
        check(await rc.execute_command("LOCK.RELEASE", key, "worker-1") == 0, "release")
        await rc.aclose()

    asyncio.run(main())


if __name__ == "__main__":
    run()
