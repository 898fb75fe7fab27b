"""The tutorials as pages: notebooks/ executed, with their outputs and widget state, put in
``tutorials/`` (which git ignores but its index) when the build starts.

A tutorial's execution is taken from the notebook tests when they ran it (their copies,
``executed-NAME.ipynb`` in ``$CLUSTERBOOK_ARTIFACTS/notebooks``, default
``test-artifacts/notebooks``, newer than the notebook), the way CI builds the site after the
tests; otherwise it runs here, with nbclient, in a copy of notebooks/ and with a throwaway home
(nothing is written in the checkout or in the user's home). ``CLUSTERBOOK_DOCS_RUN`` says
which tutorials may run here: ``all`` (the default), ``none``, or names separated by commas
(``01-local-cluster.ipynb``); one that neither ran nor may run is a page without outputs.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1]
REPO = DOCS.parent
NOTEBOOKS = REPO / "notebooks"
OUT = DOCS / "tutorials"
CELL_TIMEOUT = 600


def executed_copies() -> Path:
    root = os.environ.get("CLUSTERBOOK_ARTIFACTS") or str(REPO / "test-artifacts")
    return Path(root) / "notebooks"


def may_run(name: str) -> bool:
    allowed = os.environ.get("CLUSTERBOOK_DOCS_RUN", "all").strip()
    if allowed in ("all", ""):
        return True
    return name in {n.strip() for n in allowed.split(",")}


def _from_tests(source: Path) -> Any | None:
    """The notebook tests' run of ``source``, without the cells they added, if it is newer."""
    import nbformat

    copy = executed_copies() / f"executed-{source.name}"
    if not copy.exists() or copy.stat().st_mtime < source.stat().st_mtime:
        return None
    nb = nbformat.read(copy, as_version=4)
    count = len(nbformat.read(source, as_version=4).cells)
    nb.cells = nb.cells[:count]  # the tests append a cell that reports on the kernel
    return nb


def _run(source: Path, stage: Path) -> Any:
    """``source`` run with nbclient in ``stage`` (a copy of notebooks/), whose home is a
    fresh directory there; widget state stored."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(stage / source.name, as_version=4)
    home = Path(tempfile.mkdtemp(prefix="home-", dir=stage))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "XDG_"))}
    env.pop("CLUSTERBOOK_RUN_ROOT", None)
    env.update(HOME=str(home), PYTHONNOUSERSITE="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(stage)}},
        store_widget_state=True,
    )
    client.execute(env=env)
    return nb


def _executed(path: Path) -> bool:
    import nbformat

    if not path.exists():
        return False
    nb = nbformat.read(path, as_version=4)
    return any(c.get("outputs") for c in nb.cells if c.cell_type == "code")


def prepare(app: Any = None) -> None:
    """Put every tutorial in ``tutorials/``, executed where it can be (see the module)."""
    import nbformat

    OUT.mkdir(exist_ok=True)
    stage: Path | None = None
    try:
        for source in sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")):
            target = OUT / source.name
            if _executed(target) and target.stat().st_mtime >= source.stat().st_mtime:
                continue  # an earlier build's execution holds
            nb = _from_tests(source)
            if nb is None and may_run(source.name):
                if stage is None:
                    stage = Path(tempfile.mkdtemp(prefix="clusterbook-docs-"))
                    shutil.copytree(NOTEBOOKS, stage, dirs_exist_ok=True)
                print(f"running {source.name} for the docs", flush=True)
                nb = _run(source, stage)
            if nb is None:
                nb = nbformat.read(source, as_version=4)
            nbformat.write(nb, target)
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", prepare)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
