#!/usr/bin/env bash
# Timelines of a scale-out 3→5 and a scale-in 5→3 under load (issue 42), in the style of
# Rocksteady's Figure 3.2: throughput and GET p50/p99.9 per 100 ms window, the joins and
# leaves marked. Writes OUT/{scale-out,scale-in}.{json,png} (default OUT: results/scaling).
#   bash scripts/scaling-timeline.sh [OUT] [TRANSPORT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/scaling}
transport=${2:-shm}
mkdir -p "$out"
cargo build --release --locked -p nessie-cli
bin=target/release/nessie
common=(--replicas 2 --warmup 1 --scale-at 3 --transport "$transport")
echo "scale-out 3 → 5 over $transport" >&2
"$bin" bench --nodes 3 --scale-to 5 --duration 30 "${common[@]}" \
  --json "$out/scale-out.json" --plot "$out/scale-out.png"
echo "scale-in 5 → 3 over $transport" >&2
"$bin" bench --nodes 5 --scale-to 3 --duration 45 "${common[@]}" \
  --json "$out/scale-in.json" --plot "$out/scale-in.png"
echo "written: $out/scale-out.{json,png} $out/scale-in.{json,png}" >&2
