"""The cluster widget at scale, headless: a cluster of the shipped FakeProvider with 120 nodes
(a page is 50 rows), a clock injected into the throttles and into the nodes' reports. Long
tables show a page of rows and turn; a part whose rows did not change is not rendered again;
the plots follow the nodes' reports, for the nodes of the page, and only when they change."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.testing import FakeProvider
from clusterbook_widgets.cluster_widget import ClusterWidget
from tests.sdk.cluster.test_facade import STAND_IN
from tests.widgets.fakes import ManualScheduler


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def big(tmp_path: Path) -> Iterator[tuple[cb.Cluster, FakeProvider, Clock]]:
    launcher = tmp_path / "bin" / "mpirun"
    launcher.parent.mkdir()
    launcher.write_text(STAND_IN)
    launcher.chmod(0o755)
    options = ClusterOptions.make("big", launcher=str(launcher), run_dir=tmp_path / "run")
    clock = Clock()
    provider = FakeProvider(nodes=120, clock=clock)
    cluster = cb.Cluster(provider, options).start()
    yield cluster, provider, clock
    cluster.stop()


def shown_nodes(html: str) -> list[str]:
    return re.findall(r"<td[^>]*>(fake-\d+)</td>", html)


def report(provider: FakeProvider, names: list[str], cpu: float) -> None:
    provider.report_usage(
        {n: {"cpu": cpu, "memory_used_gib": 1.0, "memory_gib": 4.0} for n in names}
    )


def test_a_long_table_shows_a_page_of_rows_and_turns(big) -> None:
    cluster, _, _ = big
    widget = ClusterWidget(cluster, scheduler=ManualScheduler(), refresh=None)
    assert shown_nodes(widget.nodes_html.value) == [f"fake-{i}" for i in range(50)]
    assert "120 nodes: 120 ready · showing 1 to 50" in widget.nodes_html.value
    pager = widget.nodes_pager
    assert (pager.label.value, pager.previous_button.disabled) == ("page 1 of 3", True)
    assert pager.layout.display is None  # shown: there is more than a page
    pager.next_button.click()
    assert shown_nodes(widget.nodes_html.value) == [f"fake-{i}" for i in range(50, 100)]
    pager.next_button.click()
    assert shown_nodes(widget.nodes_html.value) == [f"fake-{i}" for i in range(100, 120)]
    assert (pager.label.value, pager.next_button.disabled) == ("page 3 of 3", True)
    pager.next_button.click()  # past the last page: it stays
    assert "showing 101 to 120" in widget.nodes_html.value
    assert widget.jobs_pager.layout.display == "none"  # no job: no pages
    widget.close()


def test_an_unchanged_part_is_not_rendered_again_and_the_plots_follow_reports(big) -> None:
    cluster, provider, _ = big
    scheduler = ManualScheduler()
    widget = ClusterWidget(cluster, scheduler=scheduler, refresh=None)
    assert "No resource reports" in widget.usage.html.value
    rendered, draws = dict(widget.renders), widget.usage.draws
    provider.report_problem(None)  # the cluster tells of a change that changes no row
    scheduler.advance(1.0)
    assert dict(widget.renders) == rendered
    assert widget.usage.draws == draws  # asked again, the same answer: not drawn
    report(provider, [f"fake-{i}" for i in range(120)], cpu=40.0)
    scheduler.advance(1.0)
    assert widget.usage.draws == draws + 1
    plots = widget.usage.html.value
    assert plots.count('class="cb-spark"') == 2 * 51  # CPU and memory: the sum, and a page
    assert ">fake-49<" in plots
    assert ">fake-50<" not in plots
    assert "now 40%" in plots
    assert widget.renders["jobs"] == rendered["jobs"]  # no job changed
    assert widget.renders["nodes"] == rendered["nodes"] + 1  # the rows show the memory now
    assert "1.0 GiB of 4.0 GiB (25%)" in widget.nodes_html.value
    widget.nodes_pager.next_button.click()  # the plots of the next page, at once
    assert ">fake-50<" in widget.usage.html.value
    assert ">fake-49<" not in widget.usage.html.value
    widget.close()
