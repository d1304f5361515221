#!/usr/bin/env bash
# `make run` does what it says and nothing more (make test runs this, with the debug module):
# - scripts/run.sh starts Redis on the port asked, with the module built wherever cargo put it
#   and every option of redis.conf.example, and answers PING and MODULE LIST;
# - a port already in use is reported with a message naming PORT=, and nothing is stopped: the
#   server already there keeps answering;
# - the Makefile follows CARGO_TARGET_DIR, and `make run` asks scripts/deps.sh only for what
#   running needs (no Node.js, npm or python3-venv: those are `deps.sh test`).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
module=${LOCK_MODULE:-$here/target/debug/libredis_lock.so}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
fail() { echo "make-run: FAILED: $*" >&2; exit 1; }
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

# Runs, with the module where CARGO_TARGET_DIR says (a path with a space, an '&' and a '#'),
# and the example's options.
port=$(free_port)
target="$dir/target dir & #1"
mkdir -p "$target/release"
cp "$module" "$target/release/libredis_lock.so"
CARGO_TARGET_DIR="$target" bash "$here/scripts/run.sh" "$port" >"$dir/run.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
[ "$(redis-cli -p "$port" ping)" = PONG ] || fail "no server on $port: $(cat "$dir/run.log")"
redis-cli -p "$port" module list | grep -qx lock || fail "the module is not loaded"
[ "$(redis-cli -p "$port" config get lock.lost-channel-prefix | tail -n 1)" = lock.lost ] \
  || fail "the example's options were not applied"

# A busy port: a clear message, exit status 1, and the server already there untouched.
if CARGO_TARGET_DIR="$target" bash "$here/scripts/run.sh" "$port" >"$dir/busy.log" 2>&1; then
  fail "run.sh took a port in use"
fi
grep -q "PORT=" "$dir/busy.log" || fail "the busy-port message names no PORT=: $(cat "$dir/busy.log")"
[ "$(redis-cli -p "$port" ping)" = PONG ] || fail "the server on the busy port was stopped"

# The Makefile passes CARGO_TARGET_DIR on (given on its command line too), and make run installs
# only what running needs.
make -s -n --no-print-directory -C "$here" run CARGO_TARGET_DIR="$dir/elsewhere" PORT=7777 >"$dir/plan.txt"
grep -q 'scripts/run.sh "7777"' "$dir/plan.txt" || fail "make run's plan: $(cat "$dir/plan.txt")"
[ "$(make -s --no-print-directory -C "$here" --eval 'print-target-dir: ; @echo "$$CARGO_TARGET_DIR"' print-target-dir \
  CARGO_TARGET_DIR="$dir/elsewhere")" = "$dir/elsewhere" ] \
  || fail "the Makefile does not pass CARGO_TARGET_DIR on to its commands"
grep -q "scripts/deps.sh test" "$dir/plan.txt" && fail "make run installs the tests' dependencies"
grep -q "need+=(nodejs)\|need+=(npm)" <(sed -n '/^if \$for_tests/,/^fi/!p' "$here/scripts/deps.sh") \
  && fail "deps.sh installs Node.js or npm outside its test mode"
grep -q "service .* stop\|systemctl stop" "$here/scripts/deps.sh" "$here/scripts/run.sh" \
  && fail "a script stops a service"
echo "make-run: ok"
