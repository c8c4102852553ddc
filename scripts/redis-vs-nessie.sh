#!/usr/bin/env bash
# redis-server and Nessie's Redis front end side by side, with the same redis-benchmark runs:
# SET and GET, 4 clients, 100-byte and 16 KiB values, without and with -P 16 pipelining,
# REPS runs each, interleaved. Nessie: 2 node processes over shared memory, 4 front-end
# workers per node; the benchmark talks to node 0. Needs redis-server and redis-tools
# (Debian). Usage: bash scripts/redis-vs-nessie.sh [REPS] [REQUESTS]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
N=${2:-40000}
command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install redis-server)" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "needs redis-benchmark (apt-get install redis-tools)" >&2; exit 1; }
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
DIR=$(mktemp -d /tmp/nessie-redis-vs-XXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(free_port); NP=$(free_port)
cleanup() {
    redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1 || true
    "$NESSIE" down --dir "$DIR" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
# Values up to 16 KiB plus the 16-byte item header.
# The 200 ms expiry of `nessie bench`: an overwritten entry is reusable once its expiry has
# passed, so overwrites of large values need write bandwidth x expiry of spare memory (every
# redis-benchmark SET overwrites one key), and at the default 1 s they wait for it.
"$NESSIE" up --dir "$DIR" --nodes 2 --workers 4 --resp-port "$NP" --no-etcd \
    --value-max 20000 --memory-per-node 512MiB --expiry-ms 200 >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log" >&2; exit 1; }
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --logfile "$DIR/redis.log" --dir "$DIR" >/dev/null
sleep 0.5
for d in 100 16384; do for P in 1 16; do for rep in $(seq "$REPS"); do
    for who in "redis:$RP" "nessie:$NP"; do
        name=${who%%:*}; port=${who##*:}
        out=$(redis-benchmark -p "$port" -t set,get -n "$N" -c 4 -d "$d" -P "$P" -q 2>/dev/null \
              | tr '\r' '\n' | grep -E '^(SET|GET): [0-9]' | tr '\n' ' ')
        echo "d=$d P=$P $name rep=$rep $out"
    done
done; done; done
