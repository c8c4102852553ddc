#!/usr/bin/env bash
# The etcd client comparison of docs/cluster.md ("Why etcd's HTTP/JSON gateway, not gRPC"):
# builds scripts/etcd-clients once per client (each build holds one client's dependencies;
# the gRPC one needs `protoc`, Debian protobuf-compiler), starts a single-member etcd on
# loopback, runs the two alternately RUNS times each, prints every run and the medians, and
# stops etcd. Usage: bash scripts/etcd-clients.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/etcd-clients"
RUNS=${1:-3}
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 1; }
command -v protoc >/dev/null || { echo "needs protoc for etcd-client (apt-get install protobuf-compiler)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/nessie-etcd-clients.XXXXXX)
for m in http grpc; do
    echo "building $m" >&2
    s=$(date +%s)
    CARGO_TARGET_DIR="$WORK/target-$m" cargo build -q --release --features "$m"
    echo "  built in $(( $(date +%s) - s )) s; $(stat -c %s "$WORK/target-$m/release/etcd-clients") bytes" >&2
done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CP=$(port); PP=$(port)
etcd --name bench --data-dir "$WORK/data" \
    --listen-client-urls "http://127.0.0.1:$CP" --advertise-client-urls "http://127.0.0.1:$CP" \
    --listen-peer-urls "http://127.0.0.1:$PP" --initial-advertise-peer-urls "http://127.0.0.1:$PP" \
    --initial-cluster "bench=http://127.0.0.1:$PP" --log-level error >"$WORK/etcd.log" 2>&1 &
ETCD=$!
trap 'kill $ETCD 2>/dev/null; wait $ETCD 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$CP/health" >/dev/null 2>&1 && break; sleep 0.1; done
for r in $(seq "$RUNS"); do
    for m in http grpc; do
        "$WORK/target-$m/release/etcd-clients" "$m" "127.0.0.1:$CP" "run$r/$m" | tee -a "$WORK/results"
    done
done
python3 - "$WORK/results" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"RESULT (\w+ \w+) n=\d+ p50_us=([\d.]+) p99_us=([\d.]+) mean_us=([\d.]+)", line)
    if m:
        runs.setdefault(m.group(1), []).append([float(x) for x in m.groups()[1:]])
print("medians over runs (µs):")
for name, v in sorted(runs.items()):
    p50, p99, mean = (statistics.median(x) for x in zip(*v))
    print(f"  {name:9} p50 {p50:8.1f}  p99 {p99:8.1f}  mean {mean:8.1f}  ({len(v)} runs)")
PY
