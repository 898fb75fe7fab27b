"""The pure renderers of a cluster and its jobs: what a snapshot turns into as HTML."""

from __future__ import annotations

import re

import pytest

from clusterbook.status import ClusterSnapshot, JobStatus, NodeStatus
from clusterbook.views.html import (
    render_header,
    render_jobs,
    render_nodes,
    render_progress,
)
from clusterbook.views.style import STATE_COLOURS

EVIL = "<script>alert(1)</script>"


def snap(nodes=(), jobs=(), **kw) -> ClusterSnapshot:
    fields = {
        "name": "demo",
        "kind": "local",
        "state": "running",
        "launcher": "/usr/bin/mpirun",
        "run_dir": "/tmp/runs/demo",
        "uptime": 65.0,
    }
    fields.update(kw)
    return ClusterSnapshot(nodes=tuple(nodes), jobs=tuple(jobs), **fields)


def node(name="n1", state="ready", **kw) -> NodeStatus:
    return NodeStatus(name=name, host=kw.pop("host", f"{name}.example"), slots=2, state=state, **kw)


def job(id="job-0001", state="succeeded", **kw) -> JobStatus:
    fields = {"np": 4, "argv": ("python", "train.py"), "returncode": 0, "duration": 2.5}
    fields.update(kw)
    return JobStatus(id=id, state=state, **fields)


def rows(table: str) -> list[str]:
    return re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1])


# -- header and progress -----------------------------------------------------------------


def test_header_names_state_round_world_size_and_uptime():
    s = snap(
        nodes=[
            node("a", "joined", round=3),
            node("b", "joined", round=4),
            node("c", "lost", round=2),
        ]
    )
    out = render_header(s)
    assert "<b>demo</b>" in out
    assert STATE_COLOURS["running"] in out
    assert ">running<" in out
    assert "round 4" in out
    # the lost node's slots are not part of the world any more
    assert "world size 4 (2 nodes)" in out
    assert "up 1m 05s" in out


def test_header_of_a_cluster_without_rounds_or_uptime():
    out = render_header(snap(nodes=[node()], uptime=None, state="created"))
    assert "round —" in out
    assert "up —" in out
    assert ">created<" in out


def test_header_shows_the_clusters_own_problem_escaped():
    assert "cb-problem" not in render_header(snap())
    out = render_header(snap(problem=f"The rendezvous state cannot be read {EVIL}"))
    assert '<div class="cb-problem"' in out
    assert "The rendezvous state cannot be read" in out
    assert "<script>" not in out


def test_header_escapes_the_cluster_name():
    out = render_header(snap(name=EVIL))
    assert "<script>" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out


def test_progress_counts_ready_nodes_of_a_fixed_cluster():
    s = snap(nodes=[node("a", "ready"), node("b", "running"), node("c", "pending")])
    out = render_progress(s)
    assert "2 of 3 nodes ready, 1 waiting" in out
    assert "width:67%" in out
    # not everyone is up yet: the bar is the pending colour
    assert STATE_COLOURS["pending"] in out


def test_progress_of_an_elastic_cluster_against_min_and_max():
    s = snap(nodes=[node("a", "joined"), node("b", "pending"), node("c", "left")])
    out = render_progress(s, min_nodes=2, max_nodes=4, last_call_left=0.42)
    assert "1 nodes joined (min 2, max 4), 1 more needed, 1 waiting" in out
    assert "last call closes in 0.4 s" in out
    assert "width:25%" in out
    full = render_progress(snap(nodes=[node("a", "joined"), node("b", "joined")]), 2, 4)
    assert "more needed" not in full
    assert STATE_COLOURS["ready"] in full


def test_progress_of_a_cluster_whose_nodes_are_all_gone_says_how():
    out = render_progress(snap(nodes=[node("a", "left"), node("b", "lost"), node("c", "left")]))
    assert "no node up: 2 left, 1 lost" in out
    assert "yet" not in out
    assert "width:0%" in out


def test_progress_refuses_min_above_max():
    with pytest.raises(ValueError, match=r"min_nodes \(3\).*max_nodes \(2\)"):
        render_progress(snap(), min_nodes=3, max_nodes=2)


# -- nodes -------------------------------------------------------------------------------


def test_every_node_state_has_its_own_colour():
    states = ["pending", "ready", "joined", "running", "lost", "left"]
    out = render_nodes(snap(nodes=[node(f"n{i}", s) for i, s in enumerate(states)]))
    for row, state in zip(rows(out), states, strict=True):
        assert f"cb-state-{state}" in row
        assert f"background:{STATE_COLOURS[state]}" in row
    assert len({STATE_COLOURS[s] for s in ("pending", "ready", "running", "lost", "left")}) == 5


