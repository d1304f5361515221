#!/usr/bin/env bash
# `make run`: Redis in the foreground on 127.0.0.1:$PORT with the module, configured by
# redis.conf.example (every option at its default). The module is the release build wherever
# cargo put it (CARGO_TARGET_DIR respected): the example's loadmodule line is pointed at it in a
# copy under the target directory. A port already in use is reported, never taken over.
#   bash scripts/run.sh <module.so> <port>
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
module=$1
port=$2
if [ ! -f "$module" ]; then
  echo "run: no module at $module (build it with: cargo build --release --lib)" >&2
  exit 1
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "run: 127.0.0.1:$port is already in use (another Redis?). Nothing was stopped." >&2
  echo "run: pick another port: make run PORT=7000" >&2
  exit 1
fi
conf="$(dirname "$module")/redis-run.conf"
sed "s#^loadmodule .*#loadmodule $module#" "$here/redis.conf.example" >"$conf"
cd "$here"
exec redis-server "$conf" --port "$port"
