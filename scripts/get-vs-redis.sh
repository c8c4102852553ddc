#!/usr/bin/env bash
# Issue 9, goals 1 and 2: 16 KiB GETs from Nessie's fabric beside redis-server, same client
# count, in interleaved rounds; one line per run, medians at the end.
# Nessie: `nessie bench --transport T --nodes 2 --client-threads CLIENTS/2`, each GET one-sided
# over UCX (half of the keys in the client's own node). Over tcp it runs twice, with waits
# that sleep after 10 us (the default) and with waits that poll throughout. Over shm each round
# also times one cold 16 KiB copy from a working set as large as the values
# (`nessie fabric-bench --local --working-set`), the limit goal 1 holds the GET's p50 against,
# and two such copies at once (one per core): the machine's ceiling on 16 KiB GETs a second.
# Redis: `redis-benchmark -c CLIENTS -d 16384 -t get -r KEYS` against a redis-server without
# persistence, loaded with the same number of keys.
# Usage: bash scripts/get-vs-redis.sh [REPS] [KEYS] [TRANSPORT: tcp|shm] [CLIENTS: even]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
KEYS=${2:-10000}
TRANSPORT=${3:-tcp}
CLIENTS=${4:-2}
case "$TRANSPORT" in tcp|shm) ;; *) echo "transport must be tcp or shm, not '$TRANSPORT'" >&2; exit 2 ;; esac
case "$CLIENTS" in *[!0-9]*|''|0|*[13579]) echo "clients must be a positive even number (2 nodes), not '$CLIENTS'" >&2; exit 2 ;; esac
command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install redis-server)" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (apt-get install redis-tools)" >&2; exit 1; }
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
DIR=$(mktemp -d /tmp/nessie-get-vs-XXXX)
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
RESULTS="$DIR/results.txt"
record() { # LABEL RATE P50 P99
    [ $# -eq 4 ] || { echo "no figures for $1" >&2; exit 1; }
    echo "$*" | tee -a "$RESULTS"
}
nessie_run() { # LABEL FLAGS...
    local label=$1; shift
    "$NESSIE" bench --transport "$TRANSPORT" --nodes 2 --client-threads $((CLIENTS / 2)) \
        --get-ratio 1.0 --keys "$KEYS" --value-size 16384 --duration 3 --warmup 0.5 \
        --json "$DIR/run.json" "$@" >/dev/null 2>&1
    record "$label" $(python3 -c '
import json, sys
v = json.load(open(sys.argv[1])); g = v["latency_us"]["get"]
print("%.0f %.2f %.2f" % (v["ops_per_sec"], g["p50"], g["p99"]))' "$DIR/run.json")
}
copy_run() {
    "$NESSIE" fabric-bench --local --size 16384 --working-set $((KEYS * 16384)) --iters 20000 \
        --json >"$DIR/copy.json"
    record "cold-copy" $(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["local_copy"]
print("0 %.3f %.3f" % (c["p50_us"], c["p99_us"]))' "$DIR/copy.json")
}
# Two cold copies at once, one per core: the most 16 KiB copies a second this machine makes,
# the ceiling of any store's GET rate here (rate: the sum of both threads' 1/mean).
copy_pair_run() {
    local i
    for i in 1 2; do
        "$NESSIE" fabric-bench --local --size 16384 --working-set $((KEYS * 16384)) \
            --iters 100000 --json >"$DIR/copy$i.json" &
    done
    wait
    record "copy-pair" $(python3 -c '
import json, sys
c = [json.load(open(f))["local_copy"] for f in sys.argv[1:]]
print("%.0f %.3f %.3f" % (sum(1e6 / x["mean_us"] for x in c),
                          sum(x["p50_us"] for x in c) / 2, max(x["p99_us"] for x in c)))' \
        "$DIR/copy1.json" "$DIR/copy2.json")
}
redis_run() {
    local out
    out=$(redis-benchmark -p "$RP" -t get -n $((30000 * CLIENTS)) -r "$KEYS" -d 16384 -c "$CLIENTS" 2>/dev/null | tr '\r' '\n')
    # The summary's latency line: avg min p50 p95 p99 max (ms).
    record "redis" $(echo "$out" | python3 -c '
import re, sys
t = sys.stdin.read()
rate = float(re.search(r"throughput summary: ([0-9.]+)", t).group(1))
lat = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*\n\s*([0-9. ]+)", t).group(1).split()
print(f"{rate:.0f} {float(lat[2])*1000:.2f} {float(lat[4])*1000:.2f}")')
}
echo "$TRANSPORT, $CLIENTS clients, 16 KiB GETs over $KEYS keys; columns: who, GETs/s, p50 us, p99 us"
for rep in $(seq "$REPS"); do
    echo "round $rep"
    nessie_run "nessie" # the transport's default waits
    redis_run
    if [ "$TRANSPORT" = tcp ]; then
        nessie_run "nessie-poll" --wait-spin-us 600000000
    else
        copy_run
        copy_pair_run
    fi
done
python3 - "$RESULTS" "$CLIENTS" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    who, *v = line.split()
    runs.setdefault(who, []).append([float(x) for x in v])
med = {w: [statistics.median(r[i] for r in rs) for i in range(3)] for w, rs in runs.items()}
print("medians:")
for w, (rate, p50, p99) in med.items():
    print(f"  {w:<12} {rate:>10.0f} GETs/s  p50 {p50:>8.2f} us  p99 {p99:>8.2f} us")
n, r = med["nessie"], med["redis"]
print(f"  nessie / redis: rate {n[0] / r[0]:.2f}x, p50 {n[1] / r[1]:.2f}x, p99 {n[2] / r[2]:.2f}x")
if "cold-copy" in med and sys.argv[2] == "2":  # goal 1's setting: one client thread per node
    print(f"  nessie GET p50 / cold copy p50: {n[1] / med['cold-copy'][1]:.2f}x"
          f" (/ two copies at once: {n[1] / med['copy-pair'][1]:.2f}x)")
if "copy-pair" in med:
    c = med["copy-pair"][0]
    print(f"  two cores copying 16 KiB: {c:.0f}/s = {c / r[0]:.1f}x redis; nessie = {n[0] / c:.2f}x that")
EOF
