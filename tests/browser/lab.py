"""JupyterLab and headless Debian Chromium for the browser tests: a server in a home of its own
(its own port and token, no news toast), a page of Chromium driven by Playwright (never a
browser Playwright downloads), the Run All menu, and screenshots in ``$CLUSTERBOOK_ARTIFACTS``
(default: ``test-artifacts/`` at the top of the checkout)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require, served_url, wait_gone

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("CLUSTERBOOK_ARTIFACTS") or REPO / "test-artifacts")
WAIT = 30_000  # ms; Playwright's default 5 s is too short for a kernel on 2 cores
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@dataclass
class Lab:
    url: str
    token: str
    root: Path


def require_browser() -> None:
    """Skip (or fail under CLUSTERBOOK_REQUIRE_TESTBED=1) without JupyterLab or Chromium."""
    missing = [m for m in ("jupyterlab", "playwright", "ipykernel") if find_spec(m) is None]
    require(not missing, f"{', '.join(missing)} not installed (pip install -e '.[jupyter,dev]')")
    require(os.access(CHROMIUM, os.X_OK), f"no {CHROMIUM} (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(lab_url: str, token: str, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(  # noqa: S310 (http, to the server the test started)
        f"{lab_url}{path}", method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        body = response.read()
    return json.loads(body) if body else None


def quiet_home(home: Path) -> None:
    """No "get notified about Jupyter news?" toast over the page (and no fetching of news)."""
    labconfig = home / ".jupyter" / "labconfig"
    labconfig.mkdir(parents=True)
    quiet = {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
    (labconfig / "page_config.json").write_text(json.dumps(quiet))


@contextlib.contextmanager
def serve(
    root: Path,
    env: Mapping[str, str],
    log_path: Path,
    *,
    wrap: Callable[[list[str]], list[str]] = list,
    allow_root: bool = False,
) -> Iterator[Lab]:
    """JupyterLab on ``root`` (its argv passed through ``wrap``: to run it as another user),
    shut down with its kernels at the end, killed if it does not go."""
    port, token = free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        *(["--allow-root"] if allow_root else []),
        f"--ServerApp.root_dir={root}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    log = log_path.open("wb")
    server = subprocess.Popen(
        wrap(argv),
        env=dict(env),
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}: {tail(log_path)}")
            said = served_url(log_path)  # not the port asked for: see served_url
            try:
                if said is not None:
                    api(said, token, "/api/status")
                    url = said
                    break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer within 60 s: {tail(log_path)}")
            time.sleep(0.2)
        yield Lab(url, token, root)
    finally:
        # The server shuts its kernels down (each kernel stops its cluster on the way out).
        with contextlib.suppress(OSError, urllib.error.URLError):
            api(url, token, "/api/shutdown", method="POST")
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def chromium_page(directory: Path) -> Iterator[Any]:
    """A page of headless Debian Chromium, its profile under ``directory``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            tempfile.mkdtemp(prefix="chromium-", dir=directory),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1100},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


class Heard:
    """What a page said and what it could not fetch (console messages, uncaught errors, failed
    requests and error responses), for a failure's message."""

    def __init__(self, page: Any, *, responses: bool = False) -> None:
        self.lines: list[str] = []
        say = self.lines.append
        page.on("console", lambda m: say(f"console {m.type}: {m.text[:300]}"))
        page.on("pageerror", lambda e: say(f"uncaught: {e}"))
        page.on("requestfailed", lambda r: say(f"request failed: {r.url} ({r.failure})"))
        page.on(
            "response",
            lambda r: say(f"{r.status} {r.url}") if responses or r.status >= 400 else None,
        )

    def forget(self) -> None:
        self.lines.clear()

    def told(self) -> str:
        """What was heard since the last call, and forget it."""
        lines = list(self.lines)
        self.forget()
        return "\n".join(lines[-60:]) or "(nothing)"


