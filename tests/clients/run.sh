#!/usr/bin/env bash
# Runs the client-library tests of docs/clients.md: real client libraries, with their defaults
# except the settings the guide names, against redis-server with the module loaded.
#
#   tests/clients/run.sh default   redis-py (sync and asyncio), ioredis, node-redis   (make test)
#   tests/clients/run.sh extra     glide, redigo, go-redis v5, redis-rb, predis, phpredis, Perl
#                                  (make test-clients; scripts/client-deps.sh installs them)
#   tests/clients/run.sh redis-py go-redis ...   any libraries by name
#
# Each library gets its own redis-server (and its own 3-master cluster when it has a cluster
# client), on free loopback ports, so the server-side counters a test reads (INFO lock,
# commandstats, errorstats) count that library's commands only. The libraries run in parallel;
# so do the slow cases of one library (the ones that wait out a 60 s default timeout), as
# separate jobs. A test prints `ok - name` or `not ok - name: why`; the last line is
# `clients: N passed, N failed`, and the exit status is non-zero on any failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
module=${LOCK_MODULE:-$here/../../target/debug/libredis_lock.so}
# The server and CLI: $LOCK_SERVER and $LOCK_CLI (default redis-server and redis-cli).
server=${LOCK_SERVER:-redis-server}
cli=${LOCK_CLI:-redis-cli}
[ -f "$module" ] || { echo "clients: module $module not found (build it first)" >&2; exit 1; }

default_set=(redis-py ioredis node-redis)
extra_set=(glide redigo go-redis redis-rb predis phpredis perl)
libs=()
for arg in "${@:-default}"; do
  case "$arg" in
    default) libs+=("${default_set[@]}") ;;
    extra) libs+=("${extra_set[@]}") ;;
    all) libs+=("${default_set[@]}" "${extra_set[@]}") ;;
    *) libs+=("$arg") ;;
  esac
done

py=$here/python/.venv/bin/python
# The jobs of a library, one command per line; each runs with LOCK_PORT (a standalone server)
# and, for libraries with cluster support, LOCK_CLUSTER (three comma-separated master ports).
jobs_of() {
  case "$1" in
    redis-py) echo "$py $here/python/test_redis_py.py" ;;
    glide) echo "$py $here/python/test_glide.py" ;;
    ioredis) echo "node $here/node/test_ioredis.js" ;;
    node-redis) echo "node $here/node/test_node_redis.js" ;;
    redigo) echo "go run $here/go/redigo/main.go" ;;
    go-redis) echo "go run $here/go/goredis/main.go" ;;
    redis-rb) echo "ruby $here/ruby/test_redis_rb.rb" ;;
    predis)
      echo "php $here/php/test_predis.php main"
      echo "php $here/php/test_predis.php default-timeout"
      echo "php $here/php/test_predis.php no-timeout" ;;
    phpredis)
      echo "php $here/php/test_phpredis.php main"
      echo "php $here/php/test_phpredis.php default-timeout"
      echo "php $here/php/test_phpredis.php no-timeout" ;;
    perl) echo "perl $here/perl/test_redis.pl" ;;
    *) echo "clients: unknown library '$1'" >&2; return 1 ;;
  esac
}
has_cluster() {
  case "$1" in redis-py | glide | ioredis | node-redis | go-redis | redis-rb | predis | phpredis) return 0 ;; esac
  return 1
}

# Installs a library's packages into the test's own environment (idempotent; versions pinned).
setup() {
  case "$1" in
    redis-py | glide)
      local req=$here/python/requirements.txt
      [ "$1" = glide ] && req=$here/python/requirements-glide.txt
      if ! "$py" -m pip --version >/dev/null 2>&1; then
        rm -rf "$here/python/.venv"
        python3 -m venv "$here/python/.venv"
      fi
      local stamp=$here/python/.venv/.installed-$(basename "$req" .txt)
      if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
        echo "clients: pip install -r $(basename "$req")"
        "$py" -m pip install --quiet --disable-pip-version-check -r "$req"
        cp "$req" "$stamp"
      fi ;;
    ioredis | node-redis)
      local stamp=$here/node/node_modules/.installed-lock
      if [ ! -f "$stamp" ] || ! cmp -s "$here/node/package-lock.json" "$stamp"; then
        echo "clients: npm ci"
        (cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
        cp "$here/node/package-lock.json" "$stamp"
      fi ;;
  esac
}

