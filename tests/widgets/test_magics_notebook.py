"""A notebook whose ``%%mpirun`` cell fails stops there, as "Run All", nbclient and papermill
see it (a real kernel, real local cluster, real Open MPI); with ``--no-raise`` it goes on."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

from tests.widgets.kernel import run_cells

pytestmark = pytest.mark.mpi

START = "%load_ext clusterbook\n%cluster local --workers 1 --slots 2"
FAILING = """\
%%mpirun -n 2{options}
from mpi4py import MPI
if MPI.COMM_WORLD.rank == 1:
    raise ValueError("rank 1 refuses")
MPI.COMM_WORLD.Barrier()
"""
AFTER = "print('after the failing cell')"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_a_failing_mpirun_cell_fails_the_run_with_a_compact_error(tmp_path: Path) -> None:
    cells = [START, FAILING.format(options=""), AFTER, "%cluster stop"]
    with pytest.raises(CellExecutionError) as raised:
        run_cells(cells, tmp_path)
    error = raised.value
    assert error.ename == "JobFailedError"
    assert error.evalue.startswith("job-0001 failed: rank 1 exited with code 1 on ")
    # What the notebook shows: the ranks, the error once with its ranks, the cell's line; no
    # frame of clusterbook's or IPython's.
    (output,) = [o for o in _executed(tmp_path).cells[1].outputs if o.output_type == "error"]
    shown = [ANSI.sub("", line) for line in "\n".join(output.traceback).splitlines()]
    assert shown == [
        f"JobFailedError: {error.evalue.splitlines()[0]}",
        "Error on rank 1:",
        "Traceback (most recent call last):",
        '  File "<mpirun cell 1>", line 3, in <module>',
        '    raise ValueError("rank 1 refuses")',
        "ValueError: rank 1 refuses",
    ]
    # Run All stopped there: the next cell never ran (and the kernel's end stopped the cluster:
    # no process outlived it, which run_cells checks).
    assert _executed(tmp_path).cells[2].execution_count is None


def test_no_raise_lets_the_run_go_on_and_prints_the_error(tmp_path: Path) -> None:
    cells = [START, FAILING.format(options=" --no-raise"), AFTER, "%cluster stop"]
    nb = run_cells(cells, tmp_path).nb
    failing, after = nb.cells[1], nb.cells[2]
    assert not [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    told = "".join(o.text for o in failing.outputs if o.get("name") == "stderr")
    assert "Error on rank 1:\nTraceback (most recent call last):\n" in told
    assert told.count("ValueError: rank 1 refuses") == 1
    assert [o.text for o in after.outputs] == ["after the failing cell\n"]


def test_a_bad_argument_fails_the_run_with_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(CellExecutionError) as raised:
        run_cells(["%load_ext clusterbook\n%cluster local --workers 0", AFTER], tmp_path)
    assert raised.value.ename == "UsageError"
    assert "--workers must be >= 1, got 0" in raised.value.evalue
    assert _executed(tmp_path).cells[1].execution_count is None


def _executed(workdir: Path) -> nbformat.NotebookNode:
    """The notebook as the runner left it, run as far as it went."""
    return nbformat.read(workdir / "run" / "executed-cells.ipynb", as_version=4)
