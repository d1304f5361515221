#!/usr/bin/env bash
# Runs every tests/cli/*.txt transcript against a fresh redis-server with the module loaded.
# A transcript is what a user would see in redis-cli: lines starting with "> " are typed, the
# lines after them are the expected output (redis-cli --no-raw formatting). The server and the
# CLI are $LOCK_SERVER and $LOCK_CLI (default redis-server and redis-cli; make test-valkey,
# test-redis8 and test-valkey9 set them: scripts/server-deps.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
module=${LOCK_MODULE:-$here/../../target/debug/libredis_lock.so}
server=${LOCK_SERVER:-redis-server}
cli=${LOCK_CLI:-redis-cli}
passed=0
failed=0
for transcript in "$here"/*.txt; do
  dir=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$server" --port "$port" --bind 127.0.0.1 --save "" --dir "$dir" --daemonize yes \
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --loadmodule "$module" >/dev/null
  for _ in $(seq 100); do "$cli" -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  actual="$dir/actual.txt"
  : >"$actual"
  while IFS= read -r line; do
    if [[ "$line" == "> "* ]]; then
      cmd=${line#> }
      echo "$line" >>"$actual"
      # shellcheck disable=SC2086
      eval "\"\$cli\" -p $port --no-raw $cmd" >>"$actual" 2>&1 || true
    elif [[ "$line" == "# "* || -z "$line" ]]; then
      echo "$line" >>"$actual"
    fi
  done <"$transcript"
  # Values that change from run to run (ttl) are written as <ms> in the transcript.
  normalize() { sed -E -e 's/\(integer\) [0-9]{3,}$/(integer) <ms>/' -e 's/^([0-9]+\) )"[0-9]{10,}"$/\1"<token>"/' \
    -e 's/^([0-9]+\) )"exclusive:[0-9]{10,}"$/\1"exclusive:<token>"/' "$1"; }
  if diff -u <(normalize "$transcript") <(normalize "$actual") >"$dir/diff"; then
    echo "cli: $(basename "$transcript") ok"
    passed=$((passed + 1))
  else
    echo "cli: $(basename "$transcript") FAILED"
    cat "$dir/diff"
    failed=$((failed + 1))
  fi
  kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  sleep 0.1
  rm -rf "$dir"
done
echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
