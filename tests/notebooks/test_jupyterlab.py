"""The tutorials in JupyterLab in headless Chromium, served as Binder serves them: JupyterLab
and its kernels run as the Binder user of :mod:`tests.notebooks.binder` (uid 1000, a home of
its own, no ``--allow-root``).

One tutorial runs live from the Run menu, down to its checking cell: the SSH one, whose
machines are sshds the notebook user starts. Then every tutorial, as this session's nbclient
run saved it (widget state stored, as "Save Widget State Automatically" does), is opened, and
the widget it showed first is drawn from that state and photographed:
``tutorial-NN-NAME.png`` in ``$CLUSTERBOOK_ARTIFACTS`` (default ``test-artifacts/``). No
process of the user's, nor any naming the server's directory, may be left afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import nbformat
import pytest

from tests.browser.lab import (
    ARTIFACTS,
    WAIT,
    Heard,
    Lab,
    api,
    cell_errors,
    chromium_page,
    drawn,
    open_notebook,
    quiet_home,
    require_browser,
    run_all,
    screenshot,
    serve,
)
from tests.conftest import wait_gone
from tests.notebooks.conftest import NAMES, NOTEBOOKS
from tests.users import LocalUser, wait_left

pytestmark = [pytest.mark.browser, pytest.mark.mpi]

LIVE = "04-ssh-cluster.ipynb"
CHECKED = "All checks passed."


# Every tutorial run with nbclient as the Binder user (unless another test of the worker ran
# it first), then each opened in JupyterLab: ~210 s alone on 2 cores, ~300 s (the suite's
# limit for one test) beside the other workers.
@pytest.mark.timeout(900)
def test_every_tutorials_widget_in_jupyterlab_as_the_binder_user(
    executed: Callable[[str], Any], runner: ModuleType, binder_user: LocalUser, tmp_path: Path
) -> None:
    require_browser()
    runs = {name: executed(name) for name in NAMES}  # nbclient's runs, before the server's
    base = binder_user.root if binder_user.made else tmp_path
    root, home = base / "lab", base / "lab-home"
    shutil.copytree(NOTEBOOKS, root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_*"))
    (root / "executed").mkdir()
    for name, run in runs.items():
        nbformat.write(_as_shown(run, runner), root / "executed" / name)
    if binder_user.made:
        _give(root, binder_user)
    binder_user.new_home(home)
    quiet_home(home)
    if binder_user.made:
        _give(home, binder_user)
    env = binder_user.env(home)
    binder_user.mark()
    # Trusted, as the user's own notebooks are once run: JupyterLab renders no widget (only
    # a text fallback) in an untrusted one.
    trusted = subprocess.run(
        binder_user.argv(
            [
                sys.executable,
                "-m",
                "jupyter",
                "trust",
                *map(str, sorted((root / "executed").iterdir())),
            ],
            root,
        ),
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert trusted.returncode == 0, trusted.stderr

    def as_user(argv: list[str]) -> list[str]:
        return binder_user.argv(argv, root)

    try:
        with (
            serve(root, env, base / "jupyterlab.log", wrap=as_user) as lab,
            chromium_page(tmp_path) as page,
        ):
            from playwright.sync_api import expect

            expect.set_options(timeout=WAIT)
            try:
                _live(lab, page)
                heard = Heard(page)
                for name, run in runs.items():
                    _stored(lab, page, heard, name, run, runner)
            except BaseException:
                screenshot(page, "tutorials-failure.png")
                with contextlib.suppress(OSError):
                    log = (base / "jupyterlab.log").read_text(errors="replace").splitlines()
                    print("the server's log, its last lines:", *log[-80:], sep="\n")
                raise
    finally:
        left = [*wait_left(binder_user, timeout=15), *wait_gone(str(root), timeout=1)]
        for p in left:
            p.kill()
    assert not left, f"processes left after the test: {[p.info for p in left]}"


def _live(lab: Lab, page: Any) -> None:
    """The SSH tutorial, run from the Run menu: its two machines in the widget, and its last
    cell's checks passed."""
    from playwright.sync_api import expect

    open_notebook(lab, page, f"notebooks/{LIVE}")
    run_all(page)
    checked = page.locator(".jp-OutputArea-output", has_text=CHECKED)
    try:
        expect(checked).to_have_count(1, timeout=240_000)
    except AssertionError as e:
        pytest.fail(f"{LIVE} did not pass its checks ({e}); its cells said:\n{cell_errors(page)}")
    nodes = page.locator("table.cb-nodes tbody tr")
    expect(nodes).to_have_count(2)
    for name in ("node1", "node2"):
        expect(nodes.filter(has_text=name)).to_have_count(1)
    widget = page.locator(".jp-Cell", has=page.locator("table.cb-nodes")).first
    widget.scroll_into_view_if_needed()
    widget.screenshot(path=str(_shot(f"tutorial-{Path(LIVE).stem}-live.png")))
    _end_sessions(lab)


