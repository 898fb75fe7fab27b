"""The Clusters sidebar of clusterbook's JupyterLab extension, in a real JupyterLab driven in
headless Debian Chromium: a detached cluster started from another process (as from a
terminal) shows within 2 s; Attach inserts the code into the open notebook and running it shows
the live widget; Logs follows the running job's lines, by rank; the Resources pane draws its
plots in the light and the dark theme (screenshots); Stop asks, stops, and the row says so; and
the sidebar asks nothing of the server while it is hidden. The server, its kernels, the cluster
and the browser are stopped at teardown, and no process of theirs may be left."""

from __future__ import annotations

import json
import re
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
    screenshot,
    serve,
)
from tests.conftest import wait_gone
from tests.notebooks.runner import kernel_env
from tests.widgets.labserver import start_detached, stop_all

pytestmark = [pytest.mark.browser, pytest.mark.mpi]

# Each rank prints a line every 0.2 s for two minutes (the test stops the cluster first).
TICKS = (
    "import time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
    "for i in range(600):\n    print(f'tick {i} of rank {r}', flush=True)\n    time.sleep(0.2)"
)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Lab, dict[str, str]]]:
    """JupyterLab on a notebook without clusterbook, in a home of its own; its environment
    (the home's clusters are stopped at the end)."""
    require_browser()
    home, root = tmp_path / "home", tmp_path / "lab"
    home.mkdir()
    root.mkdir()
    quiet_home(home)
    config = home / ".config" / "clusterbook"  # a profile, for the New button
    config.mkdir(parents=True, mode=0o700)
    (config / "profiles.toml").write_text('[profiles.tiny]\nkind = "local"\nworkers = 1\n')
    (config / "profiles.toml").chmod(0o600)
    cell = {"cell_type": "code", "id": "c0", "metadata": {}, "source": "x = 1",
            "outputs": [], "execution_count": None}  # fmt: skip
    kernelspec = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb = {"cells": [cell], "metadata": {"kernelspec": kernelspec}, "nbformat": 4,
          "nbformat_minor": 5}  # fmt: skip
    (root / "work.ipynb").write_text(json.dumps(nb))
    env = kernel_env(home)
    try:
        with serve(root, env, tmp_path / "jupyterlab.log", allow_root=True) as running:
            yield running, env
    finally:
        stop_all(env)
        left = wait_gone(str(tmp_path), timeout=10)
        for p in left:
            p.kill()
    assert not left, f"processes left after the test: {[p.info['cmdline'] for p in left]}"


def test_the_sidebar_shows_attaches_follows_plots_and_stops(
    lab: tuple[Lab, dict[str, str]], tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT)
    server, env = lab
    with chromium_page(tmp_path) as page:
        try:
            _check(page, server, env)
        except BaseException:
            screenshot(page, "jupyterlab-clusters-failure.png")
            raise


