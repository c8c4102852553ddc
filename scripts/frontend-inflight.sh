#!/usr/bin/env bash
# The Redis front end with a pipelined batch's GETs and SETs run one at a time
# (--frontend-inflight 1) and with operations in flight (--frontend-inflight N), side by side:
# two clusters of 2 node processes over TRANSPORT (shm or tcp), both up for the whole run, and
# the same redis-benchmark runs against node 0 of each, alternated, REPS times. Prints each
# run's rates, then the median ratio (N against 1) per test.
# Usage: bash scripts/frontend-inflight.sh [TRANSPORT] [N] [REPS] [REQUESTS] [VALUE_BYTES]
set -euo pipefail
cd "$(dirname "$0")/.."
TRANSPORT=${1:-tcp}
N_INFLIGHT=${2:-16}
REPS=${3:-5}
N=${4:-100000}
D=${5:-100}
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (apt-get install redis-tools)" >&2; exit 1; }
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
ROOT=$(mktemp -d /tmp/nessie-fe-inflight-XXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cleanup() {
    for k in one many; do "$NESSIE" down --dir "$ROOT/$k" >/dev/null 2>&1 || true; done
    rm -rf "$ROOT"
}
trap cleanup EXIT
declare -A PORT
for k in one many; do
    inflight=1; [ "$k" = many ] && inflight=$N_INFLIGHT
    PORT[$k]=$(free_port)
    "$NESSIE" up --dir "$ROOT/$k" --nodes 2 --transport "$TRANSPORT" --client-threads 4 \
        --resp-port "${PORT[$k]}" --no-etcd --frontend-inflight "$inflight" --expiry-ms 200 \
        --memory-per-node 512MiB >"$ROOT/up-$k.log" 2>&1 || { cat "$ROOT/up-$k.log" >&2; exit 1; }
done
echo "transport $TRANSPORT, --frontend-inflight 1 against $N_INFLIGHT, redis-benchmark -P 16 -c 4 -d $D -n $N"
OUT=$ROOT/rates
for rep in $(seq "$REPS"); do
    for k in one many; do
        line=$(redis-benchmark -p "${PORT[$k]}" -t set,get -n "$N" -c 4 -d "$D" -P 16 -q 2>/dev/null \
               | tr '\r' '\n' | grep -E '^(SET|GET): [0-9]' | tr '\n' ' ')
        echo "rep=$rep inflight=$k $line"
        echo "$rep $k $line" >>"$OUT"
    done
done
python3 - "$OUT" <<'EOF'
import re, statistics, sys
rates = {}
for line in open(sys.argv[1]):
    rep, k, rest = line.split(' ', 2)
    for test, rate in re.findall(r'(SET|GET): ([0-9.]+)', rest):
        rates.setdefault((test, rep), {})[k] = float(rate)
for test in ('SET', 'GET'):
    ratios = [r['many'] / r['one'] for (t, _), r in sorted(rates.items()) if t == test and len(r) == 2]
    if ratios:
        print(f"{test}: median ratio {statistics.median(ratios):.2f} (runs {', '.join(f'{x:.2f}' for x in ratios)})")
EOF