def test_node_table_shows_slots_ranks_heartbeat_load_and_memory():
    n = node(
        "w1",
        "running",
        ranks=(0, 1),
        job="job-0002",
        heartbeat_age=0.25,
        load=1.5,
        memory_used=37.4,
        memory=int(23.5 * 1024**3),
    )
    (row,) = rows(render_nodes(snap(nodes=[n])))
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells[0] == "w1"
    assert cells[1] == "w1.example"
    assert cells[2] == "2"
    assert cells[4] == "0,1 (job-0002)"
    assert cells[5] == "0.2 s ago"
    assert cells[6] == "1.50"
    assert cells[7] == "8.8 GiB of 23.5 GiB (37%)"


def test_memory_shows_what_is_known_of_it():
    nodes = [
        node("a", memory_used=12.0),
        node("b", memory=1024**3),
        node("c"),
    ]
    cells = [
        re.findall(r"<td[^>]*>(.*?)</td>", r)[7] for r in rows(render_nodes(snap(nodes=nodes)))
    ]
    assert cells == ["12%", "? of 1.0 GiB", "—"]
    assert ">Memory</th>" in render_nodes(snap(nodes=nodes))


def test_node_names_and_hosts_are_escaped():
    out = render_nodes(snap(nodes=[node(EVIL, host='"><img src=x onerror=alert(1)>')]))
    assert "<script>" not in out
    assert "<img" not in out
    assert "&lt;script&gt;" in out
    assert "&quot;&gt;&lt;img" in out


def test_empty_cluster_renders_placeholders():
    empty = snap(uptime=None)
    assert "No nodes yet." in render_nodes(empty)
    assert "<table" not in render_nodes(empty)
    assert "No jobs yet." in render_jobs(empty)
    assert "no nodes yet" in render_progress(empty)
    assert "width:0%" in render_progress(empty)
    assert "world size 0 (0 nodes)" in render_header(empty)


# -- jobs --------------------------------------------------------------------------------


def test_failed_job_shows_exit_code_duration_and_failed_ranks():
    failed = job("job-0003", "failed", returncode=1, duration=125.0, failed_ranks=(1, 3))
    (row,) = rows(render_jobs(snap(jobs=[failed])))
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells[0] == "job-0003"
    assert cells[1] == "4"
    assert f"background:{STATE_COLOURS['failed']}" in cells[3]
    assert cells[4] == "1"
    assert cells[5] == "2m 05s"
    assert 'class="cb-failed"' in cells[6]
    assert ">1, 3</span>" in cells[6]


def test_running_job_has_no_exit_code_or_failed_ranks_yet():
    running = job("job-0001", "running", returncode=None, duration=None)
    (row,) = rows(render_jobs(snap(jobs=[running])))
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells[4] == "—"
    assert cells[5] == "—"
    assert cells[6] == "—"


def test_a_retried_job_shows_its_attempt_restarts_and_why_the_one_before_ended():
    retried = job(
        "job-0002", "running", returncode=None, duration=None, attempt=3, restarts=1,
        last_reason="node <b>n2</b> lost",
    )  # fmt: skip
    (row,) = rows(render_jobs(snap(jobs=[retried])))
    state = re.findall(r"<td[^>]*>(.*?)</td>", row)[3]
    assert "attempt 3, restart 1 · after node &lt;b&gt;n2&lt;/b&gt; lost" in state
    assert 'title="node &lt;b&gt;n2&lt;/b&gt; lost"' in state
    (first,) = rows(render_jobs(snap(jobs=[job("job-0001", "running")])))
    assert "attempt" not in first


def test_running_jobs_come_first_then_finished_newest_first():
    jobs = [
        job("job-0001"),
        job("job-0002", "running", returncode=None, duration=None),
        job("job-0003", "cancelled", returncode=-15),
        job("job-0004", "timed out", returncode=-9),
    ]
    out = render_jobs(snap(jobs=jobs))
    order = re.findall(r"job-000\d", out)
    assert order == ["job-0002", "job-0004", "job-0003", "job-0001"]
    assert STATE_COLOURS["timed out"] in out
    assert "cb-state-timed-out" in out


def test_argv_is_shell_quoted_and_escaped_also_in_its_title():
    out = render_jobs(snap(jobs=[job(argv=("python", "-c", f'print("{EVIL}")'))]))
    assert "<script>" not in out
    assert "&lt;script&gt;" in out
    # the title attribute cannot be broken out of
    title = re.search(r'title="([^"]*)"', out)
    assert title is not None
    assert "&lt;script&gt;" in title.group(1)
    assert "python -c" in out


def test_long_argv_is_shortened_but_kept_whole_in_the_title():
    argv = ("python", "x" * 500)
    out = render_jobs(snap(jobs=[job(argv=argv)]))
    shown = re.search(r"<code[^>]*>(.*?)</code>", out).group(1)
    assert len(shown) == 160
    assert shown.endswith("…")
    assert "x" * 500 in out
