"""Time SETs and GETs of large items through one server (memcached text protocol with
pymemcache, or RESP with redis-py) and check every GET byte for byte.
Usage: large-values.py memcached|redis PORT SIZE_BYTES COUNT
Prints one JSON object: medians of the SET and GET times (ms) over COUNT items of SIZE bytes,
and MB/s at those medians."""
import json
import os
import statistics
import sys
import time

proto, port, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if proto == "memcached":
    from pymemcache.client.base import Client

    c = Client(("127.0.0.1", port), default_noreply=False)
    put, get = (lambda k, v: c.set(k, v)), c.get
else:
    import redis

    c = redis.Redis(host="127.0.0.1", port=port)
    put, get = c.set, c.get
values = [os.urandom(size) for _ in range(min(count, 4))]
sets, gets = [], []
for i in range(count):
    v = values[i % len(values)]
    t = time.perf_counter()
    if not put(f"large{i % 8}", v):
        sys.exit(f"SET of {size} bytes refused")
    sets.append(time.perf_counter() - t)
    t = time.perf_counter()
    got = get(f"large{i % 8}")
    gets.append(time.perf_counter() - t)
    if got != v:
        sys.exit(f"GET of {size} bytes returned {len(got or b'')} bytes that differ")
s, g = statistics.median(sets), statistics.median(gets)
print(json.dumps({"size": size, "count": count, "set_ms": round(s * 1e3, 3), "get_ms": round(g * 1e3, 3),
                  "set_mb_s": round(size / s / 1e6, 1), "get_mb_s": round(size / g / 1e6, 1)}))
