#!/usr/bin/env bash
# Pilaf against cd and sd (docs/bench.md, "Pilaf"): throughput at 90% GET with 64-byte values,
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

for round in $(seq 1 "$ROUNDS"); do
    for mode in cd sd pilaf; do
        f="$OUT/throughput-$mode-$round.json"
        "$NESSIE" bench --mode "$mode" "${common[@]}" --json "$f" >/dev/null
        line "$mode round $round" "$f"
    done
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
