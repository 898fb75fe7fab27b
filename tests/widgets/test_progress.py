"""A notebook's progress bars, in a real kernel: tqdm's widget while the bar runs, and once
it closes an output that holds its last line (a bar that ``leave``s) or nothing, so that a
saved notebook keeps no bar frozen mid-way."""

from __future__ import annotations

import re
from pathlib import Path

from tests.notebooks import runner
from tests.widgets.kernel import run_cells

CELLS = [
    "from clusterbook.views.progress import bar\n"
    'with bar(True, "put", 5000, "B", leave=True) as shown:\n'
    "    shown.add(5000)",
    'with bar(True, "start", 2) as shown:\n    shown.update(1, "one node up")',
    'with bar(True, "put", 10, "B", leave=True) as shown:\n    shown.update(0, "nothing")',
    # A total learnt late (a gather's size) resets the widget's own end.
    'with bar(True, "gather", None, "B", leave=True) as shown:\n    shown.update(0, total=3000)\n'
    "    shown.add(3000)",
]


def test_bars_are_widgets_that_leave_a_line_or_nothing(tmp_path: Path) -> None:
    run = run_cells(CELLS, tmp_path)
    put, started, put_nothing, gathered = (cell.outputs for cell in run.nb.cells)
    drawn = [m for m in runner.widget_state(run.nb).values() if "bar_style" in m]
    assert len(drawn) == 4  # every bar was tqdm's notebook widget while it ran
    assert [o.data for o in put] == [{"text/plain": put[0].data["text/plain"]}]
    assert re.fullmatch(r"put: 100%\|.*\| 4\.88k/4\.88k \[.*\]", put[0].data["text/plain"])
    assert [o.data for o in started] == [{"text/plain": ""}]  # not left: wiped
    assert [o.data for o in put_nothing] == [{"text/plain": ""}]  # nothing moved: no line
    assert re.fullmatch(r"gather: 100%\|.*\| 2\.93k/2\.93k \[.*\]", gathered[0].data["text/plain"])
    assert sorted(m["max"] for m in drawn if m["max"] in (3000, 5000)) == [3000, 5000]
