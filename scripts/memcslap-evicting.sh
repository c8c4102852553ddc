#!/usr/bin/env bash
# Writing a key space ten times the memory with memcslap (libmemcached-tools), memcached and
# Nessie's memcached front end side by side, REPS runs of each, alternated. memcslap's `set`
# test: THREADS threads, each setting EXEC random keys of its own with values of random size
# (about 2.6 KB on average), one `set` after another; at EXEC = 120000 and MEM = 32 that is
# about 600 MB into 64 MiB.
# Nessie: 2 node processes over shared memory, MEM MiB each, --eviction allkeys-lru, memcslap
# on node 0. memcached: one daemon with 2 × MEM (-m), which evicts by default.
# Prints each run (seconds, errors memcslap reported, items held at the end: memcached's
# curr_items, the sum of the nodes' curr_items) and the medians.
# NESSIE_FRONTENDS=2 gives memcslap both nodes' front ends (it spreads keys over its servers).
# NESSIE_ARGS adds `nessie up` flags (e.g. "--expiry-ms 100"); NESSIE_OLD=PATH also runs
# another nessie binary, alternated with the new one (a before/after comparison).
# Usage: bash scripts/memcslap-evicting.sh [REPS] [MEM_MIB] [EXEC] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
MEM=${2:-32}
EXEC=${3:-120000}
THREADS=${4:-2}
for tool in memcached memcslap; do
    command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install memcached libmemcached-tools)" >&2; exit 1; }
done
PY=${PYTHON:-python3}
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
DIR=$(mktemp -d /tmp/nessie-slap-XXXX)
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MC_PID=
UP_BIN=
cleanup() {
    [ -n "$MC_PID" ] && kill "$MC_PID" 2>/dev/null || true
    [ -n "$UP_BIN" ] && "$UP_BIN" down --dir "$DIR/c" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
USER_ARG=()
[ "$(id -u)" = 0 ] && USER_ARG=(-u nobody)
# The items held: curr_items of every server given.
items() {
    "$PY" - "$@" <<'PY'
import socket, sys
total = 0
for port in sys.argv[1:]:
    s = socket.create_connection(("127.0.0.1", int(port)))
    s.sendall(b"stats\r\n")
    data = b""
    while not data.endswith(b"END\r\n"):
        data += s.recv(65536)
    for line in data.decode().split("\r\n"):
        if line.startswith("STAT curr_items "):
            total += int(line.split()[2])
print(total)
PY
}
run() { # system binary -> one JSON line
    local port ports
    port=$(free_port)
    if [ "$1" = memcached ]; then
        memcached "${USER_ARG[@]}" -p "$port" -l 127.0.0.1 -U 0 -m $((2 * MEM)) &
        MC_PID=$!
        sleep 0.5
        ports=("$port")
    else
        UP_BIN=$2
        # shellcheck disable=SC2086
        "$UP_BIN" up --dir "$DIR/c" --nodes 2 --memory-per-node "${MEM}MiB" --memcached-port "$port" \
            --eviction allkeys-lru --no-etcd ${NESSIE_ARGS:-} >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log" >&2; exit 1; }
        ports=("$port" "$((port + 1))")
    fi
    local servers="127.0.0.1:$port"
    if [ "$1" != memcached ] && [ "${NESSIE_FRONTENDS:-1}" = 2 ]; then
        servers="$servers,127.0.0.1:$((port + 1))"
    fi
    memcslap -s "$servers" -t set -c "$THREADS" -e "$EXEC" >"$DIR/slap.out" 2>&1 || true
    local secs errors held keys
    secs=$(awk '/^Time to set/ {print $(NF-1)}' "$DIR/slap.out")
    keys=$(awk '/^Time to set/ {print $4}' "$DIR/slap.out")
    errors=$(grep -ci "error\|fail" "$DIR/slap.out" || true)
    # memcslap stops a thread at its first failed set: a short count is an error too.
    [ "${keys:-0}" = $((EXEC * THREADS)) ] || errors=$((errors + 1))
    grep -i "error\|fail" "$DIR/slap.out" | head -3 >&2 || true
    held=$(items "${ports[@]}")
    echo "{\"system\": \"$1\", \"seconds\": ${secs:-null}, \"keys\": ${keys:-0}, \"errors\": $errors, \"items\": $held}" | tee -a "$DIR/runs.jsonl"
    if [ "$1" = memcached ]; then
        kill "$MC_PID"; wait "$MC_PID" 2>/dev/null || true; MC_PID=
    else
        "$UP_BIN" down --dir "$DIR/c" >/dev/null 2>&1; UP_BIN=
    fi
}
for _ in $(seq "$REPS"); do
    run memcached
    run nessie "$NESSIE"
    if [ -n "${NESSIE_OLD:-}" ]; then
        run nessie-old "$NESSIE_OLD"
    fi
done
"$PY" - "$DIR/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def med(system, field):
    return statistics.median(r[field] for r in runs if r["system"] == system)
systems = [s for s in ["memcached", "nessie", "nessie-old"] if any(r["system"] == s for r in runs)]
for s in systems:
    errors = sum(r["errors"] for r in runs if r["system"] == s)
    print(f"{s:>10}: {med(s, 'seconds'):7.2f} s ({med(s, 'seconds') / med('memcached', 'seconds'):.2f}x memcached), "
          f"{med(s, 'items'):7.0f} items held ({med(s, 'items') / med('memcached', 'items'):.2f}x), {errors} errors in all runs")
PY
