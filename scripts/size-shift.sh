#!/usr/bin/env bash
# A cache whose value size changes: fill a small 2-node cluster with 300-byte values, then
# write 2,000-byte values twice. Without moving pages between size classes the new size got
# no room (docs/frontends.md, "Moving pages between size classes").
#
#   bash scripts/size-shift.sh OLD_NESSIE NEW_NESSIE [RUNS]
#
# Runs the two binaries alternately RUNS times (3 by default) and prints, per binary, the
# medians of: the 2,000-byte SETs per second of each of the two runs, the seconds the first
# took, and how many SETs were refused (OOM). A run that completes nothing in 60 s is cut off
# and counts 0 SET/s. Needs redis-benchmark. Uses ports 7100-7103.
set -euo pipefail
old=${1:?usage: size-shift.sh OLD_NESSIE NEW_NESSIE [RUNS]}
new=${2:?usage: size-shift.sh OLD_NESSIE NEW_NESSIE [RUNS]}
runs=${3:-3}
command -v redis-benchmark >/dev/null || { echo "size-shift.sh: redis-benchmark not found" >&2; exit 1; }
for b in "$old" "$new"; do
    [ -x "$b" ] || { echo "size-shift.sh: $b is not an executable" >&2; exit 1; }
done
work=$(mktemp -d /tmp/nessie-size-shift.XXXXXX)
dir=""
cleanup() {
    if [ -n "$dir" ]; then "$bin" down --dir "$dir" >/dev/null 2>&1 || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# The SETs of one redis-benchmark run: "RPS OOMS SECONDS" (RPS 0 when it gave up).
sets() {
    local size=$1 n=$2 start end out rps ooms
    start=$(date +%s.%N)
    out=$(timeout 60 redis-benchmark -h 127.0.0.1 -p 7102 -t set -n "$n" -r 40000 -d "$size" \
        -c 4 -q -e 2>&1 | tr '\r' '\n' || true)
    end=$(date +%s.%N)
    rps=$(echo "$out" | grep -a "requests per second" | tail -1 | awk '{print $2}')
    ooms=$(echo "$out" | grep -ac "OOM" || true)
    echo "${rps:-0} $ooms $(echo "$end - $start" | bc)"
}

one() {
    bin=$1
    dir=$(mktemp -d "$work/cluster.XXXXXX")
    "$bin" up --dir "$dir" --nodes 2 --transport shm --no-etcd --memory-per-node 4MiB \
        --eviction allkeys-lru --expiry-ms 50 --memcached-port 7100 --resp-port 7102 >/dev/null
    sets 300 40000 >/dev/null
    read -r rps1 ooms1 secs1 < <(sets 2000 20000)
    read -r rps2 ooms2 _ < <(sets 2000 20000)
    "$bin" down --dir "$dir" >/dev/null
    dir=""
    echo "$rps1 $secs1 $((ooms1 + ooms2)) $rps2"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

for i in $(seq "$runs"); do
    for which in old new; do
        b=$old; [ "$which" = new ] && b=$new
        r=$(one "$b")
        echo "$which $r" >> "$work/results"
        echo "run $i $which: first 2000-B run $(echo "$r" | awk '{print $1 " SET/s in " $2 " s; refused (OOM): " $3 "; second run " $4 " SET/s"}')" >&2
    done
done
for which in old new; do
    col() { grep "^$which " "$work/results" | awk "{print \$$1}" | median; }
    echo "$which: 2000-B SET/s $(col 2) (first run, $(col 3) s), $(col 5) (second run); refused $(col 4)"
done
