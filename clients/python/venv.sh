#!/usr/bin/env bash
# The Python library's venv (run-tests.sh, and the failover test's Python driver): makes
# target/python-client-venv (PYTHON_CLIENT_VENV for another place) when it has no working pip,
# and installs ./clients/python[test] into it from PyPI (pinned: redis, pytest, pytest-xdist, mypy,
# hypothesis). Not editable: what runs is what `pip install ./clients/python` installs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${PYTHON_CLIENT_VENV:-$root/target/python-client-venv}
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here[test]"
