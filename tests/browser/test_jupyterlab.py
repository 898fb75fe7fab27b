"""The widgets in a real JupyterLab, driven in headless Debian Chromium by Playwright.

The test starts JupyterLab (its own home, port and token) on a notebook that starts a local
cluster with ``%cluster``, shows its widget, runs a ``%%mpirun`` cell and opens the job's log
viewer; it runs every cell from the browser's Run menu and checks what the page shows: the
nodes ready in the node table, each rank's output in the cell and in the log viewer, and the
viewer's rank filter. Screenshots go to ``$CLUSTERBOOK_ARTIFACTS`` (default:
``test-artifacts/`` at the top of the checkout). The server, its kernels, the cluster and the
browser are stopped at teardown, and no process of theirs may be left, even if the test failed.
"""

from __future__ import annotations

import re
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

CELLS = [
    "%load_ext clusterbook",
    "%cluster local --workers 2 --slots 2",
    "%cluster status",
    "%%mpirun -n 4 --timeout 60 --oversubscribe\n"
    "from mpi4py import MPI\n\n"
    'print(f"hello from rank {MPI.COMM_WORLD.Get_rank()}")',
    "from clusterbook_widgets import LogViewer, current_cluster\n\n"
    "# The job %%mpirun just ran, on the cluster %cluster started.\n"
    "cluster = current_cluster()\n"
    "LogViewer(cluster.jobs[-1])",
]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on a notebook of CELLS, in a home of its own under ``tmp_path``."""
    with lab_on(tmp_path, "cluster.ipynb", CELLS) as lab:
        yield lab


@pytest.fixture
def page(lab: Lab, tmp_path: Path) -> Iterator[Any]:
    """A page of headless Debian Chromium (never a browser that Playwright downloads)."""
    with chromium_page(tmp_path) as page:
        yield page


def test_cluster_widget_mpirun_and_log_viewer_in_jupyterlab(lab: Lab, page: Any) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    try:
        _run_notebook(lab, page)
        _check_page(page)
    except BaseException:
        screenshot(page, "jupyterlab-failure.png")
        raise


def _run_notebook(lab: Lab, page: Any) -> None:
    open_notebook(lab, page, "cluster.ipynb")
    run_all(page)


def _check_page(page: Any) -> None:
    from playwright.sync_api import expect

    # The cluster widget: both nodes in the table, "joined" (what the widget shows for a node
    # that is up and not running ranks), and the progress bar's count.
    nodes = page.locator("table.cb-nodes tbody tr")
    expect(nodes).to_have_count(2, timeout=60_000)
    for name in ("local-0", "local-1"):
        expect(nodes.filter(has_text=name).locator(".cb-state")).to_have_text("joined")
    expect(page.locator(".cb-progress-text").first).to_have_text("2 of 2 nodes ready")
    # The plots of the nodes' use: the cluster's sum and each node, a line each once they
    # reported twice (CPU and memory; no GPU here).
    usage = page.locator("table.cb-usage tbody tr")
    expect(usage).to_have_count(3)
    expect(usage.filter(has_text="local-1").locator("svg.cb-spark path")).to_have_count(2)

    # %%mpirun's cell output: a line from each rank, with its rank in brackets.
    mpirun = next(i for i, source in enumerate(CELLS) if source.startswith("%%mpirun"))
    output = page.locator(".jp-Notebook .jp-Cell").nth(mpirun).locator(".jp-OutputArea")
    for rank in range(4):
        expect(output).to_contain_text(f"[{rank}] hello from rank {rank}")
    expect(output).not_to_contain_text("put:")  # a local cluster's nodes need no copy

    # The log viewer: every rank's line, then only rank 2's once it is picked in the menu.
    log_lines = page.locator(".cb-log .cb-line")
    expect(log_lines).to_have_count(4)
    for rank in range(4):
        expect(log_lines.filter(has_text=f"[rank {rank}@")).to_contain_text(
            f"hello from rank {rank}"
        )
    rank_menu = page.locator(".widget-dropdown", has=page.locator("label", has_text="Rank"))
    select = rank_menu.locator("select")
    expect(select.locator("option:checked")).to_have_text("all")
    # Cells, not the tables: the widget redraws its HTML (a new element) every second.
    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.nth(CELLS.index("%cluster status")).scroll_into_view_if_needed()
    screenshot(page, "jupyterlab-cluster-widget.png")

    select.select_option(label="2")
    expect(log_lines).to_have_count(1)
    expect(log_lines).to_contain_text("[rank 2@")
    for rank in (0, 1, 3):
        expect(page.locator(".cb-log")).not_to_contain_text(f"hello from rank {rank}")
    cells.nth(len(CELLS) - 1).scroll_into_view_if_needed()
    screenshot(page, "jupyterlab-log-viewer-rank-2.png")

    select.select_option(label="all")
    expect(log_lines).to_have_count(4)
    expect(select.locator("option:checked")).to_have_text("all")

    # The theme: the widget's text and lines follow JupyterLab's, light then dark.
    cells.nth(CELLS.index("%cluster status")).scroll_into_view_if_needed()
    light = _colours(page)
    assert _luminance(light["text"]) < 0.3, light  # dark text on a light page
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Settings$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Theme$")).hover()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^JupyterLab Dark$")).click()
    expect(page.locator('body[data-jp-theme-light="false"]')).to_have_count(1)
    expect(page.locator("#jupyterlab-splash")).to_have_count(0)  # the switch is over
    cells.nth(CELLS.index("%cluster status")).scroll_into_view_if_needed()
    dark = _colours(page)
    assert _luminance(dark["text"]) > 0.7, dark  # light text on a dark page
    assert _rgb(dark["line"]) == _rgb(dark["theme_line"]) != _rgb(light["line"])
    screenshot(page, "jupyterlab-cluster-widget-dark.png")


def _colours(page: Any) -> dict[str, str]:
    """The computed colours of the node table: a cell's text, a header's bottom line, and
    the theme's --jp-border-color1 that line is drawn with."""
    colours: dict[str, str] = page.evaluate(
        """() => {
        const cell = document.querySelector("table.cb-nodes tbody td");
        const head = document.querySelector("table.cb-nodes th");
        return {
            text: getComputedStyle(cell).color,
            line: getComputedStyle(head).borderBottomColor,
            theme_line: getComputedStyle(head).getPropertyValue("--jp-border-color1").trim(),
        };
    }"""
    )
    return colours


def _rgb(css: str) -> tuple[int, ...]:
    """``rgb(r, g, b)`` or ``#rrggbb`` as (r, g, b)."""
    if css.startswith("#"):
        return tuple(int(css[i : i + 2], 16) for i in (1, 3, 5))
    return tuple(int(v) for v in re.findall(r"\d+", css)[:3])


def _luminance(css: str) -> float:
    """0 (black) to 1 (white)."""
    r, g, b = (v / 255 for v in _rgb(css))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_a_page_whose_theme_failed_to_load_is_loaded_again(lab: Lab, page: Any) -> None:
    """A loaded server may fail one of the page's own requests (the theme's stylesheet, seen
    in CI): JupyterLab shows a dialog over the page; opening a notebook loads it again."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    failed: list[str] = []

    def fail_once(route: Any) -> None:
        if failed:
            route.continue_()
        else:
            failed.append(route.request.url)
            route.abort()

    page.route("**/theme-light-extension/index.css", fail_once)
    open_notebook(lab, page, "cluster.ipynb")
    assert failed  # the first load's stylesheet did fail
    expect(page.locator(".jp-Dialog")).to_have_count(0)
