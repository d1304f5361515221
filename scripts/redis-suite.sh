#!/usr/bin/env bash
# Runs Redis's own Tcl test suite against the installed redis-server, once without the module and
# once with it loaded (the suite's `--config loadmodule <module>`: every server the suite starts
# loads it), and prints the tests that fail with the module and not without it.
#
#   bash scripts/redis-suite.sh MODULE [UNIT ...]   the units named (shell patterns over the
#                                                   suite's unit list: integration/replication*),
#                                                   or in $UNITS (what `make redis-suite` passes)
#   ALL=1 bash scripts/redis-suite.sh MODULE        every unit of the suite
#
# With no unit and no ALL=1: the units nearest to what the module touches (DEFAULT_UNITS below).
# The suite is the one of the installed version, taken from Debian's source package of that exact
# version (`apt-get source`, signatures checked by apt) with a sources file, package lists and
# cache of its own under $SUITE_DIR: the system's apt configuration is not touched. It is kept
# there for the next run, never committed. Debian's binaries are linked into the suite's src/.
#
# Each unit runs as its own `runtest --single <unit> --durable` (an error in one test does not
# stop its unit, nor a unit the others), JOBS (default 2) at a time, each lane in a copy of the
# suite and on ports of its own (1,000 from BASEPORT, default 21111, for the first lane; give a
# second run at the same time another BASEPORT). Logs: $SUITE_DIR/results/{without,with}/*.log.
# REPORT=1 only prints the report of the last run's logs. The report: each unit's counts with
# and without the module, then every test that fails with the module more often than without
# it (numbers in test names count as one: some units name tests after random values). Exit
# status 0 when there is none, 1 otherwise.
set -euo pipefail

DEFAULT_UNITS=(
  'integration/replication*' integration/block-repl 'integration/psync2*'
  'integration/aof*' integration/rdb
  unit/pubsub unit/pubsubshard unit/keyspace-events unit/expire
  unit/scripting unit/functions 'unit/acl*' unit/maxmemory unit/type/hash
)

module=${1:-}
if [ -z "$module" ] || [ ! -f "$module" ]; then
  echo "usage: bash scripts/redis-suite.sh MODULE.so [UNIT ...]  (ALL=1 for every unit)" >&2
  exit 2
fi
module=$(cd "$(dirname "$module")" && pwd)/$(basename "$module")
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
suite_dir=${SUITE_DIR:-$root/target/redis-suite}
jobs=${JOBS:-2}
mkdir -p "$suite_dir"
suite_dir=$(cd "$suite_dir" && pwd)

