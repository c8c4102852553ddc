#!/usr/bin/env bash
# The main job: build Nessie and run a workload on a local cluster, printing the results.
# Extra arguments go to `nessie demo` (see `nessie demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --bin nessie
exec ./target/release/nessie demo --check "$@"