def _stored(lab: Lab, page: Any, heard: Heard, name: str, run: Any, runner: ModuleType) -> None:
    """The tutorial's first widget, drawn from its stored state: its node table has the rows
    the state says."""
    index = _first_widget(run, runner)
    (model, *_) = runner.shown_models(run.nb, run.nb.cells[index])
    html = "".join(runner.widget_html(run.states[index], model))
    (table,) = re.findall(r'<table class="cb-nodes".*?</table>', html, re.S)
    rows = table.count("<tr>") - 1  # the head row
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)

    def opened() -> None:
        open_notebook(lab, page, f"executed/{name}", reset=True)
        cell.scroll_into_view_if_needed()

    found = cell.locator("table.cb-nodes tbody tr")
    again = functools.partial(_end_sessions, lab)
    missed = drawn(found, rows, around=cell, opened=opened, again=again, heard=heard)
    if missed:
        print(f"{name}: drawn after {len(missed)} tries that were not:", *missed, sep="\n")
    cell.screenshot(path=str(_shot(f"tutorial-{Path(name).stem}.png")))
    _end_sessions(lab)


def _first_widget(run: Any, runner: ModuleType) -> int:
    return next(i for i, c in enumerate(run.nb.cells) if runner.shown_models(run.nb, c))


def _as_shown(run: Any, runner: ModuleType) -> Any:
    """The executed notebook, without the test's probe cell, its widget state as it was right
    after the cell that showed the first widget (the stored state is the last one: a cluster
    stopped by then)."""
    nb = copy.deepcopy(run.nb)
    nb.cells = nb.cells[:-1]
    index = _first_widget(run, runner)
    state = dict(run.states[index])
    # A model the widget's tree names may come in a message the snapshot after the cell did
    # not see yet (widgets update from threads of their own): taken from the next snapshots.
    for later in sorted(i for i in run.states if i > index):
        for model_id in _named(state) - state.keys():
            if model_id in run.states[later]:
                state[model_id] = run.states[later][model_id]
    missing = _named(state) - state.keys()
    assert not missing, f"{run.name}: the stored widget state lacks the models {sorted(missing)}"
    models = {
        model_id: {
            "model_name": model["_model_name"],
            "model_module": model["_model_module"],
            "model_module_version": model["_model_module_version"],
            "state": model,
        }
        for model_id, model in state.items()
    }
    widgets = {"state": models, "version_major": 2, "version_minor": 0}
    nb.metadata["widgets"] = {runner.WIDGET_STATE: widgets}
    return nb


def _named(state: dict[str, Any]) -> set[str]:
    """The ids of the models that the models of ``state`` refer to (``IPY_MODEL_...``)."""
    return set(re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state)))


def _shot(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"screenshot: {ARTIFACTS / name}")
    return ARTIFACTS / name


def _end_sessions(lab: Lab) -> None:
    """Shut down the kernels the page opened (the next notebook gets its own)."""
    for session in api(lab.url, lab.token, "/api/sessions"):
        with contextlib.suppress(OSError, urllib.error.URLError):
            api(lab.url, lab.token, f"/api/sessions/{session['id']}", method="DELETE")


def _give(path: Path, user: LocalUser) -> None:
    for directory, dirs, files in os.walk(path):
        for name in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
            os.chown(name, user.uid, user.gid)