work=$(mktemp -d)
cleanup() {
  for pidfile in "$work"/*/redis.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 0.2
  rm -rf "$work"
}
trap cleanup EXIT

# Free loopback ports below the ephemeral range (32768+), so no client connection takes one
# between this pick and the server's bind: `pick_ports N` for standalone servers (23000-29999),
# `pick_ports N bus` for cluster nodes whose bus port (port + 10000) is free too (20000-22699,
# buses 30000-32699), in $picked. Called in the main shell only, so no port is picked twice.
taken=""
picked=""
pick_ports() {
  picked=$(python3 - "$1" "${2:-}" "$taken" <<'EOF'
import random, socket, sys
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        s.close()
n, bus, taken = int(sys.argv[1]), sys.argv[2] == "bus", set(sys.argv[3].split())
out = []
while len(out) < n:
    p = random.randrange(20000, 22700) if bus else random.randrange(23000, 30000)
    if str(p) in taken or str(p) in out or not free(p) or (bus and not free(p + 10000)):
        continue
    out.append(str(p))
print(" ".join(out))
EOF
)
  taken+=" $picked"
}

# start_server PORT [redis-server args...]: a daemonized server with the module, once it answers
# and the process answering is the one started here.
start_server() {
  local port=$1 dir=$work/$1
  shift
  mkdir -p "$dir"
  "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --loadmodule "$module" "$@" >/dev/null
  for _ in $(seq 200); do
    if [ -f "$dir/redis.pid" ] && "$cli" -p "$port" info server 2>/dev/null | tr -d '\r' |
      grep -qx "process_id:$(cat "$dir/redis.pid")"; then
      return 0
    fi
    sleep 0.05
  done
  echo "clients: $server on port $port did not start"
  cat "$dir/redis.log"
  return 1
}

# start_cluster PORT PORT PORT: three masters with the module, created the way a user does it,
# ready once every node reports the cluster ok with all 16384 slots served (a node can see the
# slots before its state turns ok, and answers CLUSTERDOWN until then).
start_cluster() {
  local p
  for p in "$@"; do
    start_server "$p" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 || return 1
  done
  "$cli" --cluster create "${@/#/127.0.0.1:}" --cluster-yes >"$work/create-$1.log" 2>&1 ||
    { cat "$work/create-$1.log"; return 1; }
  local info
  for p in "$@"; do
    for _ in $(seq 401); do
      info=$("$cli" -p "$p" cluster info | tr -d '\r')
      grep -qx 'cluster_state:ok' <<<"$info" && grep -qx 'cluster_slots_ok:16384' <<<"$info" && break
      sleep 0.05
    done
    grep -qx 'cluster_state:ok' <<<"$info" || { echo "clients: the cluster on $* did not come up"; return 1; }
  done
}

# run_lib LIB PORT [CLUSTER PORTS...]: starts the library's servers, then its jobs in parallel.
# Job N's output goes to $work/LIB.N.out, its exit status to LIB.N.status (job 0: the servers).
run_lib() {
  local lib=$1 port=$2
  shift 2
  local cluster="" n=0 pids=() job
  if ! { start_server "$port" && { [ $# -eq 0 ] || start_cluster "$@"; }; } >"$work/$lib.0.out" 2>&1; then
    echo 1 >"$work/$lib.0.status"
    return
  fi
  rm -f "$work/$lib.0.out"
  if [ $# -gt 0 ]; then cluster=$(IFS=,; echo "$*"); fi
  while IFS= read -r job; do
    n=$((n + 1))
    # A job that hangs is stopped: every case bounds its own waits well below this.
    # shellcheck disable=SC2086
    (
      cd "$here"
      status=0
      LOCK_HOST=127.0.0.1 LOCK_PORT=$port LOCK_CLUSTER=$cluster GO111MODULE=off GOPATH=/usr/share/gocode \
        PYTHONDONTWRITEBYTECODE=1 timeout 300 $job >"$work/$lib.$n.out" 2>&1 || status=$?
      echo "$status" >"$work/$lib.$n.status"
    ) &
    pids+=($!)
  done < <(jobs_of "$lib")
  wait "${pids[@]}" || true
}

for lib in "${libs[@]}"; do
  jobs_of "$lib" >/dev/null
  setup "$lib"
done

started=$(date +%s)
pids=()
for lib in "${libs[@]}"; do
  pick_ports 1
  servers=$picked
  if has_cluster "$lib"; then
    pick_ports 3 bus
    servers+=" $picked"
  fi
  # shellcheck disable=SC2086
  run_lib "$lib" $servers &
  pids+=($!)
done
wait "${pids[@]}" || true

passed=0
failed=0
for lib in "${libs[@]}"; do
  outs=$(find "$work" -maxdepth 1 -name "$lib.*.out" | sort -t. -k2 -n)
  if [ -z "$outs" ]; then
    echo "$lib: not ok - ran no test"
    failed=$((failed + 1))
  fi
  for out in $outs; do
    status=$(cat "${out%.out}.status" 2>/dev/null || echo "unknown")
    sed "s/^/$lib: /" "$out"
    p=$(grep -c '^ok - ' "$out" || true)
    f=$(grep -c '^not ok - ' "$out" || true)
    if [ "$status" != 0 ] && [ "$f" -eq 0 ]; then
      echo "$lib: not ok - $(basename "$out" .out) exited with status $status"
      f=1
    elif [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
      echo "$lib: not ok - $(basename "$out" .out) ran no test"
      f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
  done
done
echo "clients: ${libs[*]} in $(($(date +%s) - started)) s"
echo "clients: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
