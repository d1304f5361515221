"""The Functions library (functions/redislock.lua) on a server WITHOUT the module, as a managed
service runs it: each function against what docs/commands.md says the matching LOCK.* command
does — the stored layout, replies, errors, tokens, the unlock message — and, on a server with
the module, one key used by both: the same lock, tokens rising whichever side grants."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import redis

from conftest import ROOT, Server, start_server, wait_acknowledged
from test_interop import REDISSON_LOCK

LIBRARY = ROOT / "functions" / "redislock.lua"
MAX_LEASE_MS = 2592000000
MAX_EXACT = 2**53 - 1
I64_MAX = 2**63 - 1

_spec = importlib.util.spec_from_file_location("slot_tags", ROOT / "functions" / "slot-tags.py")
assert _spec and _spec.loader
slot_tags = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slot_tags)
TAGS = slot_tags.slot_tags()


def counter_of(key: str) -> str:
    """The module's token counter of the key's slot (core/src/slot.rs)."""
    return "__lock_fence__{" + TAGS[slot_tags.key_slot(key.encode())] + "}"


def load(r: redis.Redis) -> None:
    assert r.execute_command("FUNCTION", "LOAD", "REPLACE", LIBRARY.read_bytes()) == b"redislock"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A plain redis-server, no module, with the library loaded."""
    s = start_server(tmp_path_factory.mktemp("functions"), with_module=False)
    load(s.client())
    yield s
    s.proc.kill()
    s.proc.wait()


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def key() -> str:
    return f"test:{uuid.uuid4().hex}"


def fcall(r: redis.Redis, function: str, *keys_then_args: object, keys: int = 1) -> object:
    return r.execute_command("FCALL", function, keys, *keys_then_args)


def error_of(r: redis.Redis, function: str, *keys_then_args: object, keys: int = 1) -> str:
    """The error line exactly as the server sends it (redis-py drops a leading `ERR `), read on
    a socket of its own."""
    return error_line(r, [b"FCALL", function, keys, *keys_then_args])