# What the suite needs beyond scripts/deps.sh: tclsh and dpkg-source.
need=()
command -v tclsh8.6 >/dev/null 2>&1 || command -v tclsh8.7 >/dev/null 2>&1 || command -v tclsh8.5 >/dev/null 2>&1 || need+=(tcl)
command -v dpkg-source >/dev/null 2>&1 || need+=(dpkg-dev)
if ((${#need[@]})); then
  echo "redis-suite: installing ${need[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The installed server's Debian version (5:7.0.15-1~deb12u10) and source package (redis).
if ! version=$(dpkg-query -W -f='${Version}' redis-server 2>/dev/null) || [ -z "$version" ]; then
  echo "redis-suite: needs Debian's redis-server package (scripts/deps.sh installs it)" >&2
  exit 1
fi
source_pkg=$(dpkg-query -W -f='${source:Package}' redis-server)
upstream=${version#*:}
upstream=${upstream%%-*}
server=$(command -v redis-server)
if ! "$server" --version | grep -q "v=$upstream "; then
  echo "redis-suite: $server is not Debian's redis-server $version" >&2
  exit 1
fi
tree=$suite_dir/$source_pkg-${version#*:}

if [ ! -f "$tree/tests/test_helper.tcl" ]; then
  echo "redis-suite: fetching Debian's source package $source_pkg $version" >&2
  apt_dir=$suite_dir/apt
  rm -rf "$apt_dir" "$tree"
  mkdir -p "$apt_dir/sources" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/download"
  # shellcheck disable=SC1091
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  cat >"$apt_dir/sources/debian-src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $codename $codename-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: $codename-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  apt_opts=(
    -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/sources"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
    -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)"
  )
  apt-get "${apt_opts[@]}" -qq update
  if ! (cd "$apt_dir/download" && apt-get "${apt_opts[@]}" -qq source --download-only "$source_pkg=$version"); then
    echo "redis-suite: Debian's archive has no source of $source_pkg $version (a newer one replaced it?): upgrade redis-server" >&2
    exit 1
  fi
  # apt checked the files against the signed Sources index; dpkg-source, without Debian's
  # keyring, says it cannot check the .dsc's own signature.
  dpkg-source -x "$apt_dir/download/${source_pkg}_${version#*:}.dsc" "$tree" >/dev/null
  rm -rf "$apt_dir" "$suite_dir/${source_pkg}_"*.orig.tar.*
fi

# The suite's units, in its order, and the ones asked for.
mapfile -t all_units < <(sed -n '/^set ::all_tests {/,/^}/p' "$tree/tests/test_helper.tcl" | sed '1d;$d' | awk '{print $1}')
if [ "${ALL:-0}" = 1 ]; then
  units=("${all_units[@]}")
else
  patterns=("$@")
  ((${#patterns[@]})) || read -ra patterns <<<"${UNITS:-}"
  ((${#patterns[@]})) || patterns=("${DEFAULT_UNITS[@]}")
  units=()
  for pattern in "${patterns[@]}"; do
    matched=false
    for unit in "${all_units[@]}"; do
      # shellcheck disable=SC2053
      if [[ $unit == $pattern ]]; then
        matched=true
        [[ " ${units[*]} " == *" $unit "* ]] || units+=("$unit")
      fi
    done
    $matched || echo "redis-suite: no unit $pattern in Redis $upstream's suite, skipped" >&2
  done
fi
((${#units[@]})) || { echo "redis-suite: no unit to run" >&2; exit 2; }

# The report of the logs in $results (see the top of this file).
report() {
python3 - "$results" "${units[@]}" <<'EOF'
import collections, re, sys

results, units = sys.argv[1], sys.argv[2:]
ansi = re.compile(r"\x1b\[[0-9;]*m")

def parse(mode, unit):
    """Counts of each test by status, the exceptions and the exit status of one unit's run.
    Numbers in test names become N: some units name tests by random values or topologies
    (psync2's 'Set #4 to replicate from #2', 'x = 75810'), and run time-bound loops."""
    names = {s: collections.Counter() for s in ("ok", "err", "skip", "ignore")}
    exceptions = []
    with open(f"{results}/{mode}/{unit.replace('/', '_')}.log", errors="replace") as log:
        for line in log:
            line = ansi.sub("", line.rstrip("\n"))
            m = re.match(r"\[(ok|err|skip|ignore|exception|exit)\]: (.*)", line)
            if not m:
                continue
            kind, data = m.groups()
            if kind == "exit":
                continue
            if kind == "exception":
                exceptions.append(data)
                continue
            if kind == "ok":
                data = re.sub(r" \(\d+ ms\)$", "", data)
            elif kind == "err":
                data = re.sub(r" in tests/\S+\.tcl$", "", data)
            names[kind][re.sub(r"\d+", "N", data)] += 1
    return names, exceptions

totals = {m: collections.Counter() for m in ("without", "with")}
differences, both_failed, only_without_failed, fewer = [], [], [], []
print(f"{'':42} {'without the module':>20}     {'with the module':>20}")
print(f"{'unit':42} {'passed':>7} {'failed':>7} {'skip':>5}     {'passed':>7} {'failed':>7} {'skip':>5}")
for unit in units:
    runs = {m: parse(m, unit) for m in ("without", "with")}
    row = []
    for m, (names, exceptions) in runs.items():
        counts = {s: sum(c.values()) for s, c in names.items()}
        for s, n in counts.items():
            totals[m][s] += n
        totals[m]["exceptions"] += len(exceptions)
        mark = "EXC" if exceptions else ""
        row.append(f"{counts['ok']:>7} {counts['err']:>7} {counts['skip'] + counts['ignore']:>5} {mark:3}")
    print(f"{unit:42} {row[0]} {row[1]}".rstrip())
    (w, w_exc), (m, m_exc) = runs["without"], runs["with"]
    # A test that fails more often with the module than without: the module's doing.
    for name, n in m["err"].items():
        extra = n - w["err"][name]
        if extra > 0:
            passed = "passes" if w["ok"][name] else "does not run"
            differences.append(f"{unit}: {name!r} {passed} without the module, fails with it" + (f" (x{extra})" if extra > 1 else ""))
        if w["err"][name]:
            both_failed.append(f"{unit}: {name!r}")
    for exc in m_exc:
        if exc not in w_exc:
            differences.append(f"{unit}: the unit stopped with the module only: {exc}")
    for name in w["err"]:
        if not m["err"][name]:
            only_without_failed.append(f"{unit}: {name!r}")
    ran = {k: sum(v["ok"].values()) + sum(v["err"].values()) for k, v in (("without", w), ("with", m))}
    if ran["with"] < ran["without"]:
        fewer.append(f"{unit}: {ran['with']} tests ran with the module, {ran['without']} without")

for mode in ("without", "with"):
    t = totals[mode]
    print(f"total {mode:7} the module: {t['ok']} passed, {t['err']} failed, {t['skip'] + t['ignore']} skipped, {t['exceptions']} units stopped by an exception")
if both_failed:
    print("\nfailed with and without the module (not the module's doing):")
    print("\n".join("  " + d for d in both_failed))
if only_without_failed:
    print("\nfailed without the module only (timing or flaky tests):")
    print("\n".join("  " + d for d in only_without_failed))
if fewer:
    print("\nfewer tests ran with the module (units that loop for a time or pick tests at random do;")
    print("a unit cut short shows as a failure or an exception above):")
    print("\n".join("  " + d for d in fewer))
if differences:
    print(f"\n{len(differences)} difference(s): fails with the module, not without it:")
    print("\n".join("  " + d for d in differences))
    sys.exit(1)
print("\nno difference: no test fails with the module that passes without it")
EOF
}

results=$suite_dir/results
if [ "${REPORT:-0}" = 1 ]; then
  report
  exit
fi
rm -rf "$results" "$suite_dir"/lane-*
mkdir -p "$results/without" "$results/with"
# A run cleans the tree's tests/tmp when it starts: each lane runs in a copy of its own, whose
# src/redis-server, src/redis-cli ... are Debian's binaries.
for ((lane = 0; lane < jobs; lane++)); do
  cp -a "$tree" "$suite_dir/lane-$lane"
  for binary in redis-server redis-cli redis-benchmark redis-check-aof redis-check-rdb; do
    if path=$(command -v "$binary"); then
      ln -sf "$path" "$suite_dir/lane-$lane/src/$binary"
    fi
  done
done
echo "redis-suite: Redis $upstream ($server), ${#units[@]} units, $jobs at a time, module $module" >&2
echo "redis-suite: logs in $results" >&2

# One run of one unit: its output to results/<mode>/<unit>.log, its exit status at the end.
run_unit() {
  local mode=$1 unit=$2 lane=$3 log
  log=$results/$mode/${unit//\//_}.log
  local extra=()
  [ "$mode" = with ] && extra=(--config loadmodule "$module")
  local started=$SECONDS status=0
  # --durable: an error outside a test's assertions fails that test (reported as [err]) and the
  # unit goes on, instead of ending the unit there; --dump-logs: a failed test's server logs.
  (cd "$suite_dir/lane-$lane" && ./runtest --single "$unit" --clients 1 --durable --dump-logs \
    --baseport $((${BASEPORT:-21111} + 1000 * lane)) --portcount 1000 \
    "${extra[@]}") >"$log" 2>&1 </dev/null || status=$?
  echo "[exit]: $status" >>"$log"
  echo "redis-suite: $mode $unit: exit $status ($((SECONDS - started)) s)" >&2
}

# Jobs in the order (without u1) (with u1) (without u2) ... dealt to $jobs lanes: with JOBS=2 one
# lane runs every unit without the module while the other runs it with, under the same load.
job_list=()
for unit in "${units[@]}"; do job_list+=("without $unit" "with $unit"); done
# Interrupted: stop the lanes, then the suite's processes and the servers it started (found by
# their working directory, inside the lanes' copies).
stop_lanes() {
  trap - INT TERM
  kill "${lane_pids[@]}" 2>/dev/null || true
  for pid in $(pgrep -f 'tests/test_helper.tcl') $(pgrep -f 'src/redis-server'); do
    case $(readlink "/proc/$pid/cwd" 2>/dev/null) in
      "$suite_dir"/lane-*) kill "$pid" 2>/dev/null || true ;;
    esac
  done
  exit 130
}
lane_pids=()
trap stop_lanes INT TERM
for ((lane = 0; lane < jobs; lane++)); do
  (
    for ((i = lane; i < ${#job_list[@]}; i += jobs)); do
      # shellcheck disable=SC2086
      run_unit ${job_list[$i]} "$lane"
    done
  ) &
  lane_pids+=($!)
done
for pid in "${lane_pids[@]}"; do wait "$pid"; done

report
