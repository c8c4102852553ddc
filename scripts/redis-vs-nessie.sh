#!/usr/bin/env bash
# redis-server and Nessie's Redis front end side by side, with the same redis-benchmark runs:
# SET and GET, 4 clients, 100-byte and 16 KiB values, without and with -P 16 pipelining,
# REPS runs each, interleaved. Nessie: 2 node processes over shared memory, 4 front-end
# workers per node; the benchmark talks to node 0. Needs redis-server and redis-tools
# (Debian). Then, for pipelined 100-byte SETs, the CPU each server and the benchmark spent per
# request (user and system, from /proc), which is what bounds a rate on this 2-core machine.
# Usage: bash scripts/redis-vs-nessie.sh [REPS] [REQUESTS]
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
# redis-benchmark SET overwrites one key), and at the default 1 s they wait for it. 1 GiB per
# node holds what 200k 16 KiB SETs a second leave awaiting expiry (about 650 MB) on the node
# that writes them. With 512 MiB, entries spilled to the other node's memory (374,023 remote
# WRITEs for 300,000 SETs) and the node spent 3.0 us of user CPU per SET, not 2.27.
"$NESSIE" up --dir "$DIR" --nodes 2 --client-threads 4 --resp-port "$NP" --no-etcd \
    --value-max 20000 --memory-per-node 1GiB --expiry-ms 200 >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log" >&2; exit 1; }
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

# CPU per request of pipelined 100-byte SETs: the server's processes (user, system) and the
# benchmark's, from their /proc/PID/stat ticks, REPS runs each, interleaved.
ticks() { # user and system ticks summed over the PIDs given
    local u=0 s=0 f
    for p in "$@"; do f=($(cut -d' ' -f14,15 "/proc/$p/stat")); u=$((u + f[0])); s=$((s + f[1])); done
    echo "$u $s"
}
NESSIE_PIDS=$(for f in "$DIR"/node-*.pid; do echo "$(cat "$f")"; done)
REDIS_PID=$(redis-cli -p "$RP" info server | tr -d '\r' | sed -n 's/^process_id://p')
CN=$((N * 10))
for rep in $(seq "$REPS"); do
    for who in "redis:$RP:$REDIS_PID" "nessie:$NP:$NESSIE_PIDS"; do
        IFS=: read -r name port pids <<<"$who"
        read -r u0 s0 <<<"$(ticks $pids)"
        rate=$( { /usr/bin/time -f "%U %S" -o "$DIR/time" redis-benchmark -p "$port" -t set -n "$CN" \
                   -c 4 -d 100 -P 16 -q 2>/dev/null; } | tr '\r' '\n' | grep -E '^SET: [0-9]' | awk '{print $2}')
        read -r u1 s1 <<<"$(ticks $pids)"
        read -r bu bs <"$DIR/time"
        python3 - "$name" "$rep" "$rate" "$CN" "$(getconf CLK_TCK)" "$u0" "$s0" "$u1" "$s1" "$bu" "$bs" <<'PY'
import sys
name, rep, rate, n, tck = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
u0, s0, u1, s1 = map(int, sys.argv[6:10])
bu, bs = map(float, sys.argv[10:12])
us = lambda sec: sec / n * 1e6
print(f"cpu d=100 P=16 SET {name} rep={rep} {rate}/s  server user {us((u1-u0)/tck):.2f} sys {us((s1-s0)/tck):.2f}"
      f"  benchmark {us(bu+bs):.2f} us/request")
PY
    done
done
