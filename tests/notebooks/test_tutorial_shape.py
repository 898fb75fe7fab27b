"""Every tutorial teaches one thing first and keeps its checks out of sight: its first markdown
cell says in one line what it teaches, naming the call it teaches, and that call comes in its
first code cells; every cell that asserts carries the tag the docs site leaves out
(myst-nb's ``remove-cell``). These read the stored notebooks; nothing is run.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import pytest

from tests.notebooks.conftest import NAMES, NOTEBOOKS

#: The line after a tutorial's title that says what it teaches.
TEACHES = "**You learn:** "

#: How many code cells a tutorial may take to reach what it teaches.
FIRST_CODE_CELLS = 4

#: Tutorials that take longer, and why: the one place such a delay is allowed.
LATER = {
    # There are no machines to reach here: two stand-in machines (their sshds, their keys,
    # a config naming them) come first, and each is part of what an SSH cluster is told.
    "04-ssh-cluster.ipynb": 6,
}


def _cells(name: str) -> list[dict[str, Any]]:
    nb = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    cells: list[dict[str, Any]] = nb["cells"]
    return cells


def _source(cell: dict[str, Any]) -> str:
    return "".join(cell["source"])


def _python(source: str) -> ast.Module | None:
    """A code cell's Python, its line magics and shell escapes left out; None for a cell
    magic's cell (``%%writefile``, ``%%mpirun``: its body is a program or a file, not the
    tutorial's own checks)."""
    if source.lstrip().startswith("%%"):
        return None
    kept = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(kept))


@pytest.mark.parametrize("name", NAMES)
def test_each_tutorial_says_first_the_one_thing_it_teaches(name: str) -> None:
    cells = _cells(name)
    first = cells[0]
    assert first["cell_type"] == "markdown", f"{name} does not open with prose"
    lines = _source(first).splitlines()
    assert lines[0].startswith("# "), f"{name}'s first cell does not start with its title"
    assert lines[1] == "", f"{name}'s title is not followed by a blank line"
    assert lines[2].startswith(TEACHES), (
        f"{name}'s title is not followed by one line starting {TEACHES!r} that says what the "
        "tutorial teaches"
    )
    assert len(lines) == 3 or lines[3] == "", f"{name}'s line of what it teaches is not one line"
    named = re.findall(r"`([^`]+)`", lines[2])
    assert named, f"{name}'s line of what it teaches names no call in backticks: {lines[2]!r}"
    within = LATER.get(name, FIRST_CODE_CELLS)
    code = [_source(c) for c in cells if c["cell_type"] == "code"][:within]
    assert any(call in source for call in named for source in code), (
        f"{name} names {named} as what it teaches, but none of them is in its first "
        f"{within} code cells"
    )


@pytest.mark.parametrize("name", NAMES)
def test_every_cell_that_asserts_is_tagged_out_of_the_docs(name: str) -> None:
    for i, cell in enumerate(_cells(name)):
        if cell["cell_type"] != "code" or "remove-cell" in cell["metadata"].get("tags", ()):
            continue
        tree = _python(_source(cell))
        asserts = [] if tree is None else [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
        assert not asserts, (
            f"cell {i} of {name} asserts (line {asserts[0].lineno if asserts else 0}) but has no "
            "remove-cell tag: move the check into the tutorial's tagged Check cell"
        )
