"""The documentation site, built as scripts/docs.sh builds it (warnings as errors), opened in
headless Chromium: the first tutorial's page draws the cluster widget from its saved state,
with the HTML manager the site serves itself (nothing from a CDN: this machine reaches none)."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.lab import (
    REPO,
    WAIT,
    Heard,
    chromium_page,
    drawn,
    require_browser,
    screenshot,
)
from tests.conftest import require

pytestmark = [pytest.mark.browser, pytest.mark.mpi]

TUTORIAL = "01-local-cluster.ipynb"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built into a directory of the test's (the first tutorial run for it where
    the notebook tests have not run it; the others as they are)."""
    require(
        subprocess.run(["npm", "--version"], capture_output=True).returncode == 0,
        "needs npm (Node.js) for the widgets' HTML manager",
    )
    out = tmp_path_factory.mktemp("site") / "html"
    env = {**os.environ, "CLUSTERBOOK_DOCS_RUN": TUTORIAL}
    done = subprocess.run(
        ["bash", "scripts/docs.sh", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, (
        f"the site did not build:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    )
    return out


class _Server(http.server.ThreadingHTTPServer):
    # A page asks for its ten files at once; the default backlog of 5 can drop some of them
    # while a loaded machine is slow to accept (a CI run's page got its styles and none of
    # its scripts).
    request_queue_size = 64


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_the_tutorial_page_draws_the_cluster_widget_from_its_saved_state(
    served: str, tmp_path: Path
) -> None:
    require_browser()
    from playwright.sync_api import expect

    with chromium_page(tmp_path) as page:
        expect.set_options(timeout=WAIT)
        missing: list[str] = []
        page.on("requestfailed", lambda request: missing.append(request.url))
        heard = Heard(page, responses=True)
        nodes = page.locator(".jupyter-widgets table.cb-nodes").first

        def opened() -> None:
            # The requests of the page as finally shown: a try opened anew aborts those of
            # the one before (net::ERR_ABORTED), which are no missing files.
            missing.clear()
            page.goto(f"{served}/tutorials/{Path(TUTORIAL).stem}.html")

        # Drawn by the HTML manager (a widget's view), not a static fallback: two node rows.
        missed = drawn(
            nodes.locator("tbody tr"),
            2,
            around=page.locator("article"),
            opened=opened,
            again=lambda: None,
            heard=heard,
            tries=2,
        )
        if missed:
            print(f"drawn after {len(missed)} tries that were not:", *missed, sep="\n")
        expect(nodes).to_contain_text("local-0")
        nodes.scroll_into_view_if_needed()
        screenshot(page, "docs-site-tutorial-01.png")
        # The checks are left out of the page; what the tutorial teaches is there.
        expect(page.locator("h2", has_text="Check")).to_have_count(0)
        assert not [url for url in missing if url.startswith(served)], missing
