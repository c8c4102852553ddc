#!/usr/bin/env python3
"""How long a restarted node takes to be up again, by value size.

For each run and each value size (taking turns, so that both see the same machine): a 3-node
cluster over TCP with 2 copies (`nessie up --transport tcp --replicas 2`), KEYS keys of that
size loaded through the memcached front ends, node 1 killed (SIGKILL) and, once membership says
it failed, started again by hand; then the time from its start until every node is `up` with
no table under-replicated, and what its catch-up did (its log). Medians at the end.

    bash scripts/rejoin-time.sh [RUNS] [KEYS] [SIZE ...]     (defaults: 3 1000 100 20000)

Needs the release binary (the .sh wrapper builds it; NESSIE_BIN=path runs another, to
compare builds) and pymemcache (python3-pymemcache).
"""

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from pymemcache.client.base import Client

BIN = os.environ.get("NESSIE_BIN") or os.path.join(os.path.dirname(__file__), "..", "target", "release", "nessie")
NODES = 3
VALUE_MAX = 20480
LIMIT_S = 300


def free_base(n):
    """A base port with n free loopback ports from it."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return base
    sys.exit("rejoin-time: no free port range")


def nessie(d, *args, check=True):
    return subprocess.run([BIN, *args, "--dir", d], capture_output=True, text=True, check=check)


def status(d):
    out = nessie(d, "status", "--json", check=False)
    try:
        return json.loads(out.stdout)["nodes"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None


def wait_until(d, what, done):
    t0 = time.monotonic()
    while True:
        s = status(d)
        if s and done(s):
            return time.monotonic() - t0
        if time.monotonic() - t0 > LIMIT_S:
            sys.exit(f"rejoin-time: {what} not reached in {LIMIT_S} s: {s}")
        time.sleep(0.1)


def one(size, keys):
    d = tempfile.mkdtemp(prefix="nessie-rejoin-")
    os.chmod(d, 0o700)
    restarted = None
    try:
        base = free_base(NODES)
        nessie(d, "up", "--nodes", str(NODES), "--transport", "tcp", "--replicas", "2",
               "--value-max", str(VALUE_MAX), "--memcached-port", str(base))
        clients = [Client(("127.0.0.1", base + n)) for n in range(NODES)]
        value = os.urandom(size // 2 + 1).hex()[:size].encode()
        for k in range(keys):
            if not clients[k % NODES].set(f"key-{k}", value, noreply=False):
                sys.exit(f"rejoin-time: set key-{k} ({size} B) refused")
        for c in clients:
            c.close()
        with open(os.path.join(d, "node-1.pid")) as f:
            os.kill(int(f.read().split()[0]), signal.SIGKILL)
        wait_until(d, "node 1 failed", lambda s: s[1].get("state") == "failed")
        log = open(os.path.join(d, "restarted-1.log"), "w")
        restarted = subprocess.Popen([BIN, "node", "--config", os.path.join(d, "cluster.toml"), "--id", "1"],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        took = wait_until(d, "every node up, every table with both copies",
                          lambda s: all(n.get("state") == "up" for n in s)
                          and sum(n.get("under_replicated") or 0 for n in s) == 0
                          and all(n.get("under_replicated") is not None for n in s))
        caught = ""
        with open(os.path.join(d, "restarted-1.log")) as f:
            m = re.search(r"caught up \((.*)\); ready", f.read())
            caught = m.group(1) if m else "(no catch-up line)"
        return took, caught
    finally:
        if restarted:
            restarted.kill()
            restarted.wait()
        nessie(d, "down", check=False)
        shutil.rmtree(d, ignore_errors=True)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    keys = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    sizes = [int(s) for s in sys.argv[3:]] or [100, 20000]
    if any(s < 1 or s > 20000 for s in sizes):
        sys.exit(f"rejoin-time: value sizes must be in 1..=20000 (the memcached item header takes the rest of --value-max {VALUE_MAX})")
    took = {s: [] for s in sizes}
    for run in range(runs):
        for size in sizes if run % 2 == 0 else reversed(sizes):
            t, caught = one(size, keys)
            took[size].append(t)
            print(f"run {run + 1}, {keys} keys of {size} B: up again {t:.1f} s after its restart; caught up: {caught}",
                  flush=True)
    print()
    first = statistics.median(took[sizes[0]])
    for s in sizes:
        m = statistics.median(took[s])
        print(f"{s:>6} B values: median {m:.1f} s over {runs} runs ({m / first:.2f}x the {sizes[0]} B median)")


if __name__ == "__main__":
    main()
