#!/usr/bin/env bash
# How long a restarted node takes to be up again, by value size, over TCP: see rejoin-time.py.
# Usage: bash scripts/rejoin-time.sh [RUNS] [KEYS] [SIZE ...]   (defaults: 3 1000 100 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --locked -q -p nessie-cli
exec /usr/bin/python3 scripts/rejoin-time.py "$@"
