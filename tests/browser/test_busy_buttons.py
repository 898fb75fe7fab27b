"""The widget's buttons act while a cell is busy, clicked in a real JupyterLab in headless
Debian Chromium: **Stop job** during a running ``%%mpirun`` cell ends the cell cancelled, and
**Stop cluster** during a cell blocked in ``job.wait()`` ends that wait with the cluster
stopped. The server, its kernel, the cluster and the browser are stopped at teardown, and no
process of theirs may be left, even if the test failed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.lab import (
    WAIT,
    Lab,
    chromium_page,
    lab_on,
    open_notebook,
    run_all,
    screenshot,
)

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


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on a notebook of CELLS, in a home of its own under ``tmp_path``."""
    with lab_on(tmp_path, "busy.ipynb", CELLS) as lab:
        yield lab


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
