#!/usr/bin/env bash
# Build the documentation site (docs/, Sphinx and myst-nb) into docs/_build/html, warnings as
# errors; with --serve, then serve it at http://127.0.0.1:8000 (--port P for another port).
#   The tutorials are pages with their outputs: the notebook tests' runs where they are
#   (test-artifacts/notebooks, or $CLUSTERBOOK_ARTIFACTS/notebooks), else run for the build
#   ($CLUSTERBOOK_DOCS_RUN: all, none, or names; see docs/_ext/tutorials.py).
#   The widgets are drawn by Jupyter's HTML manager, taken from the npm registry once
#   (docs/_build/widgets-js), so the site needs nothing from a CDN.
# Needs .venv with the dev extra (scripts/test.sh makes it), and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
serve=0
port=8000
out=docs/_build/html
while [ $# -gt 0 ]; do
  case "$1" in
    --serve) serve=1 ;;
    --port) port=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "usage: scripts/docs.sh [--serve] [--port P] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-.venv/bin/python}
HTML_MANAGER=1.0.15  # @jupyter-widgets/html-manager for ipywidgets 8
js=docs/_build/widgets-js/html-manager
if [ ! -f "$js/embed.js" ] || [ "$(cat "$js/VERSION" 2>/dev/null)" != "$HTML_MANAGER" ]; then
  command -v npm >/dev/null || { echo "scripts/docs.sh needs npm (Node.js)" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  npm pack --silent "@jupyter-widgets/html-manager@$HTML_MANAGER" --pack-destination "$tmp" >/dev/null
  tar -xzf "$tmp"/jupyter-widgets-html-manager-*.tgz -C "$tmp"
  rm -rf "$js" && mkdir -p "$js"
  # embed.js draws the widgets with their saved state; the fonts are its icons.
  cp "$tmp"/package/dist/* "$tmp"/package/package.json "$js"/  # package.json: its license
  rm -f "$js"/embed-amd.js  # for widgets of other packages, loaded with require.js: none here
  echo "$HTML_MANAGER" > "$js/VERSION"
fi
start=$(date +%s)
"$PY" -m sphinx -W --keep-going -q -b html docs "$out"
echo "docs built in $(( $(date +%s) - start )) s: $out/index.html"
if [ "$serve" = 1 ]; then
  echo "serving on http://127.0.0.1:$port/ (Ctrl-C ends it)"
  exec "$PY" -m http.server "$port" --bind 127.0.0.1 --directory "$out"
fi
