#!/usr/bin/env bash
# Filling a cache, memcached and Nessie's memcached front end side by side (pymemcache, one
# `set` after another, scripts/cache-fill.py), REPS runs of each, alternated:
#   fill:   values of 64..4096 B until refusal: items held and seconds taken;
#   refill: 4000 B items with a 3 s TTL until full, 6 s of sleep, then new items until
#           refusal: what a full store takes back once its TTLs have lapsed (at 16 MiB per
#           node, so that the store is full before the TTLs lapse).
# Nessie: 2 node processes over shared memory, MEM MiB each, the client on node 0. memcached:
# one daemon with 2 × MEM (-m) that refuses when full (-M), as Nessie's default noeviction.
# Prints each run's JSON and the medians. Usage: bash scripts/cache-vs-memcached.sh [REPS] [MEM_MIB]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
MEM=${2:-128}
command -v memcached >/dev/null || { echo "needs memcached (apt-get install memcached)" >&2; exit 1; }
PY=${PYTHON:-python3}
"$PY" -c 'import pymemcache' 2>/dev/null || { echo "needs pymemcache for $PY (pip install pymemcache)" >&2; exit 1; }
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
DIR=$(mktemp -d /tmp/nessie-fill-XXXX)
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MC_PID=
cleanup() {
    [ -n "$MC_PID" ] && kill "$MC_PID" 2>/dev/null || true
    "$NESSIE" down --dir "$DIR/c" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
USER_ARG=()
[ "$(id -u)" = 0 ] && USER_ARG=(-u nobody)
REFILL_MEM=16
run() { # system mode -> one JSON line
    local port mem=$MEM
    port=$(free_port)
    [ "$2" = refill ] && mem=$REFILL_MEM
    if [ "$1" = memcached ]; then
        memcached "${USER_ARG[@]}" -p "$port" -l 127.0.0.1 -U 0 -m $((2 * mem)) -M &
        MC_PID=$!
        sleep 0.5
    else
        "$NESSIE" up --dir "$DIR/c" --nodes 2 --memory-per-node "${mem}MiB" --memcached-port "$port" \
            --no-etcd >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log" >&2; exit 1; }
    fi
    local args=("$2" "$port")
    [ "$2" = refill ] && args+=(3 6)
    echo "{\"system\": \"$1\", \"mode\": \"$2\", \"result\": $("$PY" scripts/cache-fill.py "${args[@]}")}" | tee -a "$DIR/runs.jsonl"
    if [ "$1" = memcached ]; then
        kill "$MC_PID"; wait "$MC_PID" 2>/dev/null || true; MC_PID=
    else
        "$NESSIE" down --dir "$DIR/c" >/dev/null 2>&1
    fi
}
for _ in $(seq "$REPS"); do
    for mode in fill refill; do
        run memcached "$mode"
        run nessie "$mode"
    done
done
"$PY" - "$DIR/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def med(system, mode, field):
    return statistics.median(r["result"][field] for r in runs if r["system"] == system and r["mode"] == mode)
for field in ["items", "seconds"]:
    m, n = med("memcached", "fill", field), med("nessie", "fill", field)
    print(f"fill   {field:>9}: memcached {m:>10.2f}  nessie {n:>10.2f}  ratio {n / m:.2f}")
for system in ["memcached", "nessie"]:
    held, back = med(system, "refill", "items"), med(system, "refill", "refilled")
    print(f"refill {system:>9}: held {held:.0f}, took {back:.0f} new items after the TTLs lapsed ({back / held:.2f}x)")
PY
