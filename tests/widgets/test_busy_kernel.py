"""Widget clicks act while a cell blocks in ``job.wait()``: a real ipykernel, a real local
cluster and Open MPI job, the clicks sent as JupyterLab sends them (comm messages on the
shell channel) while the cell runs."""

from __future__ import annotations

import ast
import queue
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from tests.conftest import wait_gone
from tests.notebooks.runner import kernel_env

pytestmark = pytest.mark.mpi

_REPLY = 120.0  # seconds any one answer of the kernel may take at most

SETUP = """\
import sys
import clusterbook as cb
import ipywidgets as w
from clusterbook_widgets import ClusterWidget

cluster = cb.Cluster.local(1, 2, python=sys.executable, run_dir={run!r}{options}).start()
# Longer than the clicks take; short enough that a wait holding them fails the test soon.
SLEEP = ["python", "-c", "import time; time.sleep(30)"]
job = cluster.mpirun(SLEEP, np=1)
widget = ClusterWidget(cluster, refresh=None)
order = []
"""

WAIT = """\
order.append("waiting")
print("waiting", flush=True)
result = job.wait()
order.append(("ended", result.cancelled))
print("after the wait")
"""


class Kernel:
    """A kernel of the test venv and a client of it."""

    def __init__(self, manager: KernelManager, client: BlockingKernelClient) -> None:
        self.manager, self.client = manager, client
        self.iopub: list[dict[str, Any]] = []

    def run(self, code: str) -> dict[str, Any]:
        """Run ``code`` and return its reply once it has ended (fail if it raised)."""
        reply = self.reply(self.client.execute(code))
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply

    def reply(self, msg_id: str) -> dict[str, Any]:
        """The shell's reply to ``msg_id`` (replies to others before it are dropped)."""
        while True:
            reply = self.client.get_shell_msg(timeout=_REPLY)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply

    def failing(self, code: str) -> str:
        """Start ``code``, a cell this test expects to end in an error; return its msg_id.

        Sent with ``stop_on_error=False``: by default the kernel aborts what reaches it in a
        short while after a failed cell (the replies say "aborted", with no values), which
        would race with the questions the test asks next."""
        return self.client.execute(code, stop_on_error=False)

    def value(self, expression: str) -> Any:
        """The value of ``expression`` in the kernel, from its repr."""
        reply = self.reply(self.client.execute("", user_expressions={"v": expression}))
        assert reply["content"]["status"] == "ok", reply["content"]
        shown = reply["content"]["user_expressions"]["v"]
        assert shown["status"] == "ok", shown
        return ast.literal_eval(shown["data"]["text/plain"])

    def click(self, comm_id: str) -> None:
        """Click the button of ``comm_id`` as a browser does."""
        self.send(comm_id, {"method": "custom", "content": {"event": "click"}})

    def send(self, comm_id: str, data: dict[str, Any]) -> None:
        """Send ``data`` to the widget of ``comm_id`` as a browser does: a comm message on
        the shell channel."""
        msg = self.client.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
        self.client.shell_channel.send(msg)

    def outputs_of(self, msg_id: str) -> list[dict[str, Any]]:
        """The IOPub messages answering ``msg_id`` so far (stream, error, status, ...)."""
        while True:
            try:
                self.iopub.append(self.client.get_iopub_msg(timeout=0.5))
            except queue.Empty:
                break
        return [m for m in self.iopub if m["parent_header"].get("msg_id") == msg_id]


@pytest.fixture
def kernel(tmp_path: Path, openmpi_python: str) -> Iterator[Kernel]:
    home = tmp_path / "home"
    home.mkdir()
    # Over Unix sockets, not TCP ports picked free before the kernel binds them: on a loaded
    # machine another process took one meanwhile ("Address already in use").
    sockets = Path(tempfile.mkdtemp(prefix="cbk-"))  # short: a socket's path holds 107 bytes
    manager = KernelManager(kernel_name="python3", transport="ipc", ip=str(sockets / "k"))
    manager.start_kernel(env=kernel_env(home), cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=_REPLY)
        yield Kernel(manager, client)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)  # the kernel's end stops its cluster
        shutil.rmtree(sockets, ignore_errors=True)
        left = wait_gone(str(tmp_path), timeout=15)
        for p in left:
            p.kill()
        assert not left, f"processes outlived the kernel: {[p.info for p in left]}"


