"""The README's examples run as written: its first example as a script, its notebook cells in
an IPython shell; the README stays short (~150 lines) and links to what exists."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.S | re.M)

#: Runs cells the way a notebook does, stopping at the first that fails.
SHELL = """\
import json, sys
from IPython.testing.globalipapp import start_ipython
shell = start_ipython()
for cell in json.load(sys.stdin):
    if not shell.run_cell(cell, store_history=True).success:
        sys.exit(f"this cell failed: {cell!r}")
shell.run_line_magic("cluster", "stop")
"""


def blocks(language: str) -> list[str]:
    """The README's code blocks in ``language``, in order (a block whose fence says
    ``not-run`` after the language is an outline of calls that need hosts: left out)."""
    text = README.read_text(encoding="utf-8")
    return [
        code
        for lang, info, code in FENCE.findall(text)
        if lang == language and "not-run" not in info
    ]


def test_the_readme_fits_a_screen_or_two_and_its_links_exist() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 160
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target and not target.startswith("#"):
            assert (ROOT / target).exists(), f"the README links to {target}, which is not there"


@pytest.mark.mpi
def test_the_first_example_runs_as_written(tmp_path: Path) -> None:
    first = next(code for code in blocks("python") if "import clusterbook" in code)
    run = subprocess.run(
        [sys.executable, "-c", first],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    assert "['hi from rank 0 of 2', 'hi from rank 1 of 2']" in run.stdout
    assert "[0, 1, 4, 9, 16, 25, 36, 49, 64, 81]" in run.stdout
    assert run.stdout.count("an MPI program") == 2, run.stdout


@pytest.mark.mpi
def test_the_notebook_cells_run_in_ipython(tmp_path: Path) -> None:
    cells = [code for code in blocks("python") if code.lstrip().startswith("%")]
    assert any(c.lstrip().startswith("%%mpirun") for c in cells), "no %%mpirun example"
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SHELL)],
        input=json.dumps(cells),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[0] 1" in run.stdout  # the allreduce, printed by each rank
    assert "[1] 1" in run.stdout
