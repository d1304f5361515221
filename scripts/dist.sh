#!/usr/bin/env bash
# `make dist`: the four files a user installs, each built and then checked, all in one folder,
# dist/ at the repository root (DIST_DIR for another; printed at the end):
#   redis-lock-module-<version>-linux-<arch>.tar.gz  the module (release build), its example
#       configuration, LICENSE, the Functions library for servers without the module
#       (functions/), and the documentation its README links to (docs/, the two
#       libraries' READMEs and CHANGELOGs, the CLI transcripts and the client guide's tests), so
#       that every link of a shipped Markdown file opens a file of the tarball (checked: a link
#       to a file the tarball lacks fails the build); checked by loading the extracted module
#       into a fresh redis-server and reading its version from MODULE LIST;
#   redis-lock-client-<version>.crate  the Rust library (`cargo package`, which also builds it
#       from the packaged sources alone);
#   redis_lock_client-<version>.tar.gz and -py3-none-any.whl  the Python library (`python -m
#       build`), checked with `twine check --strict` (clients/python/build-dist.sh, which writes
#       into the same folder; build and twine pinned, in a venv under target/).
# What it needs: what `make build` needs, and python3 with venv (scripts/deps.sh dist).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
dist=${DIST_DIR:-$root/dist}
cargo=${CARGO:-cargo}
mkdir -p "$dist"
# Only what an earlier run put there: DIST_DIR may name a folder that holds other files too.
rm -rf "$dist"/redis-lock-module-* "$dist"/redis-lock-client-*.crate "$dist"/redis_lock_client-*

# 1. The module.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
"$cargo" build --release --lib --manifest-path "$root/Cargo.toml"
name="redis-lock-module-$version-linux-$(uname -m)"
stage="$dist/$name"
mkdir -p "$stage"
cp "$target/release/libredis_lock.so" "$root/README.md" "$root/LICENSE" "$stage/"
# The documentation the README links to, and what that links to in turn: the files of these
# paths that the repository tracks (or, outside a git checkout, that are there).
shipped=(docs functions tests/cli tests/clients clients/rust/README.md clients/rust/CHANGELOG.md
  clients/python/README.md clients/python/CHANGELOG.md clients/vectors)
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$root" ls-files -z -- "${shipped[@]}"
else
  (cd "$root" && find "${shipped[@]}" -type f -not -path '*/node_modules/*' -not -path '*/.venv/*' \
    -not -path '*/__pycache__/*' -print0)
fi | (cd "$root" && xargs -0 cp --parents -t "$stage")
sed "s#^loadmodule .*#loadmodule ./libredis_lock.so#" "$root/redis.conf.example" >"$stage/redis.conf.example"
# Every relative link of every shipped Markdown file must open a file (or folder) of the tarball.
python3 "$root/scripts/check-links.py" "$stage"
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
# --allow-dirty: the crate is what the working tree holds, as the module and the Python files
# are (cargo alone would refuse uncommitted changes, and `make test` runs `make dist`).
"$cargo" package --allow-dirty --manifest-path "$root/clients/rust/Cargo.toml" --target-dir "$target" --quiet
cp "$target/package/redis-lock-client-$crate_version.crate" "$dist/"
echo "dist: redis-lock-client-$crate_version.crate"

# 3. The Python library (clients/python/build-dist.sh: build and twine check --strict).
PYTHON_DIST_DIR="$dist" bash "$root/clients/python/build-dist.sh" >/dev/null
echo "dist: $(cd "$dist" && ls redis_lock_client-* | tr '\n' ' ')"
echo "dist: all in $dist"