def error_line(r: redis.Redis, args: list[object]) -> str:
    """The error line the server answers ``args`` with, exactly as sent, on a socket of its
    own."""
    encoded = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    request = b"*%d\r\n" % len(encoded) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in encoded)
    port = r.connection_pool.connection_kwargs["port"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = conn.recv(4096)
            assert chunk, "the server closed the connection"
            reply += chunk
    assert reply.startswith(b"-"), (args, reply)
    return reply[1:-2].decode()


def snapshot(r: redis.Redis) -> dict[bytes, tuple[bytes, int]]:
    """Every key with its serialized value and whether it has an expiry: what a refused call
    must leave as it was."""
    return {k: (r.dump(k), -1 if r.pttl(k) == -1 else 1) for k in r.keys("*")}


def publishes(server: Server) -> int:
    return server.commandstat("publish")


def as_dict(reply: object) -> dict[bytes, object]:
    assert isinstance(reply, list) and len(reply) % 2 == 0, reply
    return dict(zip(reply[::2], reply[1::2]))


def clock_floor(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return (seconds * 1000 + micros // 1000) * 1000


# -- the library itself ------------------------------------------------------------------------


def test_the_library_loads_where_no_module_is(r: redis.Redis) -> None:
    assert r.execute_command("MODULE", "LIST") == []
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.execute_command("LOCK.ACQUIRE", "k", "w", 1000)
    (library,) = r.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "redislock")
    functions = {
        f[1].decode(): sorted(x.decode() for x in f[5])
        for f in as_dict(library)[b"functions"]
    }
    assert functions == {
        "lock_acquire": [],
        "lock_release": ["allow-oom"],
        "lock_renew": ["allow-oom"],
        "lock_forcerelease": ["allow-oom"],
        "lock_cancel": ["allow-oom"],
        "lock_info": ["no-writes"],
        "lock_version": ["no-writes"],
    }
    assert fcall(r, "lock_version", keys=0) == 2
    # Loading it again needs REPLACE, as for any library.
    with pytest.raises(redis.ResponseError, match="already exists"):
        r.execute_command("FUNCTION", "LOAD", LIBRARY.read_bytes())


def test_the_slot_tags_in_the_library_are_the_modules() -> None:
    subprocess.run([sys.executable, str(ROOT / "functions" / "slot-tags.py"), "--check"], check=True)
    # core/src/slot.rs slots_match_redis, and a counter name stored on a server of the module.
    for name, slot in [(b"foo", 12182), (b"{user1000}.following", 3443), (b"foo{}{bar}", 8363),
                       (b"foo{{bar}}zap", 4015)]:
        assert slot_tags.key_slot(name) == slot
    assert counter_of("k") == "__lock_fence__{k}"


def test_the_library_names_every_slots_counter_as_the_module_does(r: redis.Redis) -> None:
    """One grant in each of the 16,384 slots (the key `{<tag>}:lock` is in the tag's slot): each
    writes exactly the counter the module's rule names, read from the library's table."""
    r.flushall()
    keys = [f"{{{tag}}}:lock" for tag in TAGS]
    for start in range(0, len(keys), 1024):
        with r.pipeline(transaction=False) as p:
            for key in keys[start:start + 1024]:
                p.execute_command("FCALL", "lock_acquire", 1, key, "w", 60000)
            assert all(isinstance(t, int) for t in p.execute())
    counters = {k.decode() for k in r.scan_iter("__lock_fence__*", count=1000)}
    assert counters == {counter_of(key) for key in keys}
    assert len(counters) == 16384
    r.flushall()


# -- acquire -----------------------------------------------------------------------------------


def test_acquire_stores_the_modules_layout_and_counter(r: redis.Redis, key: str) -> None:
    floor = clock_floor(r)
    token = fcall(r, "lock_acquire", key, "worker-1", 30000)
    assert isinstance(token, int) and token >= floor
    assert r.hgetall(key) == {b"worker-1": b"1", b"mode": f"exclusive:{token}".encode()}
    assert 29000 < r.pttl(key) <= 30000
    # The new bound is the token itself, in the slot's counter, which has no expiry.
    assert int(r.get(counter_of(key))) == token
    assert r.pttl(counter_of(key)) == -1


def test_a_reentry_counts_up_keeps_the_token_and_resets_the_lease(r: redis.Redis, key: str) -> None:
    token = fcall(r, "lock_acquire", key, "w", 1000)
    assert fcall(r, "lock_acquire", key, "w", 60000) == token
    assert r.hget(key, "w") == b"2"
    assert r.pttl(key) > 59000
    # ONCE: the token and a fresh lease, the count unchanged.
    r.pexpire(key, 1000)
    assert fcall(r, "lock_acquire", key, "w", 60000, "once") == token
    assert r.hget(key, "w") == b"2"
    assert r.pttl(key) > 59000


def test_another_owner_gets_nil_and_changes_nothing(r: redis.Redis, key: str) -> None:
    fcall(r, "lock_acquire", key, "w1", 30000)
    before = r.hgetall(key)
    assert fcall(r, "lock_acquire", key, "w2", 60000) is None
    assert fcall(r, "lock_acquire", key, "w2", 60000, "ONCE") is None
    assert r.hgetall(key) == before
    assert r.pttl(key) <= 30000


def test_a_lease_ends_on_the_servers_clock(r: redis.Redis, key: str) -> None:
    first = fcall(r, "lock_acquire", key, "w1", 30)
    time.sleep(0.06)
    assert fcall(r, "lock_info", key) is None
    second = fcall(r, "lock_acquire", key, "w2", 30000)
    assert isinstance(first, int) and isinstance(second, int) and second > first


# -- release, renew, forcerelease --------------------------------------------------------------


def test_release_counts_down_then_frees_the_key_and_publishes(server: Server, r: redis.Redis,
                                                              key: str) -> None:
    sub = r.pubsub()
    sub.subscribe(f"redisson_lock__channel:{{{key}}}")
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    fcall(r, "lock_acquire", key, "w", 30000)
    fcall(r, "lock_acquire", key, "w", 30000)
    r.pexpire(key, 20000)
    published, sharded = publishes(server), server.commandstat("spublish")
    assert fcall(r, "lock_release", key, "w") == 1
    # Releasing keeps the lease of a hold that stays, and publishes nothing.
    assert r.pttl(key) <= 20000 and r.hget(key, "w") == b"1"
    assert publishes(server) == published
    assert fcall(r, "lock_release", key, "other") is None
    assert fcall(r, "lock_release", key, "w") == 0
    assert r.exists(key) == 0
    # PUBLISH, and SPUBLISH too (the module sends that in cluster mode only).
    assert (publishes(server), server.commandstat("spublish")) == (published + 1, sharded + 1)
    message = sub.get_message(timeout=5)
    assert message["type"] == "message" and message["data"] == b"0"
    assert fcall(r, "lock_release", key, "w") is None
    assert publishes(server) == published + 1
    sub.close()


def test_the_unlock_channel_is_redissons_name(server: Server, r: redis.Redis) -> None:
    key = f"{{tenant-{uuid.uuid4().hex}}}:orders"
    sub = r.pubsub()
    sub.subscribe(f"redisson_lock__channel:{key}")
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    fcall(r, "lock_acquire", key, "w", 30000)
    assert fcall(r, "lock_forcerelease", key) == 1
    message = sub.get_message(timeout=5)
    assert message["channel"] == f"redisson_lock__channel:{key}".encode()
    assert message["data"] == b"0"
    sub.close()


def test_release_with_a_token_counts_down_that_hold_only(r: redis.Redis, key: str) -> None:
    token = fcall(r, "lock_acquire", key, "w", 30000)
    fcall(r, "lock_acquire", key, "w", 30000)
    for wrong in [0, int(str(token)) + 1, I64_MAX]:
        assert fcall(r, "lock_release", key, "w", "TOKEN", wrong) is None
    assert r.hget(key, "w") == b"2"
    assert fcall(r, "lock_release", key, "w", "token", token) == 1
    assert fcall(r, "lock_release", key, "w", "TOKEN", token) == 0
    assert r.exists(key) == 0
    # A hold Redisson's script took has no token: no TOKEN names it.
    r.eval(REDISSON_LOCK, 1, key, 30000, "uuid:1")
    assert fcall(r, "lock_release", key, "uuid:1", "TOKEN", token) is None
    assert fcall(r, "lock_release", key, "uuid:1") == 0


def test_renew_resets_the_lease_of_the_holder_only(r: redis.Redis, key: str) -> None:
    assert fcall(r, "lock_renew", key, "w", 60000) == 0
    fcall(r, "lock_acquire", key, "w", 1000)
    assert fcall(r, "lock_renew", key, "other", 60000) == 0
    assert r.pttl(key) <= 1000
    assert fcall(r, "lock_renew", key, "w", 60000) == 1
    assert r.pttl(key) > 59000
    assert r.hget(key, "w") == b"1"


def test_forcerelease_removes_every_reentry(server: Server, r: redis.Redis, key: str) -> None:
    assert fcall(r, "lock_forcerelease", key) == 0
    for _ in range(3):
        fcall(r, "lock_acquire", key, "w", 30000)
    published = publishes(server)
    assert fcall(r, "lock_forcerelease", key) == 1
    assert r.exists(key) == 0
    assert publishes(server) == published + 1
    assert fcall(r, "lock_forcerelease", key) == 0
    assert publishes(server) == published + 1


# -- info ----------------------------------------------------------------------------------------


def test_info_has_the_modules_fields(server: Server, r: redis.Redis, key: str) -> None:
    assert fcall(r, "lock_info", key) is None
    token = fcall(r, "lock_acquire", key, "w", 30000)
    fcall(r, "lock_acquire", key, "w", 30000)
    info = as_dict(fcall(r, "lock_info", key))
    ttl = info.pop(b"ttl")
    assert isinstance(ttl, int) and 29000 < ttl <= 30000
    (holder,) = info.pop(b"holders")
    assert info == {b"owner": b"w", b"count": 2, b"token": token, b"ephemeral": None,
                    b"waiters": 0, b"mode": b"exclusive"}
    holder = as_dict(holder)
    assert holder.pop(b"ttl") == ttl
    assert holder == {b"owner": b"w", b"mode": b"exclusive", b"count": 2, b"token": token,
                      b"ephemeral": None}
    # RESP3: a map, as the module replies (and FCALL_RO: it only reads).
    with redis.Redis(host="127.0.0.1", port=server.port, protocol=3) as r3:
        info3 = r3.execute_command("FCALL_RO", "lock_info", 1, key)
    assert isinstance(info3, dict) and info3[b"token"] == token and info3[b"count"] == 2
    assert isinstance(info3[b"holders"][0], dict)


def test_info_of_a_hold_redissons_script_took(r: redis.Redis, key: str) -> None:
    r.eval(REDISSON_LOCK, 1, key, 30000, "uuid:7")
    info = as_dict(fcall(r, "lock_info", key))
    assert info[b"owner"] == b"uuid:7" and info[b"count"] == 1 and info[b"token"] is None
    r.persist(key)
    assert as_dict(fcall(r, "lock_info", key))[b"ttl"] == -1


# -- the layouts the module reads --------------------------------------------------------------


def test_a_redisson_hold_gets_a_token_at_its_first_reentry(r: redis.Redis, key: str) -> None:
    r.eval(REDISSON_LOCK, 1, key, 30000, "uuid:1")
    assert fcall(r, "lock_acquire", key, "uuid:2", 30000) is None
    token = fcall(r, "lock_acquire", key, "uuid:1", 30000)
    assert isinstance(token, int)
    assert r.hgetall(key) == {b"uuid:1": b"2", b"mode": f"exclusive:{token}".encode()}
    assert int(r.get(counter_of(key))) == token
    # And Redisson's script re-enters a hold the library took.
    assert r.eval(REDISSON_LOCK, 1, key, 30000, "uuid:1") is None
    assert r.hget(key, "uuid:1") == b"3"


def test_a_key_of_the_old_layout_is_read_and_converted(r: redis.Redis, key: str) -> None:
    r.hset(key, mapping={"w": 2, "__fence__": 77})
    r.pexpire(key, 30000)
    assert as_dict(fcall(r, "lock_info", key))[b"token"] == 77
    assert fcall(r, "lock_acquire", key, "w", 30000) == 77
    assert r.hgetall(key) == {b"w": b"3", b"mode": b"exclusive:77"}
    r.delete(key)
    r.hset(key, mapping={"w": 2, "__fence__": 77})
    assert fcall(r, "lock_release", key, "w", "TOKEN", 77) == 1
    assert r.hgetall(key) == {b"w": b"1", b"mode": b"exclusive:77"}
    r.delete(key)
    r.hset(key, mapping={"w": 2, "__fence__": 77})
    assert fcall(r, "lock_renew", key, "w", 30000) == 1
    assert r.hgetall(key) == {b"w": b"2", b"mode": b"exclusive:77"}


# -- refusals: the module's errors, and nothing changed ----------------------------------------

LEASE = f"ERR lease must be between 1 and {MAX_LEASE_MS} milliseconds"
NOT_INTEGER = "ERR value is not an integer or out of range"
SYNTAX = "ERR syntax error"
RESERVED_KEY = ("ERR keys starting with '__lock_fence__' are reserved for the lock module's "
                "fencing-token counters")
RESERVED_OWNER = "ERR owners 'mode', '__fence__' and '__mode__' are reserved for the lock's own fields"
EMPTY_OWNER = "ERR owner must not be empty"
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
NOT_A_LOCK = ("ERR the hash at this key is not a lock; LOCK.* commands leave it as it is (DEL "
              "removes a damaged lock)")
NO_BLOCK = ("ERR the redislock library cannot block: wait with WAIT timeout-ms TICKET and pop "
            "the ticket with BLPOP")
NOT_A_TICKET = "ERR not a ticket: LOCK.CANCEL takes the ticket a LOCK.* ... WAIT ... TICKET replied"


def arity(function: str) -> str:
    return f"ERR wrong number of arguments for '{function}' function"


BAD_INPUT = [
    # (function, key and arguments, error): each as LOCK.* answers it where it has the case.
    ("lock_acquire", ["held"], arity("lock_acquire")),
    ("lock_acquire", ["held", "w"], arity("lock_acquire")),
    ("lock_acquire", ["held", "w", 0], LEASE),
    ("lock_acquire", ["held", "w", -1], LEASE),
    ("lock_acquire", ["held", "w", MAX_LEASE_MS + 1], LEASE),
    ("lock_acquire", ["held", "w", "abc"], NOT_INTEGER),
    ("lock_acquire", ["held", "w", "1.5"], NOT_INTEGER),
    ("lock_acquire", ["held", "w", "010"], NOT_INTEGER),
    ("lock_acquire", ["held", "w", "+10"], NOT_INTEGER),
    ("lock_acquire", ["held", "w", "0", "FOO"], LEASE),
    ("lock_acquire", ["held", "w", 10, "FOO"], SYNTAX),
    ("lock_acquire", ["held", "w", 10, "ONCE", "once"], SYNTAX),
    ("lock_acquire", ["held", "w", 10, "WAIT"], SYNTAX),
    ("lock_acquire", ["held", "w", 10, "WAIT", "abc"], NOT_INTEGER),
    ("lock_acquire", ["held", "w", 10, "WAIT", -1], "ERR timeout is negative or out of range"),
    ("lock_acquire", ["held", "w", 10, "LIMIT", 0], "ERR LIMIT must be between 1 and 1000"),
    ("lock_acquire", ["held", "w", 10, "SHARED", "LIMIT", 2], SYNTAX),
    ("lock_acquire", ["held", "w", 10, "TICKET"], "ERR TICKET is a way to wait: it needs WAIT timeout-ms"),
    ("lock_acquire", ["held", "", 10], EMPTY_OWNER),
    ("lock_acquire", ["held", "", 0], EMPTY_OWNER),
    ("lock_acquire", ["held", "mode", 10], RESERVED_OWNER),
    ("lock_acquire", ["held", "__fence__", 10], RESERVED_OWNER),
    ("lock_acquire", ["held", "__mode__", 10], RESERVED_OWNER),
    ("lock_acquire", ["__lock_fence__x", "", 0], RESERVED_KEY),
    ("lock_acquire", ["held", "w", 10, "EPHEMERAL"],
     "ERR EPHEMERAL cannot be used from a script or function: it has no connection to bind the hold to"),
    # What the library does not do is refused, never ignored.
    ("lock_acquire", ["held", "w", 10, "WAIT", 100], NO_BLOCK),
    ("lock_acquire", ["held", "w", 10, "WAIT", 0], NO_BLOCK),
    ("lock_acquire", ["held", "w", 10, "SHARED"],
     "ERR the redislock library takes exclusive locks only (no SHARED or LIMIT)"),
    ("lock_acquire", ["held", "w", 10, "LIMIT", 3],
     "ERR the redislock library takes exclusive locks only (no SHARED or LIMIT)"),
    ("lock_release", ["held"], arity("lock_release")),
    ("lock_release", ["held", "w", "TOKEN"], arity("lock_release")),
    ("lock_release", ["held", "w", "TOKEN", 5, "x"], arity("lock_release")),
    ("lock_release", ["held", "w", "x", 5], SYNTAX),
    ("lock_release", ["held", "w", "TOKEN", "abc"], NOT_INTEGER),
    ("lock_release", ["held", "w", "TOKEN", -5], NOT_INTEGER),
    ("lock_release", ["held", "w", "TOKEN", "010"], NOT_INTEGER),
    ("lock_release", ["held", "w", "TOKEN", 2**64], NOT_INTEGER),
    ("lock_release", ["held", ""], EMPTY_OWNER),
    ("lock_release", ["held", "mode"], RESERVED_OWNER),
    ("lock_release", ["__lock_fence__{k}", "w"], RESERVED_KEY),
    ("lock_renew", ["held", "w"], arity("lock_renew")),
    ("lock_renew", ["held", "w", 0], LEASE),
    ("lock_renew", ["held", "w", "abc"], NOT_INTEGER),
    ("lock_renew", ["held", "", 10], EMPTY_OWNER),
    ("lock_renew", ["__lock_fence__{k}", "w", 10], RESERVED_KEY),
    ("lock_info", ["held", "x"], arity("lock_info")),
    ("lock_info", ["__lock_fence__{k}"], RESERVED_KEY),
    ("lock_forcerelease", ["held", "x"], arity("lock_forcerelease")),
    ("lock_forcerelease", ["__lock_fence__{k}"], RESERVED_KEY),
    ("lock_cancel", ["nope"], NOT_A_TICKET),
    ("lock_cancel", ["__lock_fence__ticket{k}12"], NOT_A_TICKET),
    ("lock_cancel", ["__lock_fence__ticket{k}12:"], NOT_A_TICKET),
    ("lock_cancel", ["__lock_fence__ticket{zz}12:held"], NOT_A_TICKET),
    ("lock_cancel", ["__lock_fence__ticket{k}x:k"], NOT_A_TICKET),
    ("lock_cancel", ["__lock_fence__ticket{k}12:k", "x"], arity("lock_cancel")),
]


@pytest.fixture
def scene(r: redis.Redis) -> Iterator[dict[bytes, tuple[bytes, int]]]:
    """A held lock `held`, a string, and the counter of `k`'s slot; the keyspace as it was."""
    r.flushall()
    fcall(r, "lock_acquire", "held", "w", 60000)
    fcall(r, "lock_acquire", "k", "w", 60000)
    r.set("s", "v")
    yield snapshot(r)


@pytest.mark.parametrize(("function", "args", "error"), BAD_INPUT)
def test_bad_input_gets_the_modules_error_and_changes_nothing(
    r: redis.Redis, scene: dict[bytes, tuple[bytes, int]], function: str, args: list[object],
    error: str
) -> None:
    assert error_of(r, function, *args) == error
    assert snapshot(r) == scene


def test_calls_without_their_key_are_refused(r: redis.Redis, scene: dict[bytes, tuple[bytes, int]]) -> None:
    for function, args in [("lock_acquire", ["held", "w", 10]), ("lock_release", ["held", "w"]),
                           ("lock_renew", ["held", "w", 10]), ("lock_info", ["held"]),
                           ("lock_forcerelease", ["held"])]:
        assert error_of(r, function, *args, keys=0) == arity(function)
        assert error_of(r, function, "held", "s", *args[1:], keys=2) == arity(function)
    assert error_of(r, "lock_version", "held", keys=1) == arity("lock_version")
    assert snapshot(r) == scene


FOREIGN = {
    "string": lambda r, k: r.set(k, "v"),
    "list": lambda r, k: r.rpush(k, "a"),
    "set": lambda r, k: r.sadd(k, "a"),
    "zset": lambda r, k: r.zadd(k, {"a": 1}),
    "stream": lambda r, k: r.xadd(k, {"a": 1}),
}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_a_key_of_another_type_is_wrongtype_and_untouched(r: redis.Redis, key: str, kind: str) -> None:
    FOREIGN[kind](r, key)
    before = snapshot(r)
    for function, args in [("lock_acquire", ["w", 10]), ("lock_acquire", ["w", 10, "ONCE"]),
                           ("lock_release", ["w"]), ("lock_renew", ["w", 10]), ("lock_info", []),
                           ("lock_forcerelease", [])]:
        assert error_of(r, function, key, *args) == WRONGTYPE
    assert snapshot(r) == before


NOT_LOCKS = [
    {"name": "ada"},  # a value that is no count
    {"a": "1", "b": "1"},  # two holders
    {"mode": "5"},  # a mode that is no layout
    {"w": "1", "mode": "exclusive:abc"},
    {"w": "1", "mode": "exclusive:0"},
    {"w": "0"},
    {"w": "-1"},
    {"w": "01"},
    {"w": "1", "mode": "exclusive:5", "__fence__": "5"},  # two tokens
    {"w": "1", "mode": "rw", "__mode__": "rw"},  # both mode names
    {"a": "1", "b": "1", "c": "1"},  # more than Redisson's two fields, no mode
]
MULTI_HOLD = [
    {"mode": "rw"},
    {"mode": "rw", "s:r1": "1:99999999999999:5"},
    {"mode": "semaphore:3", "p:a": "1:99999999999999:5", "p:b": "1:99999999999999:6"},
    {"__mode__": "rw", "s:r1": "1:99999999999999:5"},
]


@pytest.mark.parametrize("fields", NOT_LOCKS + MULTI_HOLD)
def test_a_hash_that_is_no_exclusive_lock_is_refused_and_untouched(
    r: redis.Redis, key: str, fields: dict[str, str]
) -> None:
    r.hset(key, mapping=fields)
    before = snapshot(r)
    want = NOT_A_LOCK if fields in NOT_LOCKS else (
        "ERR the key holds shared holds or semaphore permits, which the redislock library does "
        "not serve; use the module")
    for function, args in [("lock_acquire", ["w", 10]), ("lock_release", ["w"]),
                           ("lock_renew", ["w", 10]), ("lock_info", []), ("lock_forcerelease", [])]:
        assert error_of(r, function, key, *args) == want, (function, fields)
    assert snapshot(r) == before


def test_counts_and_tokens_a_double_cannot_carry_are_refused(r: redis.Redis, key: str) -> None:
    r.hset(key, mapping={"w": str(I64_MAX)})
    before = snapshot(r)
    assert error_of(r, "lock_acquire", key, "w", 10) == "ERR re-entry count would overflow"
    beyond = ("ERR this lock holds a count or token above 9007199254740991, which a Lua function "
              "cannot return exactly; use the module, or DEL the lock")
    assert error_of(r, "lock_release", key, "w") == beyond
    assert error_of(r, "lock_info", key) == beyond
    assert snapshot(r) == before
    # Up to 2^53 - 1 they are exact.
    r.hset(key, "w", str(MAX_EXACT + 1))
    assert fcall(r, "lock_release", key, "w") == MAX_EXACT
    assert r.hget(key, "w") == str(MAX_EXACT).encode()


# -- fencing tokens ------------------------------------------------------------------------------


def test_tokens_rise_across_release_and_reacquire(r: redis.Redis, key: str) -> None:
    tokens = []
    for i in range(200):
        tokens.append(fcall(r, "lock_acquire", key, f"w{i % 3}", 30000))
        assert fcall(r, "lock_release", key, f"w{i % 3}") == 0
    assert all(b > a for a, b in zip(tokens, tokens[1:])), tokens
    # Several a millisecond: the counter, not the clock, keeps them apart.
    assert len(set(t // 1000 for t in tokens)) < len(tokens)


def test_tokens_rise_across_a_del_of_the_lock_key(r: redis.Redis, key: str) -> None:
    first = fcall(r, "lock_acquire", key, "w", 30000)
    r.delete(key)
    second = fcall(r, "lock_acquire", key, "w", 30000)
    r.delete(key)
    third = fcall(r, "lock_acquire", key, "other", 30000)
    assert first < second < third


def test_tokens_rise_across_keys_of_one_slot(r: redis.Redis) -> None:
    tag = uuid.uuid4().hex
    a = fcall(r, "lock_acquire", f"{{{tag}}}:a", "w", 30000)
    b = fcall(r, "lock_acquire", f"{{{tag}}}:b", "w", 30000)
    assert isinstance(a, int) and isinstance(b, int) and b > a
    assert int(r.get(counter_of(f"{{{tag}}}:a"))) == b


def test_tokens_rise_across_flushall_by_the_clock(r: redis.Redis, key: str) -> None:
    """The counter goes with the data; the next token comes from the clock, which has moved on
    (the library keeps no memory, so within the same millisecond it could not tell)."""
    before = fcall(r, "lock_acquire", key, "w", 30000)
    r.flushall()
    while clock_floor(r) <= before:
        time.sleep(0.001)
    after = fcall(r, "lock_acquire", key, "w", 30000)
    assert isinstance(before, int) and isinstance(after, int) and after > before
    assert after >= clock_floor(r) - 1000 * 1000


def test_a_counter_ahead_of_the_clock_is_followed(r: redis.Redis, key: str) -> None:
    ahead = clock_floor(r) + 10**12
    r.set(counter_of(key), ahead)
    assert fcall(r, "lock_acquire", key, "w", 30000) == ahead + 1
    # A counter that holds no positive integer is no counter: the clock.
    for junk in ["abc", "0", "-5", "007"]:
        r.delete(key)
        r.set(counter_of(key), junk)
        floor = clock_floor(r)
        token = fcall(r, "lock_acquire", key, "w", 30000)
        assert isinstance(token, int) and floor <= token < floor + 10**9
        assert int(r.get(counter_of(key))) == token


def test_an_exhausted_counter_refuses_and_changes_nothing(r: redis.Redis, key: str) -> None:
    r.set(counter_of(key), I64_MAX)
    before = snapshot(r)
    assert error_of(r, "lock_acquire", key, "w", 10).startswith(
        "ERR fencing tokens exhausted: this key's '__lock_fence__{...}' counter is at the largest integer")
    r.set(counter_of(key), MAX_EXACT)
    assert error_of(r, "lock_acquire", key, "w", 10).startswith(
        "ERR fencing tokens exhausted for the redislock library")
    r.set(counter_of(key), I64_MAX)
    assert snapshot(r) == before
    r.set(counter_of(key), MAX_EXACT - 1)
    assert fcall(r, "lock_acquire", key, "w", 10000) == MAX_EXACT
    # The server is shared by this file's tests: a later key in this slot would find no token left.
    r.delete(key, counter_of(key))


def test_a_counter_of_another_type_is_left_alone(r: redis.Redis, key: str) -> None:
    r.rpush(counter_of(key), "x")
    try:
        before = snapshot(r)
        assert error_of(r, "lock_acquire", key, "w", 10).startswith(
            "ERR this key's fencing-token counter '__lock_fence__{...}' holds the wrong kind of value")
        assert snapshot(r) == before
    finally:
        # The server is shared by this file's tests: a later key in this slot (test_time_and_...
        # once in a full run) found this list where its counter goes.
        r.delete(counter_of(key))


# -- waiting in line, with tickets -----------------------------------------------------------------

#: The library's waiting constants (functions/redislock.lua): an entry not asked for again
#: within WAITER_LIVE_MS is passed over; a waiter is told to ask again within ASK_AGAIN_MAX_MS.
WAITER_LIVE_MS = 3000
ASK_AGAIN_MAX_MS = 1000


def line_of(key: str) -> tuple[str, str]:
    """The key's line: its sorted set and its hash (functions/redislock.lua `line_of`)."""
    tag = TAGS[slot_tags.key_slot(key.encode())]
    return f"__lock_fence__queue{{{tag}}}{key}", f"__lock_fence__waiters{{{tag}}}{key}"


def ask(r: redis.Redis, key: str, owner: str, lease: int = 30000, wait: int = 10000) -> object:
    return fcall(r, "lock_acquire", key, owner, lease, "ONCE", "WAIT", wait, "TICKET")


def ticket_reply(reply: object) -> tuple[bytes, int]:
    assert isinstance(reply, list) and len(reply) == 2, reply
    name, again = reply
    assert isinstance(name, bytes) and isinstance(again, int), reply
    return name, again


def holder(r: redis.Redis, key: str) -> bytes:
    fields = r.hgetall(key)
    owners = [f for f in fields if f != b"mode"]
    assert len(owners) == 1, fields
    return owners[0]


def test_a_wait_with_a_ticket_on_a_free_key_is_granted_at_once(r: redis.Redis, key: str) -> None:
    token = ask(r, key, "w")
    assert isinstance(token, int) and holder(r, key) == b"w"
    assert r.exists(*line_of(key)) == 0


def test_a_ticket_names_the_locks_slot_and_when_to_ask_again(r: redis.Redis, key: str) -> None:
    fcall(r, "lock_acquire", key, "h", 30000)
    name, again = ticket_reply(ask(r, key, "w"))
    tag = TAGS[slot_tags.key_slot(key.encode())]
    assert name.startswith(f"__lock_fence__ticket{{{tag}}}".encode())
    assert name.endswith(f":{key}".encode())
    assert slot_tags.key_slot(name) == slot_tags.key_slot(key.encode())
    assert again == ASK_AGAIN_MAX_MS  # the holder's lease is longer
    assert r.exists(name) == 0  # nothing is written into a ticket while it waits
    # A holder whose lease ends sooner: ask again at its end.
    other = f"{key}:short"
    fcall(r, "lock_acquire", other, "h", 300)
    _, again = ticket_reply(ask(r, other, "w"))
    assert 0 < again <= 300
    # The line's keys expire WAITER_LIVE_MS after the last ask: nothing outlives its waiters.
    for part in line_of(key):
        assert 0 < r.pttl(part) <= WAITER_LIVE_MS


def test_waiters_are_granted_in_arrival_order_by_the_releases(r: redis.Redis, key: str) -> None:
    first = fcall(r, "lock_acquire", key, "h", 30000)
    tickets = [ticket_reply(ask(r, key, f"w{i}", lease=20000 + i))[0] for i in range(5)]
    assert as_dict(r.execute_command("FCALL_RO", "lock_info", 1, key))[b"waiters"] == 5
    owner, last = "h", first
    for i, ticket in enumerate(tickets):
        assert fcall(r, "lock_release", key, owner) == 0
        # The head's hold is written and its token pushed into its ticket, which expires with
        # the hold; the others' tickets hold nothing.
        assert holder(r, key) == f"w{i}".encode()
        assert r.llen(ticket) == 1
        assert 0 < r.pttl(ticket) <= 20000 + i and 0 < r.pttl(key) <= 20000 + i
        assert all(r.exists(t) == 0 for t in tickets[i + 1:])
        token = int(r.lpop(ticket))
        assert token > last
        assert r.hget(key, "mode") == f"exclusive:{token}".encode()
        owner, last = f"w{i}", token
    assert fcall(r, "lock_release", key, owner) == 0
    assert r.exists(key, *line_of(key)) == 0


def test_a_handover_is_not_published_and_a_free_is(server: Server, r: redis.Redis, key: str) -> None:
    fcall(r, "lock_acquire", key, "h", 30000)
    ticket_reply(ask(r, key, "w"))
    before = publishes(server)
    fcall(r, "lock_release", key, "h")
    assert publishes(server) == before
    fcall(r, "lock_release", key, "w")
    assert publishes(server) == before + 1


def test_asking_again_keeps_the_place_and_never_counts_twice(r: redis.Redis, key: str) -> None:
    fcall(r, "lock_acquire", key, "h", 30000)
    a, _ = ticket_reply(ask(r, key, "a"))
    b, _ = ticket_reply(ask(r, key, "b"))
    assert ticket_reply(ask(r, key, "a"))[0] == a  # asked again: the same ticket, first still
    assert ticket_reply(ask(r, key, "b"))[0] == b
    fcall(r, "lock_release", key, "h")
    assert holder(r, key) == b"a" and r.exists(b) == 0
    # The waiter asks again after its grant was pushed (before it popped): its token, ONCE.
    token = int(r.lindex(a, 0))
    assert ask(r, key, "a") == token
    assert r.hget(key, "a") == b"1"


def test_a_newcomer_never_barges_past_the_line(r: redis.Redis, key: str) -> None:
    fcall(r, "lock_acquire", key, "h", 30000)
    ticket, _ = ticket_reply(ask(r, key, "w"))
    assert fcall(r, "lock_acquire", key, "newcomer", 30000) is None
    fcall(r, "lock_release", key, "h")
    assert fcall(r, "lock_acquire", key, "newcomer", 30000) is None
    assert holder(r, key) == b"w" and r.llen(ticket) == 1


def test_a_lease_that_ends_is_handed_over_by_the_next_call_on_the_key(r: redis.Redis, key: str) -> None:
    """No timer runs in a function: a lease that ends is seen by the next call on the key (here
    a newcomer's acquire, which still gets nil) or by the waiter asking again when its reply
    said (the holder's lease left), which is granted at once."""
    fcall(r, "lock_acquire", key, "h", 200)
    ticket, again = ticket_reply(ask(r, key, "w"))
    assert again <= 200
    time.sleep(0.3)
    assert r.exists(key) == 0  # expired, and nobody is told
    assert fcall(r, "lock_acquire", key, "newcomer", 30000) is None
    assert holder(r, key) == b"w" and r.llen(ticket) == 1
    fcall(r, "lock_forcerelease", key)  # (hands over to nobody: the line is empty)
    fcall(r, "lock_acquire", key, "h", 200)
    ticket_reply(ask(r, key, "w"))
    time.sleep(0.3)
    token = ask(r, key, "w")  # the waiter itself asks again: granted at the ask
    assert isinstance(token, int) and holder(r, key) == b"w"
    assert r.exists(*line_of(key)) == 0


@pytest.mark.parametrize("call", ["lock_release", "lock_renew", "lock_forcerelease"])
def test_every_call_that_finds_the_lease_ended_hands_over(r: redis.Redis, key: str, call: str) -> None:
    fcall(r, "lock_acquire", key, "h", 100)
    ticket, _ = ticket_reply(ask(r, key, "w"))
    time.sleep(0.2)
    args = {"lock_release": ["h"], "lock_renew": ["h", 1000], "lock_forcerelease": []}[call]
    assert fcall(r, call, key, *args) in (None, 0)
    assert holder(r, key) == b"w" and r.llen(ticket) == 1


def test_a_waiter_that_stops_asking_is_passed_over(r: redis.Redis, key: str) -> None:
    """A waiter whose process died asks no more: once its entry is WAITER_LIVE_MS old, the
    release passes over it to the next waiter, who kept asking."""
    fcall(r, "lock_acquire", key, "h", 30000)
    dead, _ = ticket_reply(ask(r, key, "dead", wait=0))
    alive, _ = ticket_reply(ask(r, key, "alive", wait=0))
    end = time.monotonic() + WAITER_LIVE_MS / 1000 + 0.2
    while time.monotonic() < end:
        assert ticket_reply(ask(r, key, "alive", wait=0))[0] == alive
        time.sleep(0.5)
    fcall(r, "lock_release", key, "h")
    assert holder(r, key) == b"alive" and r.llen(alive) == 1
    assert r.exists(dead) == 0
    assert r.exists(*line_of(key)) == 0  # the dead entry left the line with the grant


def test_a_waiter_whose_wait_ended_is_passed_over(r: redis.Redis, key: str) -> None:
    fcall(r, "lock_acquire", key, "h", 30000)
    short, _ = ticket_reply(ask(r, key, "short", wait=100))
    ticket_reply(ask(r, key, "long", wait=10000))
    time.sleep(0.2)
    fcall(r, "lock_release", key, "h")
    assert holder(r, key) == b"long" and r.exists(short) == 0


def test_a_waiter_passed_over_that_asks_again_joins_the_back(r: redis.Redis, key: str) -> None:
    fcall(r, "lock_acquire", key, "h", 30000)
    late, _ = ticket_reply(ask(r, key, "late", wait=100))
    ticket_reply(ask(r, key, "first"))
    time.sleep(0.2)
    fcall(r, "lock_release", key, "h")  # passes over "late" (past its wait) to "first"
    assert holder(r, key) == b"first"
    rejoined, _ = ticket_reply(ask(r, key, "late"))
    assert rejoined != late  # a new ticket, at the back of the line
    assert r.zrange(line_of(key)[0], 0, -1) == [b"late"]


def test_a_grant_nobody_pops_ends_with_its_lease(r: redis.Redis, key: str) -> None:
    """The cost of a waiter that died while still in the line: it is handed the key, and the
    next waiter gets it when that grant's lease ends (asking again when told)."""
    fcall(r, "lock_acquire", key, "h", 30000)
    dead, _ = ticket_reply(ask(r, key, "dead", lease=300))
    ticket_reply(ask(r, key, "next"))
    fcall(r, "lock_release", key, "h")
    assert holder(r, key) == b"dead"
    _, again = ticket_reply(ask(r, key, "next"))
    assert 0 < again <= 300
    time.sleep(again / 1000 + 0.1)
    assert r.exists(dead) == 0  # the ticket expired with its hold
    assert isinstance(ask(r, key, "next"), int) and holder(r, key) == b"next"


def test_a_line_reads_at_most_sixteen_dead_entries_a_call(r: redis.Redis, key: str) -> None:
    """Each call's work is bounded: it passes over at most 16 dead entries at the front of
    the line; a waiter behind more asks again and the next call reads on."""
    fcall(r, "lock_acquire", key, "h", 30000)
    for i in range(20):
        ticket_reply(ask(r, key, f"dead{i}", wait=50))
    alive, _ = ticket_reply(ask(r, key, "alive"))
    time.sleep(0.1)
    fcall(r, "lock_release", key, "h")
    assert r.exists(key) == 0  # 16 passed over, none due among them: freed, published
    assert r.zcard(line_of(key)[0]) == 5
    # It asks again: the 4 dead entries left are passed over, and it is granted at the ask.
    assert isinstance(ask(r, key, "alive"), int) and holder(r, key) == b"alive"
    assert r.exists(alive) == 0 and r.exists(*line_of(key)) == 0


def test_cancel_withdraws_a_waiting_ticket_and_takes_a_grant_nobody_popped(
    r: redis.Redis, key: str
) -> None:
    fcall(r, "lock_acquire", key, "h", 30000)
    a, _ = ticket_reply(ask(r, key, "a"))
    b, _ = ticket_reply(ask(r, key, "b"))
    c, _ = ticket_reply(ask(r, key, "c"))
    # Still waiting: it leaves the line, nil.
    assert fcall(r, "lock_cancel", a) is None
    assert r.zscore(line_of(key)[0], "a") is None
    fcall(r, "lock_release", key, "h")
    assert holder(r, key) == b"b"
    # Granted and not popped: the canceller takes the grant (the token), the ticket goes.
    token = int(r.lindex(b, 0))
    assert fcall(r, "lock_cancel", b) == token
    assert r.exists(b) == 0 and holder(r, key) == b"b"
    assert fcall(r, "lock_cancel", b) is None  # delivered once
    fcall(r, "lock_release", key, "b")
    assert holder(r, key) == b"c"
    # A grant whose hold ended (released by its owner's name) is nil, and the ticket goes.
    fcall(r, "lock_release", key, "c")
    assert fcall(r, "lock_cancel", c) is None and r.exists(c) == 0


def test_a_cancel_of_the_head_on_a_free_key_serves_the_next(r: redis.Redis, key: str) -> None:
    fcall(r, "lock_acquire", key, "h", 100)
    a, _ = ticket_reply(ask(r, key, "a"))
    b, _ = ticket_reply(ask(r, key, "b"))
    time.sleep(0.2)  # the lease ended, nobody touched the key
    assert fcall(r, "lock_cancel", a) is None
    assert holder(r, key) == b"b" and r.llen(b) == 1


def test_a_handover_reaches_a_replica_as_effects(server: Server, key: str, tmp_path: Path) -> None:
    server.client().config_set("repl-diskless-sync-delay", 0)
    replica = start_server(tmp_path, "--replicaof", "127.0.0.1", str(server.port), with_module=False)
    try:
        master = server.client()
        fcall(master, "lock_acquire", key, "h", 30000)
        ticket, _ = ticket_reply(ask(master, key, "w"))
        ticket_reply(ask(master, key, "next"))
        fcall(master, "lock_release", key, "h")
        wait_acknowledged(server, 1)
        copy = replica.client()
        assert copy.hgetall(key) == master.hgetall(key)
        for part in line_of(key):  # the line is data too: "next" still waits there
            assert copy.dump(part) == master.dump(part) is not None
        assert copy.lrange(ticket, 0, -1) == master.lrange(ticket, 0, -1)
        assert copy.execute_command("PEXPIRETIME", ticket) == master.execute_command("PEXPIRETIME", ticket)
        copy.close()
        master.close()
    finally:
        replica.proc.kill()
        replica.proc.wait()


def test_commands_per_acquisition_under_contention(server: Server, key: str) -> None:
    """N clients take turns on one key: each acquisition costs the client its acquire, its
    release and one BLPOP when it had to wait, no polling (counted with INFO commandstats)."""
    n, rounds = 8, 25
    server.client().config_resetstat()
    order: list[str] = []

    def worker(i: int) -> None:
        c = server.client()
        for _ in range(rounds):
            reply = ask(c, key, f"w{i}", wait=0)
            if isinstance(reply, list):
                name, _ = ticket_reply(reply)
                popped = c.blpop([name], timeout=30)
                assert popped is not None
            order.append(f"w{i}")
            assert fcall(c, "lock_release", key, f"w{i}") == 0
        c.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acquisitions = n * rounds
    assert len(order) == acquisitions
    stats = server.client().info("commandstats")
    fcalls = stats["cmdstat_fcall"]["calls"]
    pops = stats.get("cmdstat_blpop", {"calls": 0})["calls"]
    assert fcalls == 2 * acquisitions
    assert pops <= acquisitions


# -- where it runs -------------------------------------------------------------------------------


def test_time_and_writes_reach_a_replica_as_effects(server: Server, key: str,
                                                    tmp_path: Path) -> None:
    """Functions replicate their effects: TIME is read once, on the master, and the replica gets
    the counter, the hash and the lease as an absolute deadline (PEXPIRE goes as PEXPIREAT)."""
    server.client().config_set("repl-diskless-sync-delay", 0)
    replica = start_server(tmp_path, "--replicaof", "127.0.0.1", str(server.port), with_module=False)
    try:
        master = server.client()
        token = fcall(master, "lock_acquire", key, "w", 30000)
        wait_acknowledged(server, 1)
        copy = replica.client()
        assert copy.hgetall(key) == master.hgetall(key)
        assert copy.get(counter_of(key)) == str(token).encode()
        assert copy.execute_command("PEXPIRETIME", key) == master.execute_command("PEXPIRETIME", key)
        # The replica has the library (FUNCTION LOAD replicates) and reads with it.
        assert as_dict(copy.execute_command("FCALL_RO", "lock_info", 1, key))[b"token"] == token
        with pytest.raises(redis.ResponseError, match="READONLY|read only"):
            fcall(copy, "lock_acquire", key, "w", 30000)
        fcall(master, "lock_release", key, "w")
        wait_acknowledged(server, 1)
        assert copy.exists(key) == 0
        copy.close()
        master.close()
    finally:
        replica.proc.kill()
        replica.proc.wait()


def test_over_maxmemory_a_new_lock_is_refused_and_holders_go_on(tmp_path: Path) -> None:
    s = start_server(tmp_path, with_module=False)
    try:
        r = s.client()
        load(r)
        assert isinstance(fcall(r, "lock_acquire", "held", "w", 30000), int)
        r.config_set("maxmemory", 1)
        assert error_of(r, "lock_acquire", "new", "w", 30000) == (
            "OOM command not allowed when used memory > 'maxmemory'.")
        # A re-entry too: Redis refuses the whole function before it runs (the module admits it).
        assert error_of(r, "lock_acquire", "held", "w", 30000).startswith("OOM ")
        assert fcall(r, "lock_renew", "held", "w", 60000) == 1
        assert fcall(r, "lock_release", "held", "w") == 0
        assert fcall(r, "lock_forcerelease", "new") == 0
        assert fcall(r, "lock_info", "held") is None
        r.close()
    finally:
        s.proc.kill()
        s.proc.wait()


def test_in_cluster_mode_the_unlock_message_goes_to_the_shard_too(tmp_path: Path) -> None:
    """One node serving every slot: the counter (same slot, not declared) is usable from the
    function, and the unlock message goes by SPUBLISH too, for Redisson 3.22+, which waits with
    SSUBSCRIBE in a cluster (a key with a stray brace, whose channel is in another slot, gets
    PUBLISH only)."""
    s = start_server(tmp_path, "--cluster-enabled", "yes", with_module=False)
    try:
        r = s.client()
        r.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while b"cluster_state:ok" not in r.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, "the one-node cluster did not come up"
            time.sleep(0.05)
        load(r)
        key = f"{{orders}}:{uuid.uuid4().hex}"
        sub = r.pubsub()
        sub.ssubscribe(f"redisson_lock__channel:{key}")
        assert sub.get_sharded_message(timeout=5)["type"] == "ssubscribe"
        first = fcall(r, "lock_acquire", key, "w", 30000)
        assert int(r.get(counter_of(key))) == first
        published, sharded = s.commandstat("publish"), s.commandstat("spublish")
        assert fcall(r, "lock_release", key, "w") == 0
        assert (s.commandstat("publish"), s.commandstat("spublish")) == (published + 1, sharded + 1)
        message = sub.get_sharded_message(timeout=5)
        assert message["type"] == "smessage" and message["data"] == b"0"
        stray = "a{b" + uuid.uuid4().hex
        fcall(r, "lock_acquire", stray, "w", 30000)
        assert fcall(r, "lock_forcerelease", stray) == 1
        assert (s.commandstat("publish"), s.commandstat("spublish")) == (published + 2, sharded + 1)
        second = fcall(r, "lock_acquire", key, "w", 30000)
        assert isinstance(first, int) and isinstance(second, int) and second > first
        sub.close()
        r.close()
    finally:
        s.proc.kill()
        s.proc.wait()


LOCK_COMMANDS = ["+fcall", "+fcall_ro", "+hlen", "+hgetall", "+hget", "+hexists", "+hset",
                 "+hdel", "+pexpire", "+pttl", "+del", "+get", "+set", "+time", "+publish",
                 "+spublish", "+zrange", "+zrangebyscore", "+zcard", "+zadd", "+zrem", "+hmget",
                 "+lpush", "+lindex"]


def test_an_acl_user_needs_the_commands_keys_and_channel_the_functions_use(
    server: Server, r: redis.Redis, key: str
) -> None:
    """As on a managed service: the functions run as the caller, so its ACL must allow the
    commands they run, the counters' keys and the unlock channel (docs/functions.md). A refusal
    comes before any write."""
    def as_user(name: str) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=server.port, protocol=2, username=name,
                           password="pw")

    r.acl_setuser("lockapp", enabled=True, passwords=["+pw"], keys=["test:*", "__lock_fence__*"],
                  channels=["redisson_lock__channel:*"], commands=LOCK_COMMANDS, reset=True)
    # Like a managed service's default user: everything but the dangerous commands (INFO too).
    r.acl_setuser("managed", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                  categories=["+@all", "-@dangerous"], reset=True)
    for name in ["lockapp", "managed"]:
        with as_user(name) as u:
            token = fcall(u, "lock_acquire", key, "w", 30000)
            assert fcall(u, "lock_acquire", key, "w", 30000) == token
            assert fcall(u, "lock_renew", key, "w", 30000) == 1
            assert as_dict(u.execute_command("FCALL_RO", "lock_info", 1, key))[b"count"] == 2
            assert fcall(u, "lock_release", key, "w") == 1
            assert fcall(u, "lock_release", key, "w") == 0
            fcall(u, "lock_acquire", key, "w", 30000)
            assert fcall(u, "lock_forcerelease", key) == 1
            # Waiting in line: join, the handover, a cancel that takes the grant.
            fcall(u, "lock_acquire", key, "w", 30000)
            ticket, _ = ticket_reply(ask(u, key, "x"))
            assert fcall(u, "lock_release", key, "w") == 0
            assert isinstance(fcall(u, "lock_cancel", ticket), int)
            assert fcall(u, "lock_release", key, "x") == 0
            assert u.execute_command("FCALL_RO", "lock_version", 0) == 2
    # Without the counters' keys: no grant, nothing written.
    r.acl_setuser("nocounter", enabled=True, passwords=["+pw"], keys=["test:*"],
                  channels=["*"], commands=LOCK_COMMANDS, reset=True)
    before = snapshot(r)
    with as_user("nocounter") as u:
        assert "can't access at least one of the keys" in error_of_as(u, "lock_acquire", key, "w", 30000)
    assert snapshot(r) == before
    # Without the channel: a release that would free the lock is refused, the lock still held.
    r.acl_setuser("nochannel", enabled=True, passwords=["+pw"], keys=["test:*", "__lock_fence__*"],
                  channels=["other"], commands=LOCK_COMMANDS, reset=True)
    with as_user("nochannel") as u:
        fcall(u, "lock_acquire", key, "w", 30000)
        assert fcall(u, "lock_acquire", key, "w", 30000) is not None
        assert fcall(u, "lock_release", key, "w") == 1  # nothing to publish
        before = snapshot(r)
        assert "can't publish to the channel" in error_of_as(u, "lock_release", key, "w")
        assert "can't publish to the channel" in error_of_as(u, "lock_forcerelease", key)
        assert snapshot(r) == before
    for name in ["lockapp", "managed", "nocounter", "nochannel"]:
        r.acl_deluser(name)


def error_of_as(u: redis.Redis, function: str, *keys_then_args: object) -> str:
    with pytest.raises(redis.RedisError) as caught:
        fcall(u, function, *keys_then_args)
    return str(caught.value)


# -- one key, the module and the library -------------------------------------------------------


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server WITH the module ($LOCK_MODULE), the library loaded beside it."""
    s = start_server(tmp_path_factory.mktemp("mixed"))
    load(s.client())
    yield s
    s.proc.kill()
    s.proc.wait()


def test_tokens_rise_whichever_side_grants(mixed: Server, key: str) -> None:
    r = mixed.client()
    tokens = []
    for i in range(6):
        if i % 2 == 0:
            tokens.append(r.execute_command("LOCK.ACQUIRE", key, "w", 30000))
            assert r.execute_command("LOCK.RELEASE", key, "w") == 0
        else:
            tokens.append(fcall(r, "lock_acquire", key, "w", 30000))
            assert fcall(r, "lock_release", key, "w") == 0
    assert all(b > a for a, b in zip(tokens, tokens[1:])), tokens
    r.close()


def test_the_library_reads_the_modules_counter_in_every_slot_sampled(mixed: Server) -> None:
    """The module reserves a window above its token (a second of clock, or a millisecond's
    tokens past a token already ahead of the clock): the library's token, that bound + 1, shows
    it read the module's counter, not a counter of its own."""
    r = mixed.client()
    for _ in range(64):
        key = f"sample:{uuid.uuid4().hex}"
        by_module = r.execute_command("LOCK.ACQUIRE", key, "w", 30000)
        bound = int(r.get(counter_of(key)))
        assert bound > by_module
        r.execute_command("LOCK.RELEASE", key, "w")
        assert fcall(r, "lock_acquire", key, "w", 30000) == bound + 1
        fcall(r, "lock_release", key, "w")
    r.close()


def test_one_lock_whichever_side_holds_it(mixed: Server, key: str) -> None:
    r = mixed.client()
    token = r.execute_command("LOCK.ACQUIRE", key, "w", 30000)
    assert fcall(r, "lock_acquire", key, "other", 30000) is None
    assert fcall(r, "lock_acquire", key, "w", 30000) == token
    assert r.execute_command("LOCK.RELEASE", key, "w") == 1
    assert as_dict(fcall(r, "lock_info", key))[b"count"] == 1
    assert fcall(r, "lock_release", key, "w", "TOKEN", token) == 0
    token = fcall(r, "lock_acquire", key, "w", 30000)
    assert r.execute_command("LOCK.ACQUIRE", key, "other", 30000) is None
    module_info = as_dict(r.execute_command("LOCK.INFO", key))
    function_info = as_dict(fcall(r, "lock_info", key))
    for name in [b"owner", b"count", b"token", b"ephemeral", b"waiters", b"mode"]:
        assert module_info[name] == function_info[name], name
    assert r.execute_command("LOCK.RENEW", key, "w", 60000) == 1
    assert r.execute_command("LOCK.FORCERELEASE", key) == 1
    r.close()


LIBRARY_ONLY = {"WAIT", "SHARED", "LIMIT", "EPHEMERAL"}


def module_error(r: redis.Redis, function: str, *args: object) -> str:
    """`error_of` for the LOCK.* command a function mirrors (lock_acquire -> LOCK.ACQUIRE), with
    the arity error worded as the library words it."""
    command = "LOCK." + function.removeprefix("lock_").upper()
    line = error_line(r, [command, *args])
    return line.replace(f"'{command.lower()}' command", f"'{function}' function")


@pytest.mark.parametrize(("function", "args", "error"), [
    case for case in BAD_INPUT
    if not LIBRARY_ONLY & {str(a).upper() for a in case[1]} and case[1]  # the module serves these
])
def test_bad_input_errors_are_the_modules_own(mixed: Server, function: str, args: list[object],
                                              error: str) -> None:
    r = mixed.client()
    r.delete("held")
    fcall(r, "lock_acquire", "held", "w", 60000)
    assert module_error(r, function, *args) == error
    r.close()


@pytest.mark.parametrize("fields", NOT_LOCKS)
def test_the_hashes_the_library_refuses_the_module_refuses(mixed: Server, key: str,
                                                           fields: dict[str, str]) -> None:
    r = mixed.client()
    r.hset(key, mapping=fields)
    for function, args in [("lock_acquire", ["w", 10]), ("lock_release", ["w"]),
                           ("lock_renew", ["w", 10]), ("lock_info", []), ("lock_forcerelease", [])]:
        assert module_error(r, function, key, *args) == error_of(r, function, key, *args) == NOT_A_LOCK
    r.close()


def test_the_same_steps_get_the_same_replies_from_both(mixed: Server) -> None:
    """One script of calls, once as LOCK.* commands on one key and once as functions on
    another: the replies agree, tokens compared by the order they came in."""
    steps: list[tuple[str, list[object]]] = [
        ("lock_info", []), ("lock_release", ["w"]), ("lock_renew", ["w", 5000]),
        ("lock_acquire", ["w", 30000]), ("lock_acquire", ["x", 30000]),
        ("lock_acquire", ["w", 30000]), ("lock_acquire", ["w", 30000, "ONCE"]),
        ("lock_renew", ["x", 5000]), ("lock_renew", ["w", 5000]),
        ("lock_release", ["w", "TOKEN", 1]), ("lock_release", ["x"]), ("lock_release", ["w"]),
        ("lock_info", []), ("lock_release", ["w"]), ("lock_acquire", ["x", 30000, "once"]),
        ("lock_acquire", ["x", 30000]), ("lock_forcerelease", []), ("lock_forcerelease", []),
        ("lock_info", []), ("lock_acquire", ["w", 30000]), ("lock_release", ["w", "TOKEN", "$1"]),
        ("lock_release", ["w", "TOKEN", "$3"]), ("lock_info", []),
    ]
    r = mixed.client()

    def run(call: object, key: str) -> list[object]:
        tokens: list[int] = []
        replies: list[object] = []
        for function, args in steps:
            args = [tokens[int(a[1:]) - 1] if isinstance(a, str) and a.startswith("$") else a
                    for a in args]
            reply = call(function, key, *args)  # type: ignore[operator]
            if function == "lock_info" and reply is not None:
                info = as_dict(reply)
                info.pop(b"holders")
                assert 0 < info.pop(b"ttl") <= 30000  # type: ignore[operator]
                reply = sorted(info.items())
            if function == "lock_acquire" and isinstance(reply, int):
                if reply not in tokens:
                    tokens.append(reply)
                reply = f"token {tokens.index(reply) + 1}"
            if function == "lock_info" and isinstance(reply, list):
                reply = [(k, f"token {tokens.index(v) + 1}" if k == b"token" else v)
                         for k, v in reply]
            replies.append(reply)
        return replies

    by_module = run(lambda f, *a: r.execute_command("LOCK." + f.removeprefix("lock_").upper(), *a),
                    f"mod:{uuid.uuid4().hex}")
    by_library = run(lambda f, *a: fcall(r, f, *a), f"fn:{uuid.uuid4().hex}")
    assert by_library == by_module
    r.close()


def test_the_same_waits_get_the_same_answers_from_both(mixed: Server) -> None:
    """One script of waits with tickets, as LOCK.* commands on one key and as functions on
    another: the same grants in the same order, the same values in the tickets (the token, as
    digits), the same answers to a cancel. The library's ticket reply also says when to ask
    again; the module's is the name alone."""
    r = mixed.client()

    def run(call: object, key: str) -> list[object]:
        do = call  # type: ignore[assignment]
        out: list[object] = []
        do("lock_acquire", key, "h", 30000)  # type: ignore[operator]
        tickets = []
        for owner in ["a", "b", "c"]:
            reply = do("lock_acquire", key, owner, 30000, "ONCE", "WAIT", 10000, "TICKET")  # type: ignore[operator]
            name = reply[0] if isinstance(reply, list) else reply
            assert isinstance(name, bytes) and name.startswith(b"__lock_fence__ticket{")
            tickets.append(name)
        out.append(do("lock_acquire", key, "newcomer", 30000))  # type: ignore[operator]
        out.append(do("lock_cancel", tickets[0]))  # type: ignore[operator]  # queued: nil
        out.append(do("lock_release", key, "h"))  # type: ignore[operator]
        popped = r.blpop([tickets[1]], timeout=5)
        assert popped is not None
        out.append(holder(r, key))
        out.append(r.hget(key, "mode") == b"exclusive:" + popped[1])
        out.append(do("lock_release", key, "b"))  # type: ignore[operator]
        granted = r.lindex(tickets[2], 0)
        out.append(do("lock_cancel", tickets[2]) == int(granted))  # type: ignore[operator]
        out.append(r.exists(tickets[2]))
        out.append(holder(r, key))
        out.append(do("lock_cancel", tickets[2]))  # type: ignore[operator]
        out.append(do("lock_release", key, "c"))  # type: ignore[operator]
        out.append(r.exists(key))
        return out

    def module(f: str, *a: object) -> object:
        if f == "lock_cancel":
            return r.execute_command("LOCK.CANCEL", *a)
        return r.execute_command("LOCK." + f.removeprefix("lock_").upper(), *a)

    by_module = run(module, f"mod:{uuid.uuid4().hex}")
    by_library = run(lambda f, *a: fcall(r, f, *a), f"fn:{uuid.uuid4().hex}")
    assert by_library == by_module == [None, None, 0, b"b", True, 0, True, 0, b"c", None, 0, 0]
    r.close()