def drawn(
    found: Any,
    count: int,
    *,
    around: Any,
    opened: Callable[[], None],
    again: Callable[[], None],
    heard: Heard,
    tries: int = 3,
) -> list[str]:
    """Call ``opened()`` (which opens the page) and wait until the locator ``found`` finds
    ``count`` elements; when a try does not (or cannot open), call ``again()`` and try anew. A
    widget drawn from saved state can lose a race in JupyterLab's widget manager (its restore
    from the kernel reports "restored" before the notebook's models are registered, and what
    rendered before then shows "model not found"), and a loaded machine can leave a page's
    scripts unrun past the wait. Fails with what each try showed (the text of the locator
    ``around``) and heard; returns those of the tries that did not draw (for the test's
    output)."""
    from playwright.sync_api import Error, expect

    missed: list[str] = []
    for n in range(1, tries + 1):
        heard.forget()
        try:
            opened()
            expect(found).to_have_count(count)
            return missed
        except (AssertionError, Error) as e:
            shown = around.inner_text()[-1500:] if around.count() else "(not there)"
            missed.append(f"try {n}: {e}\nthe page showed (end):\n{shown}\nheard:\n{heard.told()}")
            if n < tries:
                again()
    pytest.fail("\n\n".join(missed))


def cell_errors(page: Any) -> str:
    """What the open notebook's cells wrote to stderr or raised, by cell (its prompt and the
    end of its text): for a failure's message."""
    said = []
    cells = page.locator(".jp-Notebook .jp-Cell")
    for i in range(cells.count()):
        cell = cells.nth(i)
        errors = cell.locator(".jp-OutputArea-output[data-mime-type$='stderr']")
        if errors.count():
            prompt = cell.locator(".jp-InputPrompt").first.inner_text().strip()
            text = "\n".join(errors.all_inner_texts())
            said.append(f"cell {i} {prompt}\n{text[-2000:]}")
    return "\n\n".join(said) or "(no cell wrote to stderr)"


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


def open_notebook(lab: Lab, page: Any, path: str, *, reset: bool = False) -> None:
    """Open the notebook at ``path`` (under the server's root) and wait for its kernel;
    ``reset``: alone (the notebooks opened before are not opened again)."""
    from playwright.sync_api import expect

    if reset:
        # The reset on its own first: in one URL with the document, JupyterLab's reset of the
        # workspace can come after the route has opened the document, and close it again (a
        # loaded machine showed the file browser alone).
        page.goto(f"{lab.url}/lab?reset&token={lab.token}")
        page.wait_for_url(lambda url: "reset" not in url)
        page.locator("#jp-main-dock-panel").wait_for()
    page.goto(f"{lab.url}/lab/tree/{path}?token={lab.token}")
    # "idle" shows before the kernel exists; Run All before it is there asks for a kernel.
    kernel = page.locator(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName")
    # A loaded machine's server may fail a request of the page's own (seen: the theme's
    # stylesheet, "Error Loading ...", and the notebook itself, "File Load Error for ...
    # Failed to fetch", with the toolbar saying "No Kernel"), and JupyterLab then holds the
    # page behind a dialog saying so: load it again (twice at most).
    failed = page.locator(".jp-Dialog", has_text=re.compile(r"^(Error Loading|File Load Error)"))
    started = kernel.filter(has_text="ipykernel")
    for _ in range(2):
        expect(started.or_(failed).first).to_be_visible()
        if not failed.count():
            break
        page.reload()
    expect(kernel).to_contain_text("ipykernel")
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]")).to_be_visible()


def run_all(page: Any) -> None:
    """Run > Run All Cells, from the menu bar."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def write_notebook(path: Path, cells: list[str]) -> None:
    """A notebook of code ``cells`` (their source), not run, for the Python 3 kernel."""
    made = [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": source, "outputs": []}
        | {"execution_count": None}
        for i, source in enumerate(cells)
    ]
    kernelspec = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb = {
        "cells": made,
        "metadata": {"kernelspec": kernelspec, "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1))


@contextlib.contextmanager
def lab_on(tmp_path: Path, notebook: str, cells: list[str]) -> Iterator[Lab]:
    """JupyterLab on a notebook ``notebook`` of ``cells``, in a home of its own under
    ``tmp_path``; no process of it left after (checked)."""
    require_browser()
    home, root = tmp_path / "home", tmp_path / "lab"
    home.mkdir()
    root.mkdir()
    write_notebook(root / notebook, cells)
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
