"""``cluster.engines()``: the pure parts, then a real controller and real MPI engines under a
real launcher, driven from a real IPython shell with ``%%px``."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import ipyparallel as ipp
import psutil
import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

import clusterbook as cb
from clusterbook.engines import _checked, start_engines
from clusterbook.engines.config import (
    CONNECTION_ENV,
    ENGINES_LABEL,
    INTERNAL_PORTS,
    LOWEST_PORT,
    PORTS,
    connection_info,
    controller_argv,
    engine_argv,
    ephemeral_start,
    free_ports,
)
from clusterbook.nodes.tasks.procs import tagged
from clusterbook.status import ClusterSnapshot, JobStatus
from clusterbook.views.html import render_jobs
from clusterbook_widgets.cluster_widget import ClusterWidget
from tests.conftest import require

ALLREDUCE = """\
from mpi4py import MPI
total = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.Get_rank() + 1)
size = MPI.COMM_WORLD.Get_size()
print("rank", MPI.COMM_WORLD.Get_rank(), "total", total)
"""

# -- pure parts ---------------------------------------------------------------------------


def test_connection_info_shares_the_key_and_the_registration_port() -> None:
    ports = list(range(41000, 41000 + PORTS))
    engine, client = connection_info("k" * 64, ports, engine_ip="10.0.0.1", client_ip="127.0.0.1")
    assert engine["interface"] == "tcp://10.0.0.1"
    assert client["interface"] == "tcp://127.0.0.1"
    assert engine["key"] == client["key"] == "k" * 64
    assert engine["registration"] == client["registration"]
    assert engine["location"] == "10.0.0.1"  # addresses: nobody resolves a host name
    assert client["location"] == "127.0.0.1"
    used = [v for d in (engine, client) for k, v in d.items() if k not in ("location", "key")]
    numbers = [p for v in used for p in (v if isinstance(v, list) else [v]) if isinstance(p, int)]
    assert sorted(set(numbers)) == ports  # every port used, none twice but registration
    with pytest.raises(ValueError, match=f"needs {PORTS} ports"):
        connection_info("k", ports[:-1], engine_ip="127.0.0.1", client_ip="127.0.0.1")
    assert engine["curve_serverkey"] is None
    engine, client = connection_info(
        "k", ports, engine_ip="10.0.0.1", client_ip="127.0.0.1", curve_serverkey="PUB"
    )
    assert engine["curve_serverkey"] == client["curve_serverkey"] == "PUB"


def test_the_controllers_ports_are_free_and_out_of_the_kernels_ephemeral_range() -> None:
    # A port the kernel hands out is one an outgoing connection made before the controller
    # binds may take as its local end ("Address already in use" in the controller's log).
    low = ephemeral_start()
    if low is None or low <= LOWEST_PORT + 64 * PORTS:
        pytest.skip("no ephemeral range, or no room below it")
    ports = free_ports(PORTS)
    assert len(set(ports)) == PORTS
    assert all(LOWEST_PORT <= p < low for p in ports)


@pytest.mark.parametrize("range_start", [LOWEST_PORT, None])
def test_without_room_below_the_ephemeral_range_the_kernel_picks(range_start) -> None:
    ports = free_ports(PORTS, range_start=lambda: range_start)
    assert len(set(ports)) == PORTS
    assert all(p > 0 for p in ports)


def test_command_lines_carry_no_secret_and_the_tuning() -> None:
    argv = controller_argv(
        "/py",
        "/run/ipp",
        engine_ip="10.0.0.1",
        client_ip="127.0.0.1",
        heartbeat_ms=50,
        internal_ports=[10001, 10002, 10003],
    )
    assert argv[:3] == ["/py", "-m", "ipyparallel.controller"]
    assert "--reuse" in argv
    assert "--IPController.ports=10001,10002,10003" in argv
    with pytest.raises(ValueError, match=f"needs {INTERNAL_PORTS} internal ports"):
        controller_argv(
            "/py", "/ipp", engine_ip="::1", client_ip="::1", heartbeat_ms=5, internal_ports=[1]
        )
    assert "--HeartMonitor.period=50" in argv
    assert "--IPController.engine_ip=10.0.0.1" in argv
    assert not any("key" in a.lower() for a in argv)
    engine = engine_argv(30)
    assert engine[:4] == ["python", "-m", "ipyparallel.engine", "--mpi"]
    assert "--timeout=30" in engine
    assert CONNECTION_ENV in engine[-1]  # removed from os.environ before user code runs


def _job(argv: tuple[str, ...], label: str | None = None) -> JobStatus:
    return JobStatus("job-0002", 2, argv, "running", None, None, label=label)


def test_a_job_with_a_label_is_shown_under_it() -> None:
    engines = _job(("/venv/bin/python", "-m", "ipyparallel.engine", "--mpi"), ENGINES_LABEL)
    other = _job(("/venv/bin/python", "train.py", "-m", "x"))
    snap = ClusterSnapshot("c", "local", "running", (), (engines, other), None, "/r", 1.0)
    html = render_jobs(snap)
    assert html.count(ENGINES_LABEL) == 1
    assert html.count('class="cb-job-label"') == 1
    assert "ipyparallel.engine --mpi" in html  # the command stays visible, small


def test_bad_arguments_are_refused_before_anything_starts(tmp_path: Path) -> None:
    cluster = cb.Cluster.local(1, 1, run_dir=tmp_path / "run")
    with pytest.raises(cb.ClusterStateError, match="not started"):
        cluster.engines(1)
    for bad in (0, -1, float("nan"), None, "soon", True):
        with pytest.raises(cb.ConfigError, match="timeout must be a duration > 0"):
            start_engines(cluster, 1, timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(cb.ConfigError, match="heartbeat"):
        start_engines(cluster, 1, heartbeat=0)
    with pytest.raises(cb.ConfigError, match=r"heartbeat must be between .* got '20s'"):
        start_engines(cluster, 1, heartbeat="20s")
    for fine in ("50ms", datetime.timedelta(milliseconds=50), 0.05):  # the seconds go on
        assert _checked("2m", fine, None) == (120.0, 0.05)
    with pytest.raises(cb.ConfigError, match=r"progress must be True, False or None.*'yes'"):
        start_engines(cluster, 1, progress="yes")  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


# -- real engines -------------------------------------------------------------------------


def _shell():  # type: ignore[no-untyped-def]
    # start_ipython() returns the shell only the first time it is called in a session.
    return start_ipython() or get_ipython()


def _alive(cluster: cb.Cluster) -> list[int]:
    """Processes of the cluster's jobs and controllers (tagged with its name), not its
    node agents."""
    agents = set(tagged([f"{cluster.id}:agents"]))
    return [pid for pid in tagged([f"{cluster.id}:"], prefix=True) if pid not in agents]


def _wait_none(cluster: cb.Cluster, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _alive(cluster)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.mpi
def test_px_allreduce_on_mpi_engines_and_nothing_leaks(make_cluster, openmpi_python) -> None:
    ip = _shell()
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    t0 = time.monotonic()
    rc = cluster.engines(2, timeout=60)
    started = time.monotonic() - t0
    assert rc.ids == [0, 1]  # engine id = MPI rank
    with capture_output() as out:
        ip.run_cell_magic("px", "", ALLREDUCE)
    assert rc[:]["total"] == [3, 3]
    assert rc[:]["size"] == [2, 2]
    assert "rank 0 total 3" in out.stdout
    assert "rank 1 total 3" in out.stdout
    ip.run_cell_magic("px", "", f"import os\nleft = os.environ.get({CONNECTION_ENV!r})")
    assert rc[:]["left"] == [None, None]
    assert started < 30, started

    # The key: only in 0600 files of the private run directory, nowhere shown.
    security = next((cluster.run_dir / "ipyparallel").glob("controller-*/security"))
    files = sorted(security.glob("*.json"))
    assert [f.name for f in files] == ["ipcontroller-client.json", "ipcontroller-engine.json"]
    key = json.loads(files[0].read_text())["key"]
    assert len(key) >= 32
    for f in [*files, security.parent / "controller.log"]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    (job,) = cluster.jobs
    widget = ClusterWidget(cluster, refresh=None)
    try:
        shown = [repr(rc), repr(cluster), repr(job), repr(job.plan), repr(cluster.snapshot())]
        shown += [out.stdout, str(cluster.status())]
        shown += [w.value for w in (widget.header_html, widget.nodes_html, widget.jobs_html)]
        shown += [(job.directory / "job.json").read_text(), job.logs().to_string()]
        shown += [" ".join(p.cmdline()) for p in map(_process, _alive(cluster)) if p]
        assert not [s for s in shown if key in s]
        assert ENGINES_LABEL in widget.jobs_html.value
    finally:
        widget.close()

    cluster.stop()
    assert _wait_none(cluster) == []
    assert list(security.glob("*.json")) == []  # the key does not outlive the controller
    assert job.outcome is not None
    assert job.outcome.cancelled


def _process(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


@pytest.mark.mpi
def test_the_controller_listens_only_on_ports_it_was_given(make_cluster, openmpi_python) -> None:
    # A port the controller picked itself would be one the kernel handed out and took back:
    # an outgoing connection may take it before the controller binds it, and the controller
    # then dies ("Address already in use"). Every port it listens on is one chosen for it.
    cluster = make_cluster(openmpi_python, workers=1, slots=1)
    cluster.engines(1, timeout=60)
    security = next((cluster.run_dir / "ipyparallel").glob("controller-*/security"))
    given: set[int] = set()
    for info in (json.loads(f.read_text()) for f in security.glob("*.json")):
        for value in info.values():
            given.update(v for v in (value if isinstance(value, list) else [value]) if _port(v))
    argv = next(p.cmdline() for p in _controllers())
    (internal,) = [a.split("=", 1)[1] for a in argv if a.startswith("--IPController.ports=")]
    given.update(map(int, internal.split(",")))
    listening: set[int] = set()
    for p in _controllers():
        with contextlib.suppress(psutil.Error):  # a helper of the controller that just ended
            listening |= {c.laddr.port for c in p.net_connections("tcp") if c.status == "LISTEN"}
    assert len(listening) == PORTS + INTERNAL_PORTS
    assert listening <= given, sorted(listening - given)
    cluster.stop()


def _port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _controllers() -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "ipyparallel.controller" in " ".join(p.cmdline()):
                found.append(p)
    return found


def _handshake(port: int, *, curve_serverkey: bytes | None) -> str:
    """How a ZeroMQ handshake with the controller's registration port ends: "ok" or
    "refused" (with CurveZMQ only when ``curve_serverkey`` is given)."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    if curve_serverkey is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
            curve_serverkey,
            public,
            secret,
        )
    monitor = sock.get_monitor_socket()
    monitor.rcvtimeo = 10_000
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        while True:
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return "ok"
            if event in (
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                zmq.EVENT_DISCONNECTED,
            ):
                return "refused"
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()


