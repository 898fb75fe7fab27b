"""Cells run in a real notebook kernel of the test venv (nbclient), for what only a kernel
shows: that a notebook watches, widgets drawn, outputs replaced."""

from __future__ import annotations

from pathlib import Path

import nbformat

from tests.notebooks import runner


def run_cells(cells: list[str], workdir: Path) -> runner.Executed:
    """Run ``cells`` as one notebook in a fresh kernel (none of whose processes may outlive
    it) and return it executed, with its widget state."""
    source = workdir / "src" / "cells.ipynb"
    source.parent.mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, source)
    return runner.execute(source, workdir / "run", probe=False)
