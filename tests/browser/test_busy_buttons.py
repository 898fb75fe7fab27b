"""The widget's buttons act while a cell is busy, clicked in a real JupyterLab in headless
Debian Chromium: **Stop job** during a running ``%%mpirun`` cell ends the cell cancelled, and
**Stop cluster** during a cell blocked in ``job.wait()`` ends that wait with the cluster
stopped. The server, its kernel, the cluster and the browser are stopped at teardown, and no
process of theirs may be left, even if the test failed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.lab import (
    WAIT,
    Lab,
    chromium_page,
    open_notebook,
    quiet_home,
    require_browser,
    run_all,
    screenshot,
    serve,
)
from tests.conftest import wait_gone

pytestmark = [pytest.mark.browser, pytest.mark.mpi]

# Longer than the test takes to click: a cell that ends on its own fails the test.
SLEEP = 120

CELLS = [
    "%load_ext clusterbook",
    "%cluster local --workers 1 --slots 2",
    "%cluster status",
    f"%%mpirun -n 1\nimport time\n\nprint('rank started', flush=True)\ntime.sleep({SLEEP})",
    "from clusterbook_widgets import current_cluster\n\n"
    "cluster = current_cluster()\n"
    "print('first job cancelled:', cluster.jobs[-1].outcome.cancelled)\n"
    f"job = cluster.mpirun(['python', '-c', 'import time; time.sleep({SLEEP})'], np=1)\n"
    "print('waiting for', job.id, flush=True)\n"
    "result = job.wait()\n"
    "print('second job cancelled:', result.cancelled, '/ cluster', cluster.snapshot().state)",
]
WIDGET, MPIRUN, WAITING = 2, 3, 4  # the cells


def _write_notebook(path: Path) -> None:
    cells = [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": source, "outputs": []}
        | {"execution_count": None}
        for i, source in enumerate(CELLS)
    ]
    kernelspec = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb = {
        "cells": cells,
        "metadata": {"kernelspec": kernelspec, "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1))


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on a notebook of CELLS, in a home of its own under ``tmp_path``."""
    require_browser()
    home, root = tmp_path / "home", tmp_path / "lab"
    home.mkdir()
    root.mkdir()
    _write_notebook(root / "busy.ipynb")
    quiet_home(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "XDG_"))}
    env.pop("CLUSTERBOOK_RUN_ROOT", None)
    env |= {"HOME": str(home), "PYTHONNOUSERSITE": "1"}
    try:
        with serve(root, env, tmp_path / "jupyterlab.log", allow_root=True) as lab:
            yield lab
    finally:
        left = wait_gone(str(tmp_path), timeout=10)
        for p in left:
            p.kill()
    assert not left, f"processes left after the test: {[p.info['cmdline'] for p in left]}"


@pytest.fixture
def page(lab: Lab, tmp_path: Path) -> Iterator[Any]:
    with chromium_page(tmp_path) as page:
        yield page


def test_stop_job_and_stop_cluster_act_while_a_cell_is_busy(lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    try:
        open_notebook(lab, page, "busy.ipynb")
        run_all(page)
        cells = page.locator(".jp-Notebook .jp-Cell")
        widget = cells.nth(WIDGET)
        mpirun = cells.nth(MPIRUN).locator(".jp-OutputArea")

        # The %%mpirun cell runs (its rank said so); Stop job in the widget above ends it.
        expect(mpirun).to_contain_text("[0] rank started", timeout=90_000)
        stop_job = widget.locator("button", has_text="Stop job")
        expect(stop_job).to_be_enabled()
        stop_job.click()
        expect(mpirun).to_contain_text("JobFailedError")
        expect(mpirun).to_contain_text("cancelled")
        widget.scroll_into_view_if_needed()
        screenshot(page, "jupyterlab-busy-stop-job.png")

        # Run All stopped at the failed cell: run the next one, which waits for a new job.
        waiting = cells.nth(WAITING)
        waiting.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        output = waiting.locator(".jp-OutputArea")
        expect(output).to_contain_text("first job cancelled: True")
        expect(output).to_contain_text("waiting for job-0002")
        stop_cluster = widget.locator("button", has_text="Stop cluster")
        expect(stop_cluster).to_be_enabled()
        stop_cluster.click()
        expect(output).to_contain_text("second job cancelled: True / cluster stopped")
        expect(stop_cluster).to_be_disabled()
        widget.scroll_into_view_if_needed()
        screenshot(page, "jupyterlab-busy-stop-cluster.png")
    except BaseException:
        screenshot(page, "jupyterlab-busy-failure.png")
        raise