@pytest.mark.mpi
def test_engine_traffic_is_encrypted_with_curvezmq(make_cluster, openmpi_python) -> None:
    cluster = make_cluster(openmpi_python, workers=1, slots=1)
    rc = cluster.engines(1, timeout=60, encrypt=True)  # the default on SSH clusters
    assert rc[:].apply_sync(lambda: 6 * 7) == [42]
    security = next((cluster.run_dir / "ipyparallel").glob("controller-*/security"))
    info = json.loads((security / "ipcontroller-client.json").read_text())
    engine_info = json.loads((security / "ipcontroller-engine.json").read_text())
    assert info["curve_serverkey"]
    assert info["curve_serverkey"] == engine_info["curve_serverkey"]
    port = info["registration"]
    # A peer without CurveZMQ gets no connection at all; one with the server's key does.
    assert _handshake(port, curve_serverkey=None) == "refused"
    assert _handshake(port, curve_serverkey=info["curve_serverkey"].encode()) == "ok"
    # Only the controller holds the secret key: not the engines, not the connection files.
    assert not [name for name in cluster.jobs[0].plan.env if name.startswith("IPP_CURVE")]
    assert "secret" not in json.dumps([info, engine_info]).lower()
    cluster.stop_engines()

    # On this machine alone the traffic never leaves it: signed only, unless asked.
    cluster.engines(1, timeout=60)
    security = max((cluster.run_dir / "ipyparallel").glob("controller-*/security"))
    info = json.loads((security / "ipcontroller-client.json").read_text())
    assert info["curve_serverkey"] is None
    assert _handshake(info["registration"], curve_serverkey=None) == "ok"
    with pytest.raises(cb.ConfigError, match="encrypt must be"):
        cluster.engines(1, encrypt="yes")  # type: ignore[arg-type]


