#!/usr/bin/env bash
# Install what building and testing Nessie needs on Debian (idempotent; root or sudo).
set -euo pipefail

PKGS=(build-essential pkg-config libucx-dev ucx-utils iproute2 procps memcached etcd-server libmemcached-tools redis-tools redis-server openssl python3 python3-pymemcache python3-redis)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        echo "setup: no Rust toolchain found. Install stable Rust (https://rustup.rs) and re-run." >&2
        exit 1
    fi
fi
