"""A real Slurm for integration tests: ``tests/slurm_testbed.sh`` brought up once a module.

slurmctld on this machine (the head), one slurmd per fake host (``snode1``, ``snode2``: a
network namespace and hostname each, sharing this machine's files), and a private munged; see
the script's header for the layout and what was learnt making it. The fixture takes it down in
its finalizer whatever happened, and holds a lock meanwhile (the script's bridge, namespaces
and ports are fixed: two sessions must not run it at once). Without root or Slurm's packages
it skips, or fails under ``CLUSTERBOOK_REQUIRE_TESTBED=1``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.conftest import require

SCRIPT = Path(__file__).with_name("slurm_testbed.sh")
LOCK = Path("/run/clusterbook-slurm-testbed.lock")
HOSTS = ("snode1", "snode2")
TOOLS = ("sbatch", "squeue", "scancel", "srun", "slurmctld", "slurmd", "munged", "ip")


@dataclass(frozen=True)
class SlurmBed:
    """The running test-bed Slurm: its directory, config, and fake hosts' names."""

    directory: Path
    conf: Path
    hosts: tuple[str, ...] = HOSTS

    def run(self, *argv: str, timeout: float = 30) -> str:
        """A Slurm command against this Slurm (wrapped in a deadline: srun may block)."""
        done = subprocess.run(
            list(argv),
            env={**os.environ, "SLURM_CONF": str(self.conf)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return done.stdout

    def active_jobs(self) -> list[str]:
        """``ID STATE`` of every job that holds or waits for nodes."""
        return self.run("squeue", "-h", "-o", "%i %T").split("\n")[:-1]

    def cancel_all(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self.run("scancel", "--user", str(os.getuid()))


def _locked(deadline: float) -> int:
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                pytest.fail(f"another session holds the Slurm test bed ({LOCK}) for too long")
            time.sleep(0.5)


@pytest.fixture(scope="module")
def slurmbed() -> Iterator[SlurmBed]:
    """Slurm up for the module's tests; down (daemons, namespaces, bridge) at its end."""
    require(os.geteuid() == 0, "the Slurm test bed needs root (network namespaces)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    require(
        not missing,
        f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld "
        "slurmd slurm-client munge libpmix-dev",
    )
    fd = _locked(time.monotonic() + 300)
    # Its bridge, namespaces and ports are fixed: a slurmctld running now (a test bed started
    # by hand, say) would take this one's port and talk to its nodes with another munge key.
    running = [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "slurmctld"]
    if running:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        pytest.fail(f"a slurmctld already runs here (pid {running}): take its test bed down first")
    directory = Path(tempfile.mkdtemp(prefix="slurmbed-"))
    directory.chmod(0o755)  # munged and slurmd read below it
    before = os.environ.get("SLURM_CONF")
    try:
        up = subprocess.run(
            ["bash", str(SCRIPT), "up", str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if up.returncode != 0:
            pytest.fail(f"the Slurm test bed did not come up:\n{up.stderr[-3000:]}")
        bed = SlurmBed(directory, directory / "slurm.conf")
        os.environ["SLURM_CONF"] = str(bed.conf)  # for sbatch & co., here and in clusterbook
        yield bed
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        subprocess.run(
            ["bash", str(SCRIPT), "down", str(directory)],
            capture_output=True,
            timeout=120,
            check=False,
        )
        shutil.rmtree(directory, ignore_errors=True)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@pytest.fixture
def slurm(slurmbed: SlurmBed) -> Iterator[SlurmBed]:
    """The test bed, with no job left over by a test (it fails the test, then is cancelled)."""
    yield slurmbed
    deadline = time.monotonic() + 15  # a job whose processes were just killed is ending
    while any(j.endswith(" COMPLETING") for j in slurmbed.active_jobs()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    left = slurmbed.active_jobs()
    slurmbed.cancel_all()
    assert not left, f"jobs left in Slurm's queue: {left}"