def test_stop_engines_leaves_the_cluster_running(make_cluster, openmpi_python, capsys) -> None:
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    rc = cluster.engines(1, timeout=60, progress=True)
    assert "engines registered" in capsys.readouterr().err  # the bar, asked for
    assert rc.ids == [0]
    assert rc[0].apply_sync(lambda: 6 * 7) == 42
    # A cell that exits is an error of that cell, as in any kernel: no engine ends.
    with pytest.raises(ipp.error.CompositeError, match="SystemExit"):
        rc[:].execute("import sys\nsys.exit(3)", block=True)
    assert rc[:].apply_sync(lambda: 6 * 7) == [42]
    cluster.stop_engines()
    assert _wait_none(cluster) == []
    assert cluster.state == "running"
    assert cluster.snapshot().jobs[0].state == "cancelled"
    assert cluster.mpirun(["python", "-c", "pass"], np=1).wait(timeout=60).ok


@pytest.mark.mpi
def test_engines_that_die_at_start_up_say_why(make_cluster, openmpi_python) -> None:
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    # mpi4py without MPI_Init: the engine's first MPI call fails on every rank.
    with pytest.raises(cb.JobFailedError, match=r"engines .*ended before they were all ready"):
        cluster.engines(2, timeout=60, env={"MPI4PY_RC_INITIALIZE": "false"})
    assert _wait_none(cluster) == []


