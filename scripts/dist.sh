#!/usr/bin/env bash
# `make dist`: the three things a user installs, each built and then checked, in target/dist/:
#   redis-lock-module-<version>-linux-<arch>.tar.gz  the module (release build), its example
#       configuration, README, LICENSE and command reference; checked by loading the extracted
#       module into a fresh redis-server and reading its version from MODULE LIST;
#   redis-lock-client-<version>.crate  the Rust library (`cargo package`, which also builds it
#       from the packaged sources alone);
#   redis_lock_client-<version>.tar.gz and -py3-none-any.whl  the Python library (`python -m
#       build`), checked with `twine check --strict` (clients/python/build-dist.sh; build and
#       twine pinned, in a venv under target/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
dist=$target/dist
cargo=${CARGO:-cargo}
rm -rf "$dist"
mkdir -p "$dist"

# 1. The module.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
"$cargo" build --release --lib --manifest-path "$root/Cargo.toml"
name="redis-lock-module-$version-linux-$(uname -m)"
stage="$dist/$name"
mkdir -p "$stage/docs"
cp "$target/release/libredis_lock.so" "$root/README.md" "$root/LICENSE" "$stage/"
cp "$root/docs/commands.md" "$root/docs/operations.md" "$root/docs/guarantees.md" "$stage/docs/"
sed "s#^loadmodule .*#loadmodule ./libredis_lock.so#" "$root/redis.conf.example" >"$stage/redis.conf.example"
tar -C "$dist" -czf "$dist/$name.tar.gz" "$name"
rm -rf "$stage"
check=$(mktemp -d)
trap 'rm -rf "$check"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true' EXIT
tar -C "$check" -xzf "$dist/$name.tar.gz"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(cd "$check/$name" && exec redis-server ./redis.conf.example --port "$port" --daemonize no \
  >"$check/redis.log" 2>&1) &
pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
want=$(python3 -c "import sys; a,b,c=(int(x) for x in sys.argv[1].split('.')); print(a*10000+b*100+c)" "$version")
got=$(redis-cli -p "$port" module list | awk 'prev=="ver"{print; exit} {prev=$0}')
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
if [ "$got" != "$want" ]; then
  echo "dist: MODULE LIST shows version '$got' for $version (want $want)" >&2
  cat "$check/redis.log" >&2
  exit 1
fi
echo "dist: $name.tar.gz (MODULE LIST: lock ver $got)"

# 2. The Rust library.
crate_version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/clients/rust/Cargo.toml" | head -n 1)
"$cargo" package --manifest-path "$root/clients/rust/Cargo.toml" --target-dir "$target" --quiet
cp "$target/package/redis-lock-client-$crate_version.crate" "$dist/"
echo "dist: redis-lock-client-$crate_version.crate"

# 3. The Python library (clients/python/build-dist.sh: build and twine check --strict).
PYTHON_DIST_DIR="$dist/python" bash "$root/clients/python/build-dist.sh" >/dev/null
mv "$dist"/python/* "$dist/"
rmdir "$dist/python"
echo "dist: $(cd "$dist" && ls redis_lock_client-* | tr '\n' ' ')"
