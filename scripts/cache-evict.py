#!/usr/bin/env python3
"""Write 40,000 items of 64..4096 B, one `set` after another (pymemcache), to a memcached-protocol
server on 127.0.0.1:PORT, and print how many sets failed and how long it took: a store smaller
than that must evict to take them all (docs/frontends.md, "When the store is full").

  cache-evict.py PORT
"""
import random
import sys
import time

from pymemcache.client.base import Client

ITEMS = 40_000


def main():
    c = Client(("127.0.0.1", int(sys.argv[1])), timeout=30)
    t0 = time.monotonic()
    errors = 0
    for i in range(ITEMS):
        try:
            if not c.set(b"k%d" % i, b"x" * random.Random(i).randint(64, 4096), noreply=False):
                errors += 1
        except Exception:  # pymemcache raises MemcacheServerError on SERVER_ERROR
            errors += 1
    print(f"{ITEMS} sets, {errors} errors, {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    main()