@pytest.mark.mpi
def test_engines_not_ready_in_time_are_stopped(make_cluster, openmpi_python) -> None:
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    with pytest.raises(cb.ReadyTimeoutError, match=r"not ready after 0\.2 s"):
        cluster.engines(2, timeout=0.2)
    assert _wait_none(cluster) == []
    assert cluster.jobs[0].done()
    with pytest.raises(cb.ConfigError, match="3"):  # more engines than slots
        cluster.engines(3)
    assert _wait_none(cluster) == []  # the controller started for them is gone too
    assert len(cluster.jobs) == 1


DRIVER = """\
import sys
import clusterbook as cb
python, run_dir, name = sys.argv[1:4]
cluster = cb.Cluster.local(1, 2, python=python, run_dir=run_dir, name=name).start()
rc = cluster.engines(2, timeout=60)
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.mpi
def test_sigkill_of_the_kernel_takes_controller_and_engines_along(openmpi_python, tmp_path):
    name = f"ek-{os.getpid()}-{tmp_path.name[-10:]}".replace("_", "-")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, openmpi_python, str(tmp_path / "run"), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "ready"
        pids = tagged([f"{name}-"], prefix=True)
        modules = [p.cmdline()[1:3] for p in map(_process, pids) if p]
        assert ["-m", "ipyparallel.controller"] in modules
        assert modules.count(["-m", "ipyparallel.engine"]) == 2
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        deadline = time.monotonic() + 5
        while (left := tagged([f"{name}-"], prefix=True)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == []
    finally:
        driver.kill()
        driver.wait(timeout=10)
        for pid in tagged([f"{name}-"], prefix=True):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.mpi
@pytest.mark.mpich
def test_mpich_engines(make_cluster, mpich_python) -> None:
    probe = subprocess.run([mpich_python, "-c", "import ipyparallel"], check=False)
    require(probe.returncode == 0, "ipyparallel is not installed in the MPICH environment")
    cluster = make_cluster(mpich_python, workers=1, slots=2)
    ip = _shell()
    rc = cluster.engines(2, timeout=60)
    ip.run_cell_magic("px", "", ALLREDUCE)
    assert rc[:]["total"] == [3, 3]
