#!/usr/bin/env bash
# The full test suite: unit, property, concurrency-stress and multi-process tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo test --workspace --locked "$@"
# The in-process protocol, stress and checker tests also build and pass without UCX.
cargo test --locked -p nessie-cluster -p nessie-bench -p nessie-testkit --no-default-features "$@"
# `nessie sim check --mutation` exists only in builds with the mutations feature: its tests.
cargo test --locked -p nessie-cli --features mutations --test sim_check "$@"
