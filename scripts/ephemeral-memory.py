#!/usr/bin/env python3
"""What an EPHEMERAL binding costs in used_memory, by how many holds each connection has.

    make build && python3 scripts/ephemeral-memory.py [connections holds-per-connection ...]

For each shape it starts two fresh servers with the release module, opens the connections,
has each take its holds (distinct keys "m:00000", owner "holder-1", 60 s lease) plain on one
server and EPHEMERAL on the other, waits until Redis has trimmed the idle connections' buffers
and finished rehashing, and prints used_memory growth per hold for both and the difference.
"""
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.environ.get("MOD", os.path.join(HERE, "..", "target", "release", "libredis_lock.so"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send(sock, *args):
    sock.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))


def read_replies(sock, n):
    data = b""
    while data.count(b"\r\n") < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        data += chunk
    if b"-ERR" in data:
        raise RuntimeError(data.decode(errors="replace"))


def used_memory(admin):
    send(admin, b"INFO", b"memory")
    data = b""
    while b"used_memory:" not in data or not data.endswith(b"\r\n"):
        data += admin.recv(1 << 20)
    line = next(l for l in data.decode().split("\r\n") if l.startswith("used_memory:"))
    return int(line.split(":")[1])


def settled(admin):
    """used_memory once idle buffers are trimmed (clientsCron visits every client within ~1 s)."""
    time.sleep(4)
    last = used_memory(admin)
    for _ in range(30):
        time.sleep(0.2)
        now = used_memory(admin)
        if now == last:
            break
        last = now
    return last


def per_hold(connections, holds, options):
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--maxclients", str(connections + 100), "--loadmodule", MODULE],
        stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                admin = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.05)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
        for s in socks:
            send(s, b"PING")
        for s in socks:
            read_replies(s, 1)
        send(socks[0], b"LOCK.ACQUIRE", b"warm", b"o", b"60000", *options)
        read_replies(socks[0], 1)
        before = settled(admin)
        key = 0
        for s in socks:
            for _ in range(holds):
                send(s, b"LOCK.ACQUIRE", b"m:%05d" % key, b"holder-1", b"60000", *options)
                key += 1
        for s in socks:
            read_replies(s, holds)
        after = settled(admin)
        return (after - before) / (connections * holds)
    finally:
        server.kill()
        server.wait()


def main():
    args = [int(a) for a in sys.argv[1:]] or [1000, 1, 500, 2, 100, 10, 1, 1000]
    print("| connections | holds each | plain B/hold | EPHEMERAL B/hold | binding B/hold |")
    print("|--:|--:|--:|--:|--:|")
    for connections, holds in zip(args[::2], args[1::2]):
        plain = per_hold(connections, holds, [])
        bound = per_hold(connections, holds, [b"EPHEMERAL"])
        print(f"| {connections} | {holds} | {plain:.0f} | {bound:.0f} | {bound - plain:.0f} |")


if __name__ == "__main__":
    main()