def _waiting(kernel: Kernel, code: str = WAIT) -> str:
    """Start ``code``, a cell that waits; return its msg_id once it says "waiting".

    A click sent before the cell runs its code may be read by the kernel already, to be
    handled after the cell (as any message the kernel read before the cell blocked): the
    clicks of these tests come once the cell waits, as a person's do."""
    waiting = kernel.client.execute(code)
    _until_printed(kernel, waiting, "waiting")
    return waiting


def _until_printed(kernel: Kernel, msg_id: str, text: str) -> None:
    """Return once the cell of ``msg_id`` has printed ``text`` (a question sent to the kernel
    would wait behind the cell: this watches what it prints instead)."""
    deadline = time.monotonic() + _REPLY
    while text not in "".join(
        m["content"]["text"] for m in kernel.outputs_of(msg_id) if m["msg_type"] == "stream"
    ):
        assert time.monotonic() < deadline, f"the cell never printed {text!r}"


def test_stop_job_and_follow_act_while_a_cell_waits_for_the_job(
    kernel: Kernel, tmp_path: Path
) -> None:
    kernel.run(SETUP.format(run=str(tmp_path / "run"), options=""))
    kernel.run("from clusterbook_widgets import LogViewer\nviewer = LogViewer(job)")
    stop_job = kernel.value("widget.stop_job_button.comm.comm_id")
    follow = kernel.value("viewer.follow_toggle.comm.comm_id")
    waiting = _waiting(kernel)
    after = kernel.client.execute(
        'order.append(("next cell", viewer.follow_toggle.value))'
    )  # sent before the clicks
    kernel.send(follow, {"method": "update", "state": {"value": False}, "buffer_paths": []})
    kernel.click(stop_job)
    assert kernel.reply(waiting)["content"]["status"] == "ok"
    assert kernel.reply(after)["content"]["status"] == "ok"
    # The clicks acted while the cell waited (Follow off, the job cancelled); the cell sent
    # before them ran after it.
    assert kernel.value("order") == ["waiting", ("ended", True), ("next cell", False)]
    assert kernel.value("job.outcome.cancelled") is True
    # What the cell printed after the click is the cell's, not the click's.
    printed = [m for m in kernel.outputs_of(waiting) if m["msg_type"] == "stream"]
    assert "after the wait\n" in "".join(m["content"]["text"] for m in printed)
    kernel.run("cluster.stop()")


def test_stop_cluster_acts_while_a_cell_waits_for_a_job(kernel: Kernel, tmp_path: Path) -> None:
    kernel.run(SETUP.format(run=str(tmp_path / "run"), options=""))
    stop_cluster = kernel.value("widget.stop_cluster_button.comm.comm_id")
    waiting = _waiting(kernel)
    kernel.click(stop_cluster)
    assert kernel.reply(waiting)["content"]["status"] == "ok"
    assert kernel.value("order") == ["waiting", ("ended", True)]
    assert kernel.value("cluster.snapshot().state") == "stopped"


def test_stop_job_acts_while_a_cell_waits_for_a_job_of_a_detached_cluster(
    kernel: Kernel, tmp_path: Path
) -> None:
    # A job of a cluster run by another process is waited for by polling its files.
    kernel.run(SETUP.format(run=str(tmp_path / "run"), options=", detached=True"))
    assert kernel.value("type(job).__name__") == "SavedJob"
    stop_job = kernel.value("widget.stop_job_button.comm.comm_id")
    waiting = _waiting(kernel)
    kernel.click(stop_job)
    try:
        assert kernel.reply(waiting)["content"]["status"] == "ok"
        assert kernel.value("order") == ["waiting", ("ended", True)]
    finally:
        kernel.run("cluster.stop()")


def test_stop_job_acts_while_a_cell_waits_for_a_function_s_result(
    kernel: Kernel, tmp_path: Path
) -> None:
    kernel.run(SETUP.format(run=str(tmp_path / "run"), options=""))
    kernel.run("import time\njob.cancel()\nfuture = cluster.submit(time.sleep, 30, np=1)\n")
    stop_job = kernel.value("widget.stop_job_button.comm.comm_id")
    waiting = _waiting(
        kernel,
        'order.append("waiting")\n'
        'print("waiting", flush=True)\n'
        "try:\n"
        "    future.result()\n"
        "except cb.JobFailedError:\n"
        '    order.append(("raised", future.cancelled()))\n',
    )
    kernel.click(stop_job)
    assert kernel.reply(waiting)["content"]["status"] == "ok"
    assert kernel.value("order") == ["waiting", ("raised", True)]
    kernel.run("cluster.stop()")


