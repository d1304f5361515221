#!/usr/bin/env bash
# The Python library's checks (make test): installs ./clients/python[test] from PyPI into a venv
# under target/ (pinned: redis, pytest, pytest-xdist, mypy, hypothesis), then mypy --strict on the package and
# pytest on clients/python/tests against real servers. First, unasync.py --check fails when the
# generated sync library (redis_lock_client/_sync/) is not what the asyncio source makes, and
# check-scenarios.py when a row of docs/client-scenarios.md has no Python test. LOCK_MODULE names
# the module (default target/debug/libredis_lock.so, built by `cargo build --lib`); LOCK_SERVER
# another server. Arguments go to pytest instead of the whole suite (`run-tests.sh
# test_oracle.py`: only the oracle). The whole suite runs in PY_TEST_JOBS processes (default 4,
# pytest-xdist, a test file per process at a time: its servers and module-scoped fixtures stay
# together): the tests mostly wait on servers (2 min of CPU in 8 min serial), so on two cores
# four jobs took 180 s where two took 300-380 s. Files named on the command line run in one
# process, their reports printed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${PYTHON_CLIENT_VENV:-$root/target/python-client-venv}
export LOCK_MODULE=${LOCK_MODULE:-$root/target/debug/libredis_lock.so}

# Not editable: what is tested is what `pip install ./clients/python` installs (venv.sh).
PYTHON_CLIENT_VENV=$venv bash "$here/venv.sh"
"$venv/bin/python" "$here/unasync.py" --check
"$venv/bin/python" "$here/check-scenarios.py"
"$venv/bin/python" -m mypy --strict --cache-dir "$root/target/python-client-mypy-cache" -p redis_lock_client
"$venv/bin/python" -m mypy --strict --cache-dir "$root/target/python-client-mypy-cache" "$here/unasync.py"
cd "$here/tests"
jobs=()
if [ $# -eq 0 ] && [ "${PY_TEST_JOBS:-4}" -gt 1 ]; then
  jobs=(-n "${PY_TEST_JOBS:-4}" --dist loadfile)
fi
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "${jobs[@]}" "$@"
