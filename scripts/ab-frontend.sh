#!/usr/bin/env bash
# Two nessie binaries side by side through the Redis front end: redis-benchmark SET and GET
# of 100-byte values, 4 clients, without and with -P 16 pipelining, against node 0 of a
# 2-node cluster over shared memory; REPS rounds, the binaries alternated in each, medians and
# the ratio new/old. For a change on the front end's path (issue 41: the large-value layer).
# TRANSPORT=tcp runs the cluster over loopback TCP instead (where READs can overlap); KEYS
# sets redis-benchmark's -r (10000; with few REQUESTS make it smaller, so that GETs hit).
# UP_ARGS adds flags to both clusters' `nessie up` (e.g. "--frontend-inflight 16").
# Usage: [TRANSPORT=shm|tcp] [KEYS=N] [UP_ARGS=...] bash scripts/ab-frontend.sh OLD_BINARY NEW_BINARY [REPS] [REQUESTS] [VALUE_BYTES]
set -euo pipefail
OLD=$1
NEW=$2
REPS=${3:-5}
N=${4:-100000}
SIZE=${5:-100}
TRANSPORT=${TRANSPORT:-shm}
KEYS=${KEYS:-10000}
read -r -a UP_EXTRA <<<"${UP_ARGS:-}"
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (apt-get install redis-tools)" >&2; exit 1; }
DIR=$(mktemp -d /tmp/nessie-ab-XXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cleanup() {
    "$OLD" down --dir "$DIR/c" >/dev/null 2>&1 || true
    "$NEW" down --dir "$DIR/c" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
one() { # binary label
    local port
    port=$(free_port)
    "$1" up --dir "$DIR/c" --nodes 2 --no-etcd --resp-port "$port" --workers 4 --transport "$TRANSPORT" \
        --memory-per-node 256MiB --expiry-ms 200 --item-max 16M "${UP_EXTRA[@]}" >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log" >&2; exit 1; }
    for p in 1 16; do
        redis-benchmark -p "$port" -t set,get -n "$N" -c 4 -d "$SIZE" -P "$p" -r "$KEYS" --csv 2>/dev/null |
            awk -F, -v b="$2" -v p="$p" 'NR > 1 { gsub(/"/, ""); print b, $1 "-P" p, $2 }' >>"$DIR/rates"
    done
    "$1" down --dir "$DIR/c" >/dev/null 2>&1
    rm -rf "$DIR/c"
}
for r in $(seq "$REPS"); do
    if [ $((r % 2)) = 1 ]; then one "$OLD" old; one "$NEW" new; else one "$NEW" new; one "$OLD" old; fi
done
python3 - "$DIR/rates" <<'PY'
import statistics, sys, collections
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, test, rps = line.split()
    rates[(b, test)].append(float(rps))
for test in sorted({t for _, t in rates}):
    o, n = statistics.median(rates[("old", test)]), statistics.median(rates[("new", test)])
    print(f"{test:8} old {o:>10.0f}/s  new {n:>10.0f}/s  new/old {n / o:.3f}  (runs: {len(rates[('old', test)])})")
PY