def test_a_failing_click_and_a_wait_inside_a_click_leave_the_wait_working(
    kernel: Kernel, tmp_path: Path
) -> None:
    kernel.run(SETUP.format(run=str(tmp_path / "run"), options=""))
    kernel.run(
        "inner = cluster.mpirun(SLEEP, np=1)\n"
        "bad, nested, stop_inner, stop_outer = (w.Button() for _ in range(4))\n"
        "bad.on_click(lambda _: 1 / 0)\n"
        "def wait_inner(_):\n"
        '    order.append("inner waiting")\n'
        '    order.append(("inner ended", inner.wait().cancelled))\n'
        "nested.on_click(wait_inner)\n"
        "stop_inner.on_click(lambda _: inner.cancel())\n"
        "stop_outer.on_click(lambda _: job.cancel())\n"
        "ids = [b.comm.comm_id for b in (bad, nested, stop_inner, stop_outer)]\n"
    )
    ids = kernel.value("ids")
    waiting = _waiting(kernel)
    for comm_id in ids:  # in this order, while the cell waits
        kernel.click(comm_id)
    assert kernel.reply(waiting)["content"]["status"] == "ok"
    assert kernel.value("order") == [
        "waiting",
        "inner waiting",
        ("inner ended", True),
        ("ended", True),
    ]
    kernel.run("cluster.stop()")


MPIRUN_SETUP = """\
%load_ext clusterbook
%cluster local --workers 1 --slots 2
from clusterbook_widgets import ClusterWidget, current_cluster
widget = ClusterWidget(current_cluster(), refresh=None)
"""

MPIRUN = """\
%%mpirun -n 1
import time
print("rank started", flush=True)
time.sleep(30)
"""


def test_stop_job_ends_a_running_mpirun_cell_cancelled(kernel: Kernel) -> None:
    kernel.run(MPIRUN_SETUP)
    stop_job = kernel.value("widget.stop_job_button.comm.comm_id")
    cell = kernel.failing(MPIRUN)
    _until_printed(kernel, cell, "rank started")
    kernel.click(stop_job)
    reply = kernel.reply(cell)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "JobFailedError"
    assert "cancelled" in reply["content"]["evalue"]
    assert kernel.value("current_cluster().jobs[-1].outcome.cancelled") is True
    kernel.run("%cluster stop")


def test_an_interrupt_still_stops_a_mpirun_cell_that_handles_clicks(kernel: Kernel) -> None:
    # The cell waits for its job's lines in short steps, handling clicks in between: the
    # kernel's interrupt reaches it wherever it is, and cancels the job as before.
    kernel.run(MPIRUN_SETUP)
    cell = kernel.failing(MPIRUN)
    _until_printed(kernel, cell, "rank started")
    kernel.manager.interrupt_kernel()
    reply = kernel.reply(cell)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert kernel.value("current_cluster().jobs[-1].outcome.cancelled") is True
    kernel.run("%cluster stop")


ENDED_VIEWER = """\
import pathlib, tempfile, time
from clusterbook.launch.logs import LogRecord
from clusterbook_widgets.log_viewer import LogViewer

class Ended:  # a job whose output has all been read
    id, np, directory = "job-0001", 1, pathlib.Path(tempfile.mkdtemp())

    def stream(self):
        return iter([LogRecord(1.7e9, 0, "alpha", "stdout", "hello")])

viewer = LogViewer(Ended())
viewer.join(timeout=10)
time.sleep(0.5)  # the reader's thread has drawn "ended" by now, under this cell
"""


def test_a_viewers_refresh_sends_what_it_shows_under_its_own_cell(kernel: Kernel) -> None:
    # nbclient and papermill apply a widget's updates only under the cell that sent them: the
    # reader thread's last draw may go out under an earlier cell (or between cells), so an
    # explicit refresh() sends the view again, changed or not, for the notebook to keep.
    kernel.run(ENDED_VIEWER)
    status = kernel.value("viewer.status_html.comm.comm_id")
    cell = kernel.client.execute("viewer.refresh()")
    assert kernel.reply(cell)["content"]["status"] == "ok"
    sent = [
        m["content"]["data"]["state"].get("value", "")
        for m in kernel.outputs_of(cell)
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == status
    ]
    assert any("ended · 1 lines in memory" in value for value in sent), sent
    kernel.run("viewer.close()")