def _check(page: Any, server: Lab, env: dict[str, str]) -> None:
    from playwright.sync_api import expect

    asked: list[str] = []  # the sidebar's listings (JupyterLab adds ?TIME to each)
    listing = re.compile(r"/clusterbook/api/clusters(\?\d*)?$")
    page.on("request", lambda r: asked.append(r.url) if listing.search(r.url) else None)
    open_notebook(server, page, "work.ipynb", reset=True)
    tab = page.locator('.jp-SideBar [data-id="clusterbook-sidebar"]')
    tab.click()
    sidebar = page.locator("#clusterbook-sidebar")
    expect(sidebar.locator(".cb-Group-title").first).to_have_text("Running (0)")

    # A cluster started from a terminal shows within 2 s.
    cluster_id = start_detached(env, "side", ["python", "-c", TICKS])
    row = sidebar.locator(f'.cb-Cluster[data-cluster-id="{cluster_id}"]')
    expect(row).to_be_visible(timeout=2_000)
    expect(row.locator(".cb-Badge")).to_have_text("running")
    expect(row.locator(".cb-Fact-nodes")).to_have_text("1/1 nodes ready")
    expect(row.locator(".cb-Fact-jobs")).to_have_text("1 job(s) running")
    expect(row.locator(".cb-Fact-left")).to_contain_text("left")
    screenshot(page, "jupyterlab-clusters-sidebar.png")

    # Attach: a cell with the import and the attach, run, shows the live widget.
    row.locator(".cb-Action-attach").click()
    cells = page.locator(".jp-Notebook .jp-Cell")
    expect(cells).to_have_count(2)
    inserted = cells.nth(1)
    expect(inserted).to_contain_text("import clusterbook as cb")
    expect(inserted).to_contain_text(f'cluster = cb.Cluster.attach("{cluster_id}")')
    inserted.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    expect(inserted.locator("table.cb-nodes tbody tr")).to_have_count(1, timeout=60_000)
    expect(inserted.locator(".jp-OutputArea")).to_contain_text("local-0")

    # Logs, from the keyboard (the focus stays while the row's time left moves): the
    # running job's lines, more as they come, then rank 1's only.
    row.locator(".cb-Action-logs").focus()
    row.evaluate("r => { r.dataset.marked = 'yes'; }")  # the same element two polls later:
    page.wait_for_timeout(2_500)  # a click under way on it is not lost
    assert row.evaluate("r => r.dataset.marked") == "yes"
    focused = page.evaluate("() => document.activeElement.dataset.actionKey")
    assert focused == f"Logs:{cluster_id}"
    page.keyboard.press("Enter")
    logs = page.locator(".cb-Logs")
    lines = logs.locator(".cb-Logs-output .cb-Line")
    expect(lines.filter(has_text="tick 0 of rank 1")).to_have_count(1)
    seen = lines.count()
    expect(lines.filter(has_text=re.compile(r"tick \d+ of rank 0")).last).to_contain_text("rank 0")
    expect(logs.locator(".cb-Logs-state")).to_contain_text("(live)")
    page.wait_for_function(  # followed: lines that were not there when it opened
        "n => document.querySelectorAll('.cb-Logs-output .cb-Line').length > n + 10", arg=seen
    )
    logs.locator("select.cb-Logs-rank").select_option("1")
    expect(lines.first).to_have_attribute("data-rank", "1")
    assert set(lines.evaluate_all("ls => ls.map(l => l.dataset.rank)")) == {"1"}
    screenshot(page, "jupyterlab-clusters-logs.png")

    # Resources: the cluster's sum and the node's CPU, memory and GPU plots, light and dark.
    row.locator(".cb-Action-resources").click()
    pane = page.locator(".cb-Resources")
    plots = pane.locator("svg.cb-Plot")
    expect(plots).to_have_count(6)  # the cluster's row and one node's, three plots each
    page.wait_for_function(  # a line of two points or more: the history moves
        """() => {
        const cpu = document.querySelector('.cb-Resources [data-node="local-0"] polyline');
        return cpu !== null && cpu.getAttribute("points").split(" ").length >= 2;
    }"""
    )
    expect(pane.locator('[data-node="local-0"] svg.cb-Plot').first).to_have_attribute(
        "aria-label", re.compile(r"local-0 CPU: \d+\.\d %")
    )
    light = _fill(page)
    screenshot(page, "jupyterlab-resources-light.png")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Settings$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Theme$")).hover()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^JupyterLab Dark$")).click()
    expect(page.locator('body[data-jp-theme-light="false"]')).to_have_count(1)
    expect(page.locator("#jupyterlab-splash")).to_have_count(0)
    dark = _fill(page)
    assert dark["frame"] == dark["theme"] != light["frame"], (light, dark)
    screenshot(page, "jupyterlab-resources-dark.png")

    # New: a detached cluster of the profile, in the running group.
    new = sidebar.locator(".cb-New")
    expect(new.locator("select")).to_have_value("tiny")
    new.locator("button").click()
    running = sidebar.locator(".cb-Group").first.locator(".cb-Cluster")
    expect(running).to_have_count(2, timeout=60_000)
    expect(sidebar.locator(".cb-Sidebar-status")).to_contain_text("Started ")

    # Stop: asked first, then the row moves to the stopped ones and says so.
    row.locator(".cb-Action-stop").click()
    page.locator(".jp-Dialog .jp-mod-warn").click()
    stopped = sidebar.locator(f'.cb-Cluster[data-cluster-id="{cluster_id}"][data-state="stopped"]')
    expect(stopped.locator(".cb-Badge")).to_have_text("stopped")
    expect(sidebar.locator(".cb-Group").nth(1)).to_contain_text(cluster_id)

    # Hidden, the sidebar asks nothing; shown again, it asks once a second at most. (The
    # page's requests reach `asked` while Playwright waits, never during a time.sleep.)
    tab.click()
    expect(sidebar).to_be_hidden()
    page.wait_for_timeout(500)  # a request under way when it hid
    before = len(asked)
    page.wait_for_timeout(3_000)
    assert len(asked) == before, "the hidden sidebar asked for the clusters"
    tab.click()
    expect(sidebar).to_be_visible()
    page.wait_for_timeout(3_000)
    assert 1 <= len(asked) - before <= 4, asked


def _fill(page: Any) -> dict[str, str]:
    """The fill of a plot's frame and the theme's --jp-layout-color2 it is drawn with."""
    found: dict[str, str] = page.evaluate(
        """() => {
        const frame = document.querySelector(".cb-Resources svg.cb-Plot rect");
        const theme = getComputedStyle(document.body).getPropertyValue("--jp-layout-color2");
        const probe = document.createElement("div");
        probe.style.color = theme.trim();
        document.body.appendChild(probe);
        const resolved = getComputedStyle(probe).color;
        probe.remove();
        return {frame: getComputedStyle(frame).fill, theme: resolved};
    }"""
    )
    return found
