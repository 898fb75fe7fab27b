"""The plots of the resource history (pure): a sparkline's line, its gaps and its scale, and
the table of the cluster's sum and a page of nodes, with user data escaped."""

from __future__ import annotations

import re

from clusterbook.resources import ResourceHistory, empty_answer
from clusterbook.status import ClusterSnapshot, NodeStatus
from clusterbook.views.html import page_of, render_nodes
from clusterbook.views.plots import render_usage, sparkline


def points(svg: str) -> list[tuple[str, float, float]]:
    (path,) = re.findall(r'<path d="([^"]*)"', svg)
    found = re.findall(r"(M?)([\d.]+) ([\d.]+)", path)
    return [(m or "L", float(x), float(y)) for m, x, y in found]


def test_a_sparkline_runs_from_the_bottom_to_its_top_and_breaks_where_nothing_is_known() -> None:
    svg = sparkline([0.0, 50.0, None, 100.0, 200.0], 100.0, colour="#000", label="cpu")
    drawn = points(svg)
    assert [m for m, _, _ in drawn] == ["M", "L", "M", "L"]  # the gap starts a new line
    assert [x for _, x, _ in drawn] == [0.0, 30.0, 90.0, 120.0]
    assert [y for _, _, y in drawn] == [21.0, 11.0, 1.0, 1.0]  # above the top: at the top
    assert "<title>cpu</title>" in svg
    assert "<path" not in sparkline([None, None], 100.0, colour="#000", label="x")


def test_the_usage_table_has_the_clusters_sum_then_the_nodes_asked_for_escaped() -> None:
    clock = [1000.0]
    history = ResourceHistory(1.0, clock=lambda: clock[0])
    for _ in range(2):  # the sum of the second interval has both
        clock[0] += 1
        for node, cpu in (("<n0>", 10.0), ("n1", 30.0)):
            history.add(node, clock[0], cpu=cpu, memory_used_gib=2.0, memory_gib=8.0, gpu=None)
    html = render_usage(history.answer(), ["n1", "<n0>", "gone"])
    rows = re.findall(r"<tr>(.*?)</tr>", html)
    assert len(rows) == 4  # the header, the cluster, n1, <n0>
    assert "<b>cluster</b>" in rows[1]
    assert "now 20%" in rows[1]  # the mean of the nodes' CPU
    assert ">n1<" in rows[2]
    assert "&lt;n0&gt;" in rows[3]
    assert "<n0>" not in html
    assert "now 2.0 GiB of 8.0 GiB" in rows[2]
    assert "No resource reports" in render_usage(empty_answer(1.0))


def snapshot(count: int) -> ClusterSnapshot:
    nodes = tuple(
        NodeStatus(f"n{i}", "h", 1, "lost" if i % 10 == 0 else "running") for i in range(count)
    )
    return ClusterSnapshot("c", "fake", "running", nodes, (), None, "", 1.0)


def test_a_paged_node_table_shows_its_page_under_a_line_that_counts_them_all() -> None:
    assert page_of(120, 1, 50) == (50, 100, 1)
    assert page_of(120, 7, 50) == (100, 120, 2)  # past the last page: the last
    assert page_of(120, -1, 50) == (0, 50, 0)
    assert page_of(120, 1, None) == (0, 120, 0)
    html = render_nodes(snapshot(120), 1, 50)
    assert re.findall(r">(n\d+)</td>", html) == [f"n{i}" for i in range(50, 100)]
    assert "120 nodes: 108 running, 12 lost · showing 51 to 100" in html
    assert "cb-summary" not in render_nodes(snapshot(50), 0, 50)  # one page: no line
    assert len(re.findall(r">(n\d+)</td>", render_nodes(snapshot(120)))) == 120
