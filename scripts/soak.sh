#!/usr/bin/env bash
# `make soak RUNS=5`: the whole of `make test`, RUNS times in a row, on a fresh clone of HEAD
# (what is committed, nothing of the work tree's changes), with one core kept busy by a spinning
# process, as a second job on the machine would; then every test that failed, with the number of
# runs it failed in. Hours: not part of `make test`.
#
#   RUNS=5 bash scripts/soak.sh
#   SOAK_CMD='cargo test --test sentinel' RUNS=2 bash scripts/soak.sh   another command per run
#
# The clone is a temporary directory with ../shared beside it (a link to the repository's own
# ../shared, which a test reads), built from scratch by its first run, and removed at the end
# (SOAK_KEEP=1 keeps it); each run's log is kept in SOAK_LOGS (default a temporary directory,
# printed). A run goes on past a failure, so that one failing test does not hide the others:
# `make -i test` with a cargo whose `cargo test` is `cargo test --no-fail-fast`. The report
# reads cargo test's `test NAME ... FAILED` lines and failure lists (named after the test
# binary), pytest's `FAILED path::name` and `ERROR path::name` lines, and any other step of
# `make test` that failed (make's `Error ... (ignored)` lines, named after the Makefile line).
# SOAK_BUSY=0 runs without the spinning process. Exit status 1 if anything failed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
runs=${RUNS:-5}
work=$(mktemp -d "${TMPDIR:-/tmp}/lock-soak.XXXXXX")
logs=${SOAK_LOGS:-$work/logs}
mkdir -p "$logs"
spinner=

cleanup() {
  if [[ -n $spinner ]]; then
    kill "$spinner" 2>/dev/null || true
    wait "$spinner" 2>/dev/null || true
  fi
  if [[ ${SOAK_KEEP:-0} != 1 ]]; then
    rm -rf "$work/main" "$work/bin"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh clone of the commit checked out here, and ../shared beside it.
head=$(git -C "$root" rev-parse HEAD)
git clone --quiet "$root" "$work/main"
git -C "$work/main" checkout --quiet --detach "$head"
if [[ -d $root/../shared ]]; then
  ln -s "$(cd "$root/../shared" && pwd)" "$work/shared"
fi
# The clone builds into its own target/, whatever this shell's CARGO_TARGET_DIR.
unset CARGO_TARGET_DIR

if [[ -n ${SOAK_CMD:-} ]]; then
  cmd=$SOAK_CMD
else
  # `cargo test` without stopping at the first test binary that fails.
  mkdir -p "$work/bin"
  real_cargo=$(command -v cargo)
  cat >"$work/bin/cargo" <<EOF
#!/usr/bin/env bash
if [[ \${1:-} == test ]]; then shift; exec "$real_cargo" test --no-fail-fast "\$@"; fi
exec "$real_cargo" "\$@"
EOF
  chmod +x "$work/bin/cargo"
  cmd="make -i test CARGO=$work/bin/cargo"
fi

if [[ ${SOAK_BUSY:-1} == 1 ]]; then
  # One core busy for as long as the runs last (killed by the trap on any exit).
  (while :; do :; done) &
  spinner=$!
fi

echo "soak: $runs runs of '$cmd' on a clone of $head in $work/main; logs in $logs"
for ((i = 1; i <= runs; i++)); do
  started=$(date +%s)
  status=0
  (cd "$work/main" && bash -c "$cmd") >"$logs/run-$i.log" 2>&1 || status=$?
  echo "$status" >"$logs/run-$i.status"
  echo "soak: run $i of $runs: exit status $status after $(($(date +%s) - started)) s ($logs/run-$i.log)"
done

# The failed tests of one log, each once.
failed_in() {
  awk '
    /^ +Running / { binary = ($2 == "unittests") ? $3 : $2; next }
    /^ +Doc-tests / { binary = "doc-tests " $2; next }
    /^test .* \.\.\. FAILED$/ {
      name = substr($0, 6); sub(/ \.\.\. FAILED$/, "", name); print binary ": " name; next
    }
    /^failures:$/ { n = 0; listing = 1; next }
    listing && /^test result:/ {
      for (k = 1; k <= n; k++) print binary ": " names[k]
      listing = 0; next
    }
    listing && /^    [^ ]+$/ { names[++n] = substr($0, 5); next }
    /^(FAILED|ERROR) [^ ]+::/ { print "pytest: " $2; next }
    /^make(\[[0-9]+\])?: \[.*\] Error [0-9]+ \(ignored\)$/ {
      sub(/^make(\[[0-9]+\])?: /, ""); print "make step " $0
    }
  ' "$1" | sort -u
}

# A run that failed without naming a test (a build that broke, a SOAK_CMD of another shape)
# counts too.
failed_run() {
  local found
  found=$(failed_in "$logs/run-$1.log")
  if [[ -n $found ]]; then
    echo "$found"
  elif [[ $(cat "$logs/run-$1.status") != 0 ]]; then
    echo "the run's command failed, no test named (see its log)"
  fi
}

report=$(for ((i = 1; i <= runs; i++)); do failed_run "$i"; done | sort | uniq -c |
  sort -k1,1nr -k2)
echo
if [[ -z $report ]]; then
  echo "soak: no test failed in $runs runs"
  exit 0
fi
echo "soak: failed tests (runs failed, of $runs):"
echo "$report"
exit 1
