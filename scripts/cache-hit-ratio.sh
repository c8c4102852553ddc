#!/usr/bin/env bash
# Hit ratio of a cache-aside Zipf trace (scripts/cache-hit-ratio.py), the same trace against
# memcached (-m MEM, evicting LRU as by default), redis-server (maxmemory MEM, allkeys-lru) and
# Nessie (2 node processes of MEM/2 over shared memory, --eviction POLICY, the keys spread over
# both nodes' memcached front ends by hash, as a memcached client given both servers does;
# NESSIE_FRONTENDS=1 uses node 0's only), REPS rounds of each, alternated, with the medians.
# Usage: bash scripts/cache-hit-ratio.sh [REPS] [MEM_MIB] [KEYS] [REQUESTS] [VALUE_BYTES] [POLICY]
# Defaults: 3 rounds, 64 MiB, 240,000 keys of 1,000 B values (about 4x what 64 MiB holds),
# 400,000 requests (the second half measured), Zipf 0.99, allkeys-lru. NESSIE_ARGS adds flags
# to `nessie up` (e.g. NESSIE_ARGS="--expiry-ms 100"); SYSTEMS="nessie" runs only those.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
MEM=${2:-64}
KEYS=${3:-240000}
REQUESTS=${4:-400000}
VALUE=${5:-1000}
POLICY=${6:-allkeys-lru}
[ "$MEM" -ge 2 ] && [ $((MEM % 2)) = 0 ] || { echo "MEM_MIB must be an even number of MiB, at least 2" >&2; exit 2; }
for tool in memcached redis-server; do
    command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install memcached redis-server)" >&2; exit 1; }
done
PY=${PYTHON:-python3}
"$PY" -c 'import pymemcache, redis' 2>/dev/null || { echo "needs pymemcache and redis-py for $PY (apt-get install python3-pymemcache python3-redis)" >&2; exit 1; }
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
DIR=$(mktemp -d /tmp/nessie-hits-XXXX)
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PID=
cleanup() {
    [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
    "$NESSIE" down --dir "$DIR/c" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
USER_ARG=()
[ "$(id -u)" = 0 ] && USER_ARG=(-u nobody)
wait_port() { for _ in $(seq 50); do "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null && return; sleep 0.1; done; echo "nothing listens on $1" >&2; exit 1; }
run() { # system -> one JSON line
    local port proto=memcached
    port=$(free_port)
    case "$1" in
    memcached)
        memcached "${USER_ARG[@]}" -p "$port" -l 127.0.0.1 -U 0 -m "$MEM" & PID=$! ;;
    redis)
        proto=redis
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
            --maxmemory "${MEM}mb" --maxmemory-policy allkeys-lru >/dev/null & PID=$! ;;
    nessie)
        "$NESSIE" up --dir "$DIR/c" --nodes 2 --memory-per-node "$((MEM / 2))MiB" --memcached-port "$port" \
            --no-etcd --eviction "$POLICY" ${NESSIE_ARGS:-} >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log" >&2; exit 1; } ;;
    esac
    wait_port "$port"
    local ports=$port
    if [ "$1" = nessie ] && [ "${NESSIE_FRONTENDS:-2}" = 2 ]; then
        wait_port $((port + 1)) # node 1's front end: the base port + 1
        ports="$port,$((port + 1))"
    fi
    echo "{\"system\": \"$1\", \"result\": $("$PY" scripts/cache-hit-ratio.py "$proto" "$ports" "$KEYS" "$REQUESTS" "$VALUE")}" | tee -a "$DIR/runs.jsonl"
    if [ "$1" = nessie ]; then
        "$NESSIE" down --dir "$DIR/c" >/dev/null 2>&1
    else
        kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
    fi
}
for _ in $(seq "$REPS"); do
    for system in ${SYSTEMS:-memcached redis nessie}; do
        run "$system"
    done
done
"$PY" - "$DIR/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def med(system, field):
    return statistics.median(r["result"][field] for r in runs if r["system"] == system)
ran = [s for s in ["memcached", "redis", "nessie"] if any(r["system"] == s for r in runs)]
base = med("memcached", "hit_ratio") if "memcached" in ran else None
for system in ran:
    h = med(system, "hit_ratio")
    rel = f" ({h / base:.3f}x memcached's)" if base else ""
    print(f"{system:>9}: hit ratio {h:.4f}{rel}, errors {med(system, 'errors'):.0f}, {med(system, 'seconds'):.1f} s")
PY
