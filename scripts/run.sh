#!/usr/bin/env bash
# `make run`: Redis in the foreground on 127.0.0.1:$PORT with the module, configured by
# redis.conf.example (every option at its default). The module is the release build wherever
# cargo put it ($CARGO_TARGET_DIR when set, spaces and all): the example's loadmodule line is
# pointed at it in a copy under that directory. A port already in use is reported, never taken
# over.
#   bash scripts/run.sh <port>
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
port=$1
target=${CARGO_TARGET_DIR:-$here/target}
case $target in /*) ;; *) target=$here/$target ;; esac
module=$target/release/libredis_lock.so
if [ ! -f "$module" ]; then
  echo "run: no module at $module (build it with: cargo build --release --lib)" >&2
  exit 1
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "run: 127.0.0.1:$port is already in use (another Redis?). Nothing was stopped." >&2
  echo "run: pick another port: make run PORT=7000" >&2
  exit 1
fi
conf=$target/release/redis-run.conf
# Quoted for Redis's config parser: backslashes and double quotes escaped.
quoted=${module//\\/\\\\}
quoted=${quoted//\"/\\\"}
while IFS= read -r line; do
  case $line in
    loadmodule\ *) printf 'loadmodule "%s"\n' "$quoted" ;;
    *) printf '%s\n' "$line" ;;
  esac
done <"$here/redis.conf.example" >"$conf"
cd "$here"
exec redis-server "$conf" --port "$port"
