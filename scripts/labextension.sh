#!/usr/bin/env bash
# Build the JupyterLab extension (labextension/) from source with this machine's Node.js and
# npm, into labextension/build/clusterbook-labextension, and make the venv's JupyterLab load
# it from there: `jupyter labextension list` then shows clusterbook-labextension enabled.
# A wheel built afterwards carries the build (pyproject.toml's shared-data).
#   VENV  the venv whose JupyterLab builds and loads it (default: .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(cd "${VENV:-.venv}" && pwd)
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "labextension: Node.js and npm are needed to build the JupyterLab extension" \
    "(apt-get install nodejs npm, or Node.js 20 from nodejs.org)" >&2
  exit 1
}
here=$PWD
(
  cd labextension
  # The lock file pins every package: the same tree on every machine, and quick.
  npm ci --no-audit --no-fund --loglevel=error
  npx tsc
  PATH="$VENV/bin:$PATH" jupyter labextension build . >/dev/null
)
built="$here/labextension/build/clusterbook-labextension"
dest="$VENV/share/jupyter/labextensions/clusterbook-labextension"
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"  # an editable install's copy of an older build, or an old link
ln -s "$built" "$dest"
