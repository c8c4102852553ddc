#!/usr/bin/env python3
"""Fill a memcached-protocol server to refusal, one `set` after another (pymemcache).

  cache-fill.py fill PORT              values of 64..4096 B (the mix `nessie bench fill` uses)
  cache-fill.py refill PORT TTL WAIT   items of 4000 B with exptime TTL until the store is full
                                       (a refusal, or a set that waits for room), WAIT seconds
                                       of sleep, then new items (no TTL) until refusal

Prints one JSON object: items stored, seconds taken (the refused set included), and for
refill the items of the second fill. Used by scripts/cache-vs-memcached.sh.
"""
import json
import random
import sys
import time

from pymemcache.client.base import Client

LIMIT_S = 600  # a fill that takes longer is reported as unfinished


# A set slower than this means a full store waiting for room (expired items come back).
SLOW_SET_S = 0.5


def fill(c, prefix, ttl, rng, fixed=None, stop_when_slow=False):
    t0 = time.monotonic()
    n = 0
    end = "time limit"
    while time.monotonic() - t0 < LIMIT_S:
        v = b"x" * (fixed or rng.randint(64, 4096))
        t = time.monotonic()
        if stop_when_slow and n > 0 and t - last > SLOW_SET_S:
            end = "a set waited for room"
            break
        last = t
        try:
            ok = c.set(b"%s%d" % (prefix, n), v, expire=ttl, noreply=False)
        except Exception as e:  # pymemcache raises MemcacheServerError on SERVER_ERROR
            end = str(e)
            break
        if not ok:
            end = "NOT_STORED"
            break
        n += 1
    return n, time.monotonic() - t0, end


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    c = Client(("127.0.0.1", port), timeout=60)
    rng = random.Random(7)
    if mode == "fill":
        n, t, end = fill(c, b"k", 0, rng)
        print(json.dumps({"items": n, "seconds": round(t, 3), "end": end}))
    elif mode == "refill":
        ttl, wait = int(sys.argv[3]), float(sys.argv[4])
        n1, t1, end1 = fill(c, b"a", ttl, rng, fixed=4000, stop_when_slow=True)
        time.sleep(wait)
        n2, t2, end2 = fill(c, b"b", 0, rng, fixed=4000)
        print(json.dumps({"items": n1, "seconds": round(t1, 3), "end": end1,
                          "refilled": n2, "refill_seconds": round(t2, 3), "refill_end": end2}))
    else:
        sys.exit(f"unknown mode {mode!r}: fill or refill")


if __name__ == "__main__":
    main()
