#!/usr/bin/env bash
# Issue 9, goal 2: the fabric over TCP beside redis-server, same client count, 16 KiB GETs.
# Nessie: `nessie bench --transport tcp --nodes 2` (one client thread per node: 2 clients, each
# GET one-sided over UCX's tcp transport, half of them to the other node), with waits that
# sleep after 10 us (the default) and with waits that poll throughout (the old behaviour).
# Redis: `redis-benchmark -c 2 -d 16384 -t get -r KEYS` against a redis-server without
# persistence, loaded with the same number of keys. REPS rounds, interleaved; one line per run.
# Usage: bash scripts/tcp-vs-redis.sh [REPS] [KEYS]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
KEYS=${2:-10000}
command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install redis-server)" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (apt-get install redis-tools)" >&2; exit 1; }
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
DIR=$(mktemp -d /tmp/nessie-tcp-vs-XXXX)
RP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
    redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --logfile "$DIR/redis.log" --dir "$DIR" >/dev/null
sleep 0.5
# Every key of the range once (-r draws at random; this many SETs leave few gaps).
redis-benchmark -p "$RP" -t set -n $((KEYS * 4)) -r "$KEYS" -d 16384 -c 2 -q >/dev/null 2>&1
nessie_run() { # LABEL FLAGS...
    local label=$1; shift
    "$NESSIE" bench --transport tcp --nodes 2 --get-ratio 1.0 --keys "$KEYS" --value-size 16384 \
        --duration 3 --warmup 0.5 --json "$DIR/run.json" "$@" >/dev/null 2>&1
    python3 - "$DIR/run.json" "$label" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1])); g = v["latency_us"]["get"]
print(f"{sys.argv[2]:<14} {v['ops_per_sec']:>9.0f} GET/s  p50 {g['p50']:>7.1f} us  p99 {g['p99']:>8.1f} us")
EOF
}
redis_run() {
    local out
    out=$(redis-benchmark -p "$RP" -t get -n 60000 -r "$KEYS" -d 16384 -c 2 2>/dev/null | tr '\r' '\n')
    # The summary's latency line: avg min p50 p95 p99 max (ms).
    echo "$out" | python3 -c '
import re, sys
t = sys.stdin.read()
rate = float(re.search(r"throughput summary: ([0-9.]+)", t).group(1))
lat = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*\n\s*([0-9. ]+)", t).group(1).split()
name = "redis"
print(f"{name:<14} {rate:>9.0f} GET/s  p50 {float(lat[2])*1000:>7.1f} us  p99 {float(lat[4])*1000:>8.1f} us")'
}
for rep in $(seq "$REPS"); do
    echo "round $rep"
    nessie_run "nessie" # waits sleep after 10 us (tcp's default)
    redis_run
    nessie_run "nessie-poll" --wait-spin-us 600000000
done
