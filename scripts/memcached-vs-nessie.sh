#!/usr/bin/env bash
# memcached and Nessie's memcached front end side by side, with the same memcslap runs
# (Debian libmemcached-tools): 4 client threads, SET then GET of N keys each, REPS runs,
# interleaved. Nessie: 2 node processes over shared memory, 4 front-end workers per node; the
# benchmark talks to node 0. memcached: one daemon with 1 GiB, 4 threads (its default).
# Prints keys per second for each run. Usage: bash scripts/memcached-vs-nessie.sh [REPS] [N]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
N=${2:-20000}
command -v memcached >/dev/null || { echo "needs memcached (apt-get install memcached)" >&2; exit 1; }
command -v memcslap >/dev/null || { echo "needs memcslap (apt-get install libmemcached-tools)" >&2; exit 1; }
cargo build --release -q -p nessie-cli
NESSIE=target/release/nessie
DIR=$(mktemp -d /tmp/nessie-mc-vs-XXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MP=$(free_port); NP=$(free_port)
MC_PID=
cleanup() {
    [ -n "$MC_PID" ] && kill "$MC_PID" 2>/dev/null || true
    "$NESSIE" down --dir "$DIR" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
# The 200 ms expiry of `nessie bench` (see scripts/redis-vs-nessie.sh).
"$NESSIE" up --dir "$DIR" --nodes 2 --client-threads 4 --memcached-port "$NP" --no-etcd \
    --memory-per-node 512MiB --expiry-ms 200 >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log" >&2; exit 1; }
# memcached refuses to run as root without a user to switch to.
USER_ARG=()
[ "$(id -u)" = 0 ] && USER_ARG=(-u nobody)
# In the foreground of a background job, so that its pid is known (a pid file in DIR cannot be
# written once memcached has switched to the unprivileged user).
memcached "${USER_ARG[@]}" -p "$MP" -l 127.0.0.1 -U 0 -m 1024 &
MC_PID=$!
sleep 0.5
rate() { # test port -> keys per second (a get run loads its keys first: only its own line)
    # -F: flush_all first, so that runs do not pile keys up until memory is full.
    memcslap -F -s "127.0.0.1:$2" -t "$1" -c 4 -e "$N" 2>&1 |
        awk -v t="$1" '$1 == "Time" && $3 == t { printf "%.0f", $4 / $(NF - 1) }'
}
for rep in $(seq "$REPS"); do
    for who in "memcached:$MP" "nessie:$NP"; do
        name=${who%%:*}; port=${who##*:}
        echo "$name rep=$rep SET $(rate set "$port") GET $(rate get "$port")"
    done
done
