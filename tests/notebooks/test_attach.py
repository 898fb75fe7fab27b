"""Two notebooks, two kernels: notebook A starts a detached cluster and a job, and its kernel
shuts down; notebook B attaches with ``%cluster attach`` and shows the cluster's widget and
the job's output live, then stops the cluster. Nothing of it is left afterwards."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import wait_gone

pytestmark = pytest.mark.mpi

RANKS = (
    "import time\\n"
    "from mpi4py import MPI\\n"
    "rank = MPI.COMM_WORLD.Get_rank()\\n"
    "for i in range(40):\\n"
    "    print(f'line {i} of rank {rank}', flush=True)\\n"
    "    time.sleep(0.25)\\n"  # 10 s: kernel B attaches while it runs
)

NOTEBOOK_A = [
    "import clusterbook as cb\n"
    "cluster = cb.Cluster.local(1, 2, name='shared', detached=True).start()\n"
    f"job = cluster.mpirun(['python', '-c', \"{RANKS}\"], np=2)\n"
    "print(cluster.id)",
]


def notebook_b(cluster_id: str) -> list[str]:
    return [
        "%load_ext clusterbook",
        f"%cluster attach {cluster_id}",
        "import time\ntime.sleep(0.3)",
        f"import clusterbook as cb\ncb.Cluster.attach({cluster_id!r}).job().wait(60)\n"
        "time.sleep(0.5)",
        "%cluster stop",
    ]


def run(cells: list[str], home: Path, folder: Path, runner: ModuleType) -> tuple[Any, list[Any]]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(folder)}},
        store_widget_state=True,
    )
    states: list[Any] = []
    client.on_cell_executed = lambda **_: states.append(copy.deepcopy(client.widget_state))
    client.execute(env=runner.kernel_env(home))
    return nb, states


def test_a_second_kernel_attaches_and_shows_the_jobs_live_output(
    runner: ModuleType, openmpi_python: str, tmp_path: Path
) -> None:
    home, folder = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    folder.mkdir()
    cluster_id = ""
    try:
        a, _ = run(NOTEBOOK_A, home, folder, runner)
        cluster_id = runner.stream(a.cells[0]).strip()
        assert cluster_id.startswith("shared-")
        # Kernel A has shut down; its cluster and job go on.
        b, states = run(notebook_b(cluster_id), home, folder, runner)
    finally:
        if cluster_id:  # a detached cluster outlives a failed test: stop it (a no-op if done)
            subprocess.run(
                [sys.executable, "-m", "clusterbook", "stop", cluster_id],
                env=runner.kernel_env(home),
                capture_output=True,
                timeout=60,
            )
        left = wait_gone(str(home), timeout=15)
        for p in left:
            p.kill()
    assert not left, f"processes outlived the cluster: {[p.info for p in left]}"

    attach = b.cells[1]
    assert re.match(
        rf"Attached to <Cluster 'shared' local running \(attached, {cluster_id}\): 1 nodes, "
        r"2 slots>",
        runner.stream(attach),
    )
    widget, viewer = runner.shown_models(b, attach)
    header = [h for h in runner.widget_html(states[1], widget) if "cb-header" in h]
    assert header
    assert "stops in 11h59m (life_span)" in header[0]  # a detached cluster's day-long life
    assert "job-0001" in "".join(runner.widget_html(states[1], widget))

    def lines(state: dict[str, Any]) -> list[str]:
        html = "".join(h for h in runner.widget_html(state, viewer) if 'class="cb-log"' in h)
        return re.findall(r"line \d+ of rank \d", html)

    early, late = lines(states[1]), lines(states[3])
    assert len(early) < 80  # shown while the job still ran...
    assert sorted(late) == sorted(f"line {i} of rank {r}" for i in range(40) for r in (0, 1))
    assert "Stopped cluster 'shared'." in runner.stream(b.cells[4])
