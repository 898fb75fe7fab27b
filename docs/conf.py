"""Sphinx's settings for clusterbook's documentation site (built by scripts/docs.sh).

The pages are Markdown (MyST); the tutorials are the notebooks of notebooks/, with their
executed outputs and widgets (myst-nb), which scripts/docs.sh puts in tutorials/ before the
build: from the notebook tests' runs when there are some, else run here. The reference pages
are generated from the code (docs/_ext/reference.py): the public names' docstrings, the
command's parser, the CLUSTERBOOK_* variables and the error tree.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from clusterbook.version import __version__  # noqa: E402

project = "clusterbook"
author = "The clusterbook developers"
copyright = "2026, the clusterbook developers"
version = release = __version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "reference",
    "tutorials",
]
exclude_patterns = ["_build", "widgets", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]

# MyST: the architecture and development documents are plain Markdown pages too.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Tutorials: scripts/docs.sh runs them (or takes the notebook tests' runs); never here.
nb_execution_mode = "off"
nb_merge_streams = True
# The widgets' saved state is drawn by Jupyter's HTML manager, served with the site (never
# from a CDN: scripts/docs.sh copies it from the npm package into _build/widgets-js).
WIDGETS_JS = Path(os.environ.get("CLUSTERBOOK_DOCS_WIDGETS_JS", HERE / "_build" / "widgets-js"))
nb_ipywidgets_js = {"html-manager/embed.js": {}}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_numpy_docstring = True
napoleon_google_docstring = False

html_theme = "furo"
html_title = f"clusterbook {__version__}"
html_static_path = ["_static", str(WIDGETS_JS)]
html_css_files = ["clusterbook.css"]
html_theme_options = {
    "source_repository": "https://github.com/OWNER/REPO",
    "source_branch": "HEAD",
    "source_directory": "docs/",
}

# The how-to guides include the README's sections, whose headings start at level 2 or 3.
suppress_warnings = ["myst.header"]

#: Links of pages that are also read elsewhere (the notebooks in Jupyter, development.md on
#: GitHub) to files outside docs/: in the site they lead to its own pages, or to the
#: repository.
LINKS = {
    "](../CHANGELOG.md)": "](changelog.md)",
    "](../README.md)": "](../how-to/index.md)",
    "](companions/07-attach.ipynb)": (
        "](https://github.com/OWNER/REPO/blob/HEAD/notebooks/companions/07-attach.ipynb)"
    ),
}


def _relink(app: object, docname: str, source: list[str]) -> None:
    for old, new in LINKS.items():
        source[0] = source[0].replace(old, new)


def setup(app: object) -> None:
    app.connect("source-read", _relink)  # type: ignore[attr-defined]
