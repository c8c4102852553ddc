#!/usr/bin/env bash
# The main job: build Nessie, run a workload on a 3-node cluster (checking the whole history
# for linearizability), start a real 3-process cluster over shared memory, use it from the CLI,
# show its status and stop it, then run the `quick` benchmark sweep (Nessie against the
# server-driven baseline under CPU contention) and write its results and plot to out/quick.
# Extra arguments go to `nessie demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --bin nessie
N=./target/release/nessie

echo "== workload on a 3-node cluster (in-process fabric) =="
$N demo --check "$@"

echo
echo "== a real 3-process cluster over shared memory (UCX) =="
DIR=$(mktemp -d /tmp/nessie-demo.XXXXXX)
trap '$N down --dir "$DIR" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
$N up --dir "$DIR" --nodes 3 --transport shm
$N put --dir "$DIR" --node 0 greeting "hello from node 0"
echo "get greeting via node 2: $($N get --dir "$DIR" --node 2 greeting)"
head -c 16384 /dev/urandom > "$DIR/blob"
$N put --dir "$DIR" --node 1 blob "@$DIR/blob"
$N get --dir "$DIR" --node 0 blob -o "$DIR/blob.out"
cmp "$DIR/blob" "$DIR/blob.out" && echo "16 KiB value written via node 1, read back via node 0: identical"
head -c 1000000 /dev/urandom > "$DIR/large"
$N put --dir "$DIR" --node 2 large "@$DIR/large"
$N get --dir "$DIR" --node 1 large -o "$DIR/large.out"
cmp "$DIR/large" "$DIR/large.out" && echo "1,000,000-byte item (stored in 16 KiB chunks, up to --item-max, 1 MiB by default): identical"
$N del --dir "$DIR" greeting
if $N get --dir "$DIR" greeting >/dev/null 2>&1; then echo "unexpected: greeting still there"; exit 1; fi
echo "greeting deleted (get exits 1: not found)"
$N status --dir "$DIR"
$N down --dir "$DIR"

echo
echo "== benchmark: the quick sweep (cd vs sd, with and without a background CPU hog) =="
$N bench sweep --preset quick --out out/quick
echo "plot: out/quick/quick.png   results: out/quick/*.json"
