"""A worker process of the oracle: a few holders on the sync API, each a thread, printing their
events as JSON lines on stdout (the test process reads them). It runs until it is killed: the
oracle SIGKILLs and SIGSTOPs it at random, and kills it at the end of the run.

    python -m oracle.worker '<json: {"url"|"cluster", "ctx", "lost_signal", "specs": [...]}>'
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import redis
import redis.cluster

from oracle.holders import Spec, SyncHolder, redis_check
from redis_lock_client import LockClient


def main() -> None:
    config = json.loads(sys.argv[1])
    ctx = config["ctx"]
    out = threading.Lock()

    def record(event: dict[str, Any]) -> None:
        line = json.dumps(event)
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    name = f"oracle-{ctx}"
    if "cluster" in config:
        host, port = "127.0.0.1", config["cluster"][0]
        client = LockClient(redis.cluster.RedisCluster(host=host, port=port, client_name=name),
                            lost_signal=config["lost_signal"])
        raw: Any = redis.cluster.RedisCluster(host=host, port=port, client_name="oracle-check")
    else:
        client = LockClient.from_url(config["url"], client_name=name,
                                     lost_signal=config["lost_signal"])
        raw = redis.Redis.from_url(config["url"], client_name="oracle-check")
    check = redis_check(raw)
    stop = threading.Event()
    holders = [SyncHolder(client, Spec(**s), check, record, stop) for s in config["specs"]]
    threads = [threading.Thread(target=h.run, daemon=True) for h in holders]
    for t in threads:
        t.start()
    record({"e": "ready", "ctx": ctx, "h": ctx, "t": time.monotonic()})
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
