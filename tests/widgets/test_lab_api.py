"""The clusters API of the JupyterLab extension in a real ``jupyter server``, over a detached
cluster started from another process (as from a terminal) with a real job: every route with
and without Jupyter's token, a POST without the XSRF cookie's value refused, the errors, and no
secret of a cluster (its token, keys) in any answer."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.notebooks.runner import harvest, kernel_env
from tests.widgets.labserver import Server, jupyter_server, start_detached, stop_all

pytestmark = [pytest.mark.mpi]

RANKS = "for i in range(5):\n    print('line', i, flush=True)"
PROFILES = '[profiles.tiny]\nkind = "local"\nworkers = 1\nslots = 1\n'


@pytest.fixture
def home(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A home with a profile, its environment; its clusters are stopped at the end."""
    home = tmp_path / "home"
    config = home / ".config" / "clusterbook"
    config.mkdir(parents=True, mode=0o700)
    (config / "profiles.toml").write_text(PROFILES)
    (config / "profiles.toml").chmod(0o600)
    env = kernel_env(home)
    try:
        yield env, home
    finally:
        stop_all(env)


@pytest.fixture
def server(home: tuple[dict[str, str], Path], tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "root"
    root.mkdir()
    with jupyter_server(home[0], root, tmp_path / "server.log") as running:
        yield running


def _json(answer: tuple[int, str], status: int = 200) -> Any:
    assert answer[0] == status, answer
    return json.loads(answer[1])


def test_every_route_answers_with_the_token_only_and_leaks_no_secret(
    home: tuple[dict[str, str], Path], server: Server
) -> None:
    env, home_dir = home
    cluster_id = start_detached(env, "api", ["python", "-c", RANKS])
    secrets: dict[str, set[str]] = {}  # read while the clusters run: they go with them
    harvest(home_dir, secrets)
    answers: list[str] = []

    def call(path: str, method: str = "GET", body: Any = None, status: int = 200) -> Any:
        answer = server.call(path, method, body)
        answers.append(answer[1])
        return _json(answer, status)

    listed = {c["id"]: c for c in call("clusters")}
    mine = listed[cluster_id]
    assert (mine["kind"], mine["state"], mine["running"]) == ("local", "running", True)
    assert (mine["nodes_ready"], mine["nodes"], mine["slots"]) == (1, 1, 2)
    assert mine["time_left_text"].endswith("(life_span)")
    assert mine["directory"].endswith(cluster_id)

    history = call(f"clusters/{cluster_id}/resources?window=60")
    assert history["interval"] > 0
    (node,) = history["nodes"].values()
    assert set(node) >= {"t", "cpu", "memory_used_gib", "memory_gib", "gpu"}
    jobs = call(f"clusters/{cluster_id}/jobs")
    assert [j["id"] for j in jobs] == ["job-0001"]
    deadline = time.monotonic() + 30
    lines: list[dict[str, Any]] = []
    position = 0
    while True:  # follow the job's lines from position 0 until it has ended
        page = call(f"clusters/{cluster_id}/jobs/job-0001/logs?after={position}")
        lines += page["lines"]
        assert page["next"] == position + len(page["lines"])
        position = page["next"]
        if page["ended"]:
            break
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)
    for rank in (0, 1):
        texts = [ln["text"] for ln in lines if ln["rank"] == rank]
        assert texts == [f"line {i}" for i in range(5)]
    assert {ln["host"] for ln in lines if ln["rank"] >= 0} == {os.uname().nodename}
    assert [ln["position"] for ln in lines] == list(range(len(lines)))
    again = call(f"clusters/{cluster_id}/jobs/job-0001/logs?after=3&limit=2")
    assert [ln["position"] for ln in again["lines"]] == [3, 4]
    assert again["next"] == 5

    profiles = call("profiles")
    assert profiles["profiles"] == [{"name": "tiny", "kind": "local"}]
    new = call("clusters", "POST", {"profile": "tiny"}, status=201)
    assert (new["state"], new["detached"], new["slots"]) == ("running", True, 1)
    assert new["id"] in {c["id"] for c in call("clusters")}
    harvest(home_dir, secrets)

    # Errors: JSON, with the status that says what went wrong.
    assert call("clusters/nope/jobs", status=404)["error"] == "UnknownClusterError"
    assert "job-0001" in call(f"clusters/{cluster_id}/jobs/job-9/logs", status=404)["message"]
    assert (
        "after" in call(f"clusters/{cluster_id}/jobs/job-0001/logs?after=-1", status=400)["message"]
    )
    assert (
        "no profile" in call("clusters", "POST", {"profile": "none"}, status=404)["message"].lower()
    )

    stopped = call(f"clusters/{new['id']}/stop", "POST")
    assert (stopped["state"], stopped["running"]) == ("stopped", False)
    assert "not running" in call(f"clusters/{new['id']}/stop", "POST", status=409)["message"]
    assert call(f"clusters/{new['id']}/resources", status=409)["error"] == "ClusterStateError"
    stopped = call(f"clusters/{cluster_id}/stop", "POST")
    assert stopped["state"] == "stopped"

    # Without the token: refused, every route.
    routes = [("clusters", "GET"), ("clusters", "POST"), ("profiles", "GET"),
              (f"clusters/{cluster_id}/jobs", "GET"), (f"clusters/{cluster_id}/stop", "POST"),
              (f"clusters/{cluster_id}/jobs/job-0001/logs?after=0", "GET"),
              (f"clusters/{cluster_id}/resources", "GET")]  # fmt: skip
    for path, method in routes:
        assert server.call(path, method, token=False)[0] == 403, (path, method)

    assert {Path(name).parent.name for name in secrets if name.startswith(".local/")} == {
        cluster_id,
        new["id"],
    }  # the control tokens of both clusters, at least
    for path, needles in secrets.items():
        for answer in answers:
            assert not any(n in answer for n in needles), f"the content of ~/{path} in {answer}"


def test_a_post_from_a_browser_needs_the_xsrf_cookies_value(
    home: tuple[dict[str, str], Path], server: Server
) -> None:
    opener, jar = server.browser()  # logged in by cookie, as JupyterLab's page is
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    url = f"{server.url}/clusterbook/api/clusters/nope/stop"
    bare = urllib.request.Request(url, data=b"{}", method="POST")  # noqa: S310 (http, ours)
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(bare, timeout=30)
    assert refused.value.code == 403
    assert "_xsrf" in refused.value.read().decode()
    request = urllib.request.Request(  # noqa: S310 (http, to the server the test started)
        url, data=b"{}", method="POST", headers={"X-XSRFToken": xsrf}
    )
    with pytest.raises(urllib.error.HTTPError) as unknown:  # let through: no such cluster
        opener.open(request, timeout=30)
    assert unknown.value.code == 404
    with opener.open(f"{server.url}/clusterbook/api/clusters", timeout=30) as listed:
        assert listed.status == 200  # a GET needs no XSRF value
