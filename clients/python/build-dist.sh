#!/usr/bin/env bash
# Builds the Python library's sdist and wheel (python -m build) into dist/ at the repository
# root, the folder `make dist` puts everything in (PYTHON_DIST_DIR for another), and checks them
# (twine check --strict: metadata, README rendering). build and twine are pinned and installed
# from PyPI into a venv of their own under target/ (PYTHON_BUILD_VENV overrides it).
# Prints the two files built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${PYTHON_BUILD_VENV:-$root/target/python-build-venv}
out=${PYTHON_DIST_DIR:-$root/dist}

if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "build==1.6.1" "twine==7.0.0"
# Only this library's files of an earlier run: the folder holds the module and the crate too.
mkdir -p "$out"
rm -f "$out"/redis_lock_client-*
"$venv/bin/python" -m build --sdist --wheel --outdir "$out" "$here" >&2
"$venv/bin/python" -m twine check --strict "$out"/redis_lock_client-* >&2
ls "$out"/redis_lock_client-*
