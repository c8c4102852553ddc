#!/usr/bin/env bash
# Large items beside memcached and redis-server (issue 41, step 5): SET then GET of items of
# 1,000,000 B through the memcached protocol (Nessie with default flags: --item-max 1M, as
# memcached's -I), and of 64 MiB through RESP (Nessie with --item-max 512M), every GET checked
# byte for byte (scripts/large-values.py), REPS rounds of each system alternated, the medians.
# Nessie: 2 node processes over shared memory, MEM_MIB each; memcached -m 2*MEM; redis-server.
# Usage: bash scripts/large-values.sh [REPS] [MEM_MIB] [COUNT_1MB] [COUNT_64MB]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
MEM=${2:-256}
N1=${3:-200}
N64=${4:-5}
for tool in memcached redis-server; do
    command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install memcached redis-server)" >&2; exit 1; }
done
PY=${PYTHON:-python3}
"$PY" -c 'import pymemcache, redis' 2>/dev/null || { echo "needs pymemcache and redis-py for $PY (apt-get install python3-pymemcache python3-redis)" >&2; exit 1; }
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
DIR=$(mktemp -d /tmp/nessie-large-XXXX)
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
wait_port() { for _ in $(seq 100); do "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null && return; sleep 0.1; done; echo "nothing listens on $1" >&2; exit 1; }
stop() {
    [ -n "$PID" ] && { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=; }
    "$NESSIE" down --dir "$DIR/c" >/dev/null 2>&1 || true
    rm -rf "$DIR/c"
}
run() { # system proto size count -> one JSON line
    local port
    port=$(free_port)
    case "$1" in
    memcached) memcached "${USER_ARG[@]}" -p "$port" -l 127.0.0.1 -U 0 -m $((2 * MEM)) -I 1m & PID=$! ;;
    redis) redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null & PID=$! ;;
    nessie)
        local fe=--memcached-port item=1M
        [ "$2" = redis ] && fe=--resp-port item=512M
        "$NESSIE" up --dir "$DIR/c" --nodes 2 --memory-per-node "${MEM}MiB" "$fe" "$port" \
            --no-etcd --item-max "$item" >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log" >&2; exit 1; } ;;
    esac
    wait_port "$port"
    echo "{\"system\": \"$1\", \"proto\": \"$2\", \"result\": $("$PY" scripts/large-values.py "$2" "$port" "$3" "$4")}" | tee -a "$DIR/runs.jsonl"
    stop
}
for _ in $(seq "$REPS"); do
    run memcached memcached 1000000 "$N1"
    run nessie memcached 1000000 "$N1"
    run redis redis $((64 << 20)) "$N64"
    run nessie redis $((64 << 20)) "$N64"
done
"$PY" - "$DIR/runs.jsonl" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def med(system, proto, field):
    return statistics.median(r["result"][field] for r in runs if r["system"] == system and r["proto"] == proto)
for proto, peer, what in (("memcached", "memcached", "1,000,000 B via memcached"), ("redis", "redis", "64 MiB via RESP")):
    for op in ("set", "get"):
        n, p = med("nessie", proto, op + "_ms"), med(peer, proto, op + "_ms")
        print(f"{what} {op.upper()}: Nessie {n:.2f} ms, {peer} {p:.2f} ms (median), Nessie/{peer} time {n / p:.2f}x")
PYEOF
