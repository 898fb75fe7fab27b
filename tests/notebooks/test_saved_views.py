"""What a saved notebook shows once its kernel is gone: nbconvert's HTML (what nbviewer
serves) has the static cluster and job views, and no progress bar is left frozen in it."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PROGRESS = [
    "import clusterbook as cb\n"
    "from pathlib import Path\n"
    "from clusterbook.testing import FakeProvider\n\n"
    'cluster = cb.Cluster(FakeProvider(nodes=2, gather_files={"a.txt": b"A" * 3000}))\n'
    "_ = cluster.start(progress=True)",
    'Path("data.bin").write_bytes(b"x" * 5000)\ncluster.put("data.bin", progress=True)',
    'arrived = cluster.gather("out", progress=True)',
    'Path("empty").mkdir()\ncluster.put("empty", progress=True)\ncluster.stop()',
]


def _html(nb: Any) -> str:
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(nb)
    return str(html)


@pytest.mark.mpi
def test_nbconvert_shows_the_static_cluster_and_job_views(
    executed: Callable[[str], Any], runner: ModuleType
) -> None:
    run = executed("01-local-cluster.ipynb")
    # Saved as JupyterLab saves by default: without widget state, so nbconvert shows each
    # output's HTML, not the live widget.
    nb = copy.deepcopy(run.nb)
    nb.metadata.pop("widgets", None)
    html = _html(nb)
    assert "widget-view" not in html
    (cluster,) = re.findall(r'<table class="cb-nodes".*?</table>', html, re.S)
    for node in ("local-0", "local-1"):
        assert f">{node}<" in cluster
    (job,) = re.findall(r'<div class="cb-job">.*?</svg>', html, re.S)
    assert "cb-state-succeeded" in job
    assert job.count("total 79800") == 4  # each rank's last line
    assert job.count("<rect ") == 4  # and its bar in the timeline

    # Saved with widget state, the cluster is the widget, drawn from that state.
    html = _html(run.nb)
    assert html.count('type="application/vnd.jupyter.widget-view+json"') >= 1
    assert "local-0" in html


@pytest.mark.mpi
def test_a_notebook_keeps_no_frozen_progress_bar(runner: ModuleType, tmp_path: Path) -> None:
    import nbformat

    source = tmp_path / "src" / "progress.ipynb"
    source.parent.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in PROGRESS])
    nbformat.write(nb, source)
    run = runner.execute(source, tmp_path / "run", probe=False)
    started, put, gathered, put_nothing = (cell.outputs for cell in run.nb.cells)
    # The bars were widgets while they ran ...
    drawn = [m for m in runner.widget_state(run.nb).values() if "bar_style" in m]
    assert len(drawn) == 4
    # ... and the outputs they were in hold, once done, nothing (start) or their last line.
    assert [o.data for o in started] == [{"text/plain": ""}]
    assert [o.data for o in put] == [{"text/plain": put[0].data["text/plain"]}]
    assert re.fullmatch(r"put: 4\.88kB \[.*\]", put[0].data["text/plain"])
    assert re.fullmatch(r"gather: 2\.93kB \[.*\]", gathered[0].data["text/plain"])
    assert [o.data for o in put_nothing] == [{"text/plain": ""}]  # no bytes moved: no line
