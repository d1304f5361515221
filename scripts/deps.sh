#!/usr/bin/env bash
# Installs what building and running need, only when missing: redis-server and redis-cli
# (Debian's 7.0.x), libclang (bindgen, used by redis-module) and a C toolchain. `deps.sh test`
# (what `make test` runs) adds what the tests need: python3 with venv, Node.js and npm,
# clippy/rustfmt, and what the partition test needs (below: `make test` runs it for 60 s). `deps.sh dist` (what `make dist` runs) adds only python3 with venv: the Python
# library is built in a venv of its own (Node.js is for the client guide's tests only).
# `deps.sh partitions` (what `make partitions` runs) adds ip and iptables (iproute2, iptables)
# and python3 with venv. It never stops, starts or reconfigures anything.
set -euo pipefail
for_tests=false
for_dist=false
for_partitions=false
[ "${1:-}" = test ] && for_tests=true && for_partitions=true
[ "${1:-}" = dist ] && for_dist=true
[ "${1:-}" = partitions ] && for_partitions=true

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
# bindgen needs libclang itself (libclang.so / libclang-NN.so), not libclang-cpp, which other
# packages install on their own.
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || compgen -G '/usr/lib/*/libclang-[0-9]*.so*' >/dev/null || need+=(libclang-dev)
if $for_dist; then
  # scripts/dist.sh checks the tarball with python3 (its links, a free port) and builds the
  # Python library in a venv (clients/python/build-dist.sh).
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
fi
if $for_partitions; then
  # tests/partitions/: network namespaces, veths and a bridge (ip), faults as iptables rules.
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  command -v iptables >/dev/null 2>&1 || need+=(iptables)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
fi
if $for_tests; then
  # The CLI transcript tests and scripts/profile.sh use python3.
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  # The client tests (tests/clients/run.sh) put redis-py in a venv and the Node libraries in
  # tests/clients/node/node_modules (they need Node 20 or newer).
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
fi

if ((${#need[@]})); then
  echo "deps: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if $for_tests && { ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; }; then
  echo "deps: adding clippy and rustfmt"
  rustup component add clippy rustfmt
fi
