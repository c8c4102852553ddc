#!/usr/bin/env bash
# Pilaf against cd, sd and Redis (docs/bench.md, "Pilaf"): throughput at 90% GET with 64-byte values,
# the modes interleaved in rounds so that a noisy neighbour hits them alike; then Pilaf's
# checksum retry rate as the key count shrinks, with extents reused at once (as in the paper)
# and with the default reuse delay. JSON results in $OUT, one line per run on stdout.
set -euo pipefail
NESSIE=${NESSIE:-./target/release/nessie}
OUT=${OUT:-results/pilaf}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-5}
mkdir -p "$OUT"
common=(--get-ratio 0.9 --value-size 64 --duration "$DURATION" --warmup 1 --server-threads 1)

line() { # mode file
    python3 - "$1" "$2" <<'EOF'
import json, sys
r = json.load(open(sys.argv[2]))
p = r["params"]
gets = max(r["ops"]["get"], 1)
print(f'{sys.argv[1]:>24}  keys {p.get("keys")!s:>7}  {r["ops_per_sec"]:>10.0f} ops/s  '
      f'GET p50 {r["latency_us"]["get"]["p50"]:.1f} us  fabric/GET {r["fabric"]["get"]["ops_mean"]:.2f}  '
      f'aborts {r["aborts"]} ({r["aborts"] / gets:.2e}/GET)  retries {r["retries"]}  errors {r["errors"]}  '
      f'CPU {r["cpu_seconds"]["total"] * 1e6 / max(r["ops"]["all"], 1):.2f} us/op')
EOF
}

# Redis in the same rounds, when installed: one redis-server (one core, as Pilaf's single server
# thread), redis-benchmark with 3 clients (the bench's 3 client threads), 64-byte values over
# the same 200,000 keys. redis-benchmark runs GETs and SETs apart, so the 90% GET rate is their
# mix: 1 / (0.9 / GET rate + 0.1 / SET rate).
RP=""
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
    RP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    RDIR=$(mktemp -d /tmp/nessie-pilaf-redis-XXXX)
    redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
        --pidfile "$RDIR/redis.pid" --logfile "$RDIR/redis.log" --dir "$RDIR" >/dev/null
    trap 'redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$RDIR"' EXIT
    sleep 0.5
else
    echo "redis-server or redis-benchmark missing: Redis left out (apt-get install redis-server redis-tools)" >&2
fi
redis_line() { # round
    local out
    out=$(redis-benchmark -p "$RP" -t set,get -n 300000 -r 200000 -c 3 -d 64 -q 2>/dev/null | tr '\r' '\n')
    python3 -c '
import re, sys
rates = dict(re.findall(r"^(SET|GET): ([\d.]+) requests per second", sys.argv[2], re.M))
s, g = float(rates["SET"]), float(rates["GET"])
name = "redis round " + sys.argv[1]
print(f"{name:>24}  keys  200000  {1 / (0.9 / g + 0.1 / s):>10.0f} ops/s  "
      f"(GET {g:.0f}/s, SET {s:.0f}/s: redis-benchmark -c 3 -d 64 -r 200000)")
' "$1" "$out"
}

for round in $(seq 1 "$ROUNDS"); do
    for mode in cd sd pilaf; do
        f="$OUT/throughput-$mode-$round.json"
        "$NESSIE" bench --mode "$mode" "${common[@]}" --json "$f" >/dev/null
        line "$mode round $round" "$f"
    done
    if [ -n "$RP" ]; then redis_line "$round"; fi
done

for delay in 0 default; do
    for keys in 100000 10000 1000 100 10; do
        f="$OUT/retries-delay-$delay-keys-$keys.json"
        extra=()
        [ "$delay" = 0 ] && extra=(--pilaf-reuse-delay-ms 0)
        "$NESSIE" bench --mode pilaf "${common[@]}" --keys "$keys" "${extra[@]}" --json "$f" >/dev/null
        line "pilaf reuse delay $delay" "$f"
    done
done
