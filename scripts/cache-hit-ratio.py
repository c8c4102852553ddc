#!/usr/bin/env python3
"""A cache-aside trace against one cache, for its hit ratio (scripts/cache-hit-ratio.sh).

Usage: cache-hit-ratio.py PROTOCOL PORT KEYS REQUESTS VALUE_BYTES [ZIPF_S] [SEED]
  PROTOCOL  memcached (pymemcache) or redis (redis-py)
  PORT      on 127.0.0.1; for memcached, PORT,PORT,... spreads the keys over those servers by
            hash (pymemcache's HashClient, as a memcached client given several servers does)
  KEYS      the key space; REQUESTS keys are drawn from it by a Zipf law of exponent ZIPF_S
            (default 0.99), the same sequence for every cache with the same SEED (default 1)
Each request GETs its key; on a miss it SETs the key (the application fetched it from the
backing store), as a cache-aside application does. The first half of the requests warms the
cache; the hit ratio is that of the second half. Prints one JSON object: hits, misses,
hit_ratio, errors (failed GETs or SETs, each counted and the trace goes on), seconds.
"""

import bisect
import json
import random
import sys
import time


def zipf_cdf(n, s):
    """Cumulative weights of ranks 1..n under a Zipf law of exponent s."""
    total, cdf = 0.0, []
    for rank in range(1, n + 1):
        total += 1.0 / rank**s
        cdf.append(total)
    return [c / total for c in cdf]


def client(protocol, ports):
    if protocol == "memcached" and len(ports) > 1:
        from pymemcache.client.hash import HashClient

        servers = [("127.0.0.1", p) for p in ports]
        # Errors raised, not swallowed: each is counted by the trace.
        c = HashClient(servers, connect_timeout=5, timeout=10, ignore_exc=False, retry_attempts=1)
        return c.get, lambda k, v: c.set(k, v, noreply=False)
    port = ports[0]
    if protocol == "memcached":
        from pymemcache.client.base import Client

        c = Client(("127.0.0.1", port), connect_timeout=5, timeout=10)
        return c.get, lambda k, v: c.set(k, v, noreply=False)
    if protocol == "redis":
        import redis

        r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        return r.get, r.set
    sys.exit(f"unknown protocol {protocol!r}: memcached or redis")


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    protocol, ports = sys.argv[1], [int(p) for p in sys.argv[2].split(",")]
    if len(ports) > 1 and protocol != "memcached":
        sys.exit("several ports only with the memcached protocol")
    keys, requests, value_bytes = (int(a) for a in sys.argv[3:6])
    s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.99
    seed = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    if keys < 1 or requests < 2 or value_bytes < 1:
        sys.exit("KEYS, REQUESTS (at least 2) and VALUE_BYTES must be positive")
    cdf = zipf_cdf(keys, s)
    rng = random.Random(seed)
    # Ranks are scattered over the key names, so that hot keys are not neighbours.
    names = list(range(keys))
    random.Random(seed + 1).shuffle(names)
    get, put = client(protocol, ports)
    value = b"v" * value_bytes
    hits = misses = errors = 0
    start = time.monotonic()
    for i in range(requests):
        rank = min(bisect.bisect_left(cdf, rng.random()), keys - 1)
        key = f"key:{names[rank]}"
        try:
            found = get(key) is not None
        except Exception:  # a failed GET: counted, and the trace goes on
            errors += 1
            continue
        if i >= requests // 2:
            hits += found
            misses += not found
        if not found:
            try:
                put(key, value)
            except Exception:
                errors += 1
    seconds = time.monotonic() - start
    print(
        json.dumps(
            {
                "hits": hits,
                "misses": misses,
                "hit_ratio": hits / max(1, hits + misses),
                "errors": errors,
                "seconds": round(seconds, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
