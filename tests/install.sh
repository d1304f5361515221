#!/usr/bin/env bash
# The README's "Install" section, run as written: its `make dist` in the repository, then each
# artifact's commands in a fresh directory of a user's own, next to a `redis-lock` link to the
# repository (the README's `../redis-lock`), each block read from README.md (nothing retyped here):
#   the module: the tarball unpacked and `redis-server ./redis.conf.example` started as the README
#     says (a shell function adds a free port, --daemonize and a log: port 6379 may be taken),
#     then MODULE LIST must show the version of Cargo.toml, and LOCK.ACQUIRE grant a token;
#   the Rust crate: the README's commands unpack it into vendor/, a project whose [dependencies]
#     are the README's block builds against it and takes a lock on that server;
#   the Python wheel: the README's `pip install` in a fresh venv, which then takes a lock there.
# Also: `make dist` installs no Node.js, and the tarball's link check fails on a missing file.
# Run by `make test-dist`, not by `make test` or CI: make dist's release build is 4.8 min of CPU
# from clean (64 crates), more than CI's 40 minutes have left. LOCK_MODULE is not used: the
# module is the tarball's release build, which `make dist` makes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
work=$(mktemp -d)
pidfile=$work/redis.pid
cleanup() {
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    # Gone before its directory is removed (it deletes its pid file on the way out).
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The README's Install section's code blocks, in order; `block sh N` prints the Nth sh block,
# `block toml 1` the toml one.
block() {
  python3 - "$root/README.md" "$1" "$2" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"```" + sys.argv[2] + r"\n(.*?)```", section, re.S)
print(blocks[int(sys.argv[3]) - 1], end="")
PY
}
step() { echo "install: $*"; }

# `make dist` asks scripts/deps.sh for what building needs and python3 with venv, not for the
# tests' Node.js (tests/make-run.sh checks that deps.sh installs Node.js only for the tests).
plan=$(cd "$root" && make -n dist)
grep -q "scripts/deps.sh dist" <<<"$plan" && ! grep -q "scripts/deps.sh test" <<<"$plan" \
  || { echo "install: make dist does not ask deps.sh for dist alone:" >&2; echo "$plan" >&2; exit 1; }

# The tarball's link check (scripts/check-links.py, run by scripts/dist.sh) fails on a link to a
# file the tarball lacks, and passes once the file is there.
mkdir -p "$work/links/docs"
printf '[ok](docs/a.md#x) [web](https://example.com/) [here](#top) `[code](nowhere.md)`\n[gone](docs/b.md)\n' \
  >"$work/links/README.md"
touch "$work/links/docs/a.md"
if python3 "$root/scripts/check-links.py" "$work/links" 2>"$work/links.err"; then
  echo "install: check-links.py passed a link to a missing file" >&2; exit 1
fi
grep -q "README.md:2: docs/b.md" "$work/links.err" || { cat "$work/links.err" >&2; exit 1; }
touch "$work/links/docs/b.md"
python3 "$root/scripts/check-links.py" "$work/links"

# 1. make dist, in the repository.
step "make dist (README)"
(cd "$root" && bash -euo pipefail -c "$(block sh 1)")

ln -s "$root" "$work/redis-lock"
project=$work/my-service
mkdir "$project"

# 2. The module: the README's two lines; `redis-server` in the foreground would block the test,
# and 6379 may be taken.
step "the module (README)"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(cd "$project" && bash -euo pipefail -c "
redis-server() { command redis-server \"\$@\" --port $port --daemonize yes --pidfile $pidfile --logfile $work/redis.log; }
$(block sh 2)")
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
want=$(python3 -c "import sys; a,b,c=(int(x) for x in sys.argv[1].split('.')); print(a*10000+b*100+c)" "$version")
got=$(redis-cli -p "$port" module list | awk 'prev=="ver"{print; exit} {prev=$0}')
[ "$got" = "$want" ] || { echo "install: MODULE LIST shows '$got', want $want" >&2; cat "$work/redis.log" >&2; exit 1; }
token=$(redis-cli -p "$port" LOCK.ACQUIRE install:module me 30000)
[ "$token" -gt 0 ] || { echo "install: LOCK.ACQUIRE answered '$token'" >&2; exit 1; }
url="redis://127.0.0.1:$port/"

# 3. The Rust crate: unpacked as the README says, a project with the README's [dependencies].
step "the Rust crate (README)"
(cd "$project" && bash -euo pipefail -c "$(block sh 3)")
{
  printf '[package]\nname = "my-service"\nversion = "0.1.0"\nedition = "2021"\n\n'
  block toml 1
} >"$project/Cargo.toml"
mkdir "$project/src"
cat >"$project/src/main.rs" <<'RS'
use redis_lock_client::LockClient;

#[tokio::main]
async fn main() -> Result<(), redis_lock_client::LockError> {
    let url = std::env::args().nth(1).expect("a server URL");
    let client = LockClient::open(&url).await?;
    let mut guard = client.lock("install:rust").acquire().await?;
    println!("{}", guard.token());
    guard.release().await?;
    Ok(())
}
RS
# The workspace's lock file, as clients/rust/tests/install.rs does: what the project shares with
# the workspace resolves to the versions tested and already fetched; the rest comes from the
# registry. Builds are kept apart from the workspace's (with install.rs's).
cp "$root/Cargo.lock" "$project/Cargo.lock"
token=$(cd "$project" && CARGO_TARGET_DIR=$target/install-check cargo run --quiet -- "$url")
[ "$token" -gt 0 ] || { echo "install: the Rust project printed '$token'" >&2; exit 1; }
redis-cli -p "$port" exists install:rust | grep -qx 0

# 4. The Python wheel: the README's pip install, in a fresh venv.
step "the Python wheel (README)"
python3 -m venv "$project/.venv"
(cd "$project" && PATH="$project/.venv/bin:$PATH" bash -euo pipefail -c "$(block sh 4)")
token=$(cd "$project" && .venv/bin/python - "$url" <<'PY'
import sys
import redis_lock_client
from redis_lock_client import LockClient
assert "site-packages" in redis_lock_client.__file__, redis_lock_client.__file__
with LockClient.from_url(sys.argv[1]) as client:
    with client.lock("install:python") as guard:
        print(guard.token)
PY
)
[ "$token" -gt 0 ] || { echo "install: the Python program printed '$token'" >&2; exit 1; }
redis-cli -p "$port" exists install:python | grep -qx 0
step "every artifact installed with the README's commands"
