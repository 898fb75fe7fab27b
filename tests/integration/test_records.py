"""Records and clean-ups no one can turn against their owner, with real detached clusters and a
real second local user: a record another user changed, a lock file that is a link, a job
directory outside its cluster, a pid that now belongs to another process.

Where the other user acts, the cluster's directory is one it can write (as a shared project
directory would be): clusterbook then refuses the directory itself (``UnsafePathError``), and
once its owner made it private again as told, what the other user left there is not trusted
either. The clusters run in a home of the tests' own: a record that aims at ``~/victim`` aims
at a directory of the test, never at the real home of the user running the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.users import LocalUser

pytestmark = [pytest.mark.root, pytest.mark.mpi]

CLI = [sys.executable, "-m", "clusterbook"]

# Starts a detached cluster and prints what the tests need of it; the cluster outlives it.
START = """\
import sys
import clusterbook as cb
cluster = cb.Cluster.local(1, 1, python=sys.argv[1], run_dir=sys.argv[2], detached=True).start()
print(cluster.id, cluster.name, flush=True)
"""

# Run as the other user: replace the record in a directory it can write with one changed.
CHANGE = """\
import json, os, sys
directory, changes = sys.argv[1], json.loads(sys.argv[2])
path = os.path.join(directory, "cluster.json")
with open(path) as f:
    record = json.load(f)
record.update(changes)
with open(path + ".new", "w") as f:
    json.dump(record, f)
os.replace(path + ".new", path)  # the directory is writable: the file need not be
"""

# Run as the other user: put a symbolic link at sys.argv[1] pointing at sys.argv[2].
LINK = """\
import os, sys
os.symlink(sys.argv[2], sys.argv[1])
"""


@dataclass
class Detached:
    """A detached cluster a test started: its id, name, directory and processes."""

    id: str
    name: str
    run_dir: Path
    head: psutil.Process
    processes: list[psutil.Process]

    def record(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.run_dir / "cluster.json").read_text())
        return data


class Owner:
    """The user running the tests, with a home of its own for the clusters they make."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.home = base / "home"
        self.home.mkdir(mode=0o700)
        self.env = {**os.environ, "HOME": str(self.home)}
        self.started: list[Detached] = []

    def start(self, python: str, name: str = "c", *, shared: bool = True) -> Detached:
        """A detached cluster; ``shared``: its directory made one the other user can write."""
        run_dir = self.base / name
        done = subprocess.run(
            [sys.executable, "-c", START, python, str(run_dir)],
            env=self.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        cluster_id, cluster_name = done.stdout.split()
        record = json.loads((run_dir / "cluster.json").read_text())
        head = psutil.Process(record["head_pid"])
        started = Detached(
            cluster_id, cluster_name, run_dir, head, [head, *head.children(recursive=True)]
        )
        self.started.append(started)
        if shared:
            self.share(started)
        return started

    def share(self, cluster: Detached) -> None:
        cluster.run_dir.chmod(0o777)

    def private(self, cluster: Detached) -> None:
        """What the owner does when told the directory is shared: make it theirs alone."""
        cluster.run_dir.chmod(0o700)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip

    def kill_head(self, cluster: Detached) -> None:
        """SIGKILL the cluster's supervisor; return once it and its node agents are gone."""
        cluster.head.send_signal(signal.SIGKILL)
        _gone, alive = psutil.wait_procs(cluster.processes, timeout=15)
        assert alive == [], alive

    def close(self) -> None:
        for cluster in self.started:
            self.cli("stop", "--force", str(cluster.run_dir), timeout=60)
            for proc in cluster.processes:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(cluster.processes, timeout=10)


@pytest.fixture
def owner() -> Iterator[Owner]:
    base = Path(tempfile.mkdtemp(prefix="cbrecords-"))
    base.chmod(0o755)  # the other user reaches the shared directory in it
    owner = Owner(base)
    try:
        yield owner
    finally:
        try:
            owner.close()
        finally:
            shutil.rmtree(base, ignore_errors=True)


def _as_other(user: LocalUser, code: str, *args: str) -> None:
    done = user.run_python(code, *args)
    assert done.returncode == 0, done.stderr


def _wait(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_stop_neither_follows_a_link_nor_trusts_a_record_another_user_changed(
    openmpi_python: str, other_user: LocalUser, owner: Owner
) -> None:
    cluster = owner.start(openmpi_python)
    original = (cluster.run_dir / "cluster.json").read_text()
    mine = owner.home / "victim"
    mine.mkdir()
    (mine / "work").write_text("mine\n")
    notes = owner.home / "notes"
    notes.write_text("mine\n")
    elsewhere = owner.home / "elsewhere"
    elsewhere.mkdir()
    owner.kill_head(cluster)  # stop() now cleans what the head left, itself

    # A record that says the cluster is elsewhere: it would be written there.
    _as_other(other_user, CHANGE, str(cluster.run_dir), json.dumps({"directory": str(elsewhere)}))
    done = owner.cli("stop", str(cluster.run_dir))
    assert done.returncode == 1, done.stdout
    assert f"says its cluster's directory is {elsewhere}" in done.stderr
    assert not (elsewhere / "cluster.json").exists()

    # A name that is a path: the cluster's own directory is found by it, and removed.
    aimed = {"directory": str(cluster.run_dir), "name": "../../victim"}
    owner.share(cluster)
    _as_other(other_user, CHANGE, str(cluster.run_dir), json.dumps(aimed))
    owner.private(cluster)
    done = owner.cli("stop", str(cluster.run_dir))
    assert done.returncode == 1, done.stdout
    assert "its name '../../victim' is not a cluster's name: 1-63 letters" in done.stderr
    assert (mine / "work").read_text() == "mine\n"

    # The lock stop() takes is a link to a file of the owner's: it would be emptied.
    (cluster.run_dir / "cluster.json").unlink()  # the other user's file: the owner's again
    (cluster.run_dir / "cluster.json").write_text(original)
    owner.share(cluster)
    _as_other(other_user, LINK, str(cluster.run_dir / ".stop.lock"), str(notes))
    # The directory others can write is refused as a whole; once its owner made it private
    # as told, the link left in it is not followed either.
    done = owner.cli("stop", str(cluster.run_dir))
    assert done.returncode == 2, done.stdout
    assert f"directory {cluster.run_dir} is writable by other users" in done.stderr
    assert f"chmod go-w {cluster.run_dir}" in done.stderr
    assert notes.read_text() == "mine\n"
    owner.private(cluster)
    done = owner.cli("stop", str(cluster.run_dir))
    assert done.returncode == 2, done.stdout  # an UnsafePathError, as for the directory
    assert f"Refusing {cluster.run_dir / '.stop.lock'}: it is a symbolic link" in done.stderr
    assert notes.read_text() == "mine\n"

    # Once the link is gone, stop() cleans the cluster, and only it.
    (cluster.run_dir / ".stop.lock").unlink()
    done = owner.cli("stop", str(cluster.run_dir))
    assert done.returncode == 0, done.stderr
    gone = f"its head (pid {cluster.head.pid} on {socket.gethostname()}) was gone"
    assert f"Cluster {cluster.id} stopped ({gone}" in done.stdout
    assert cluster.record()["state"] == "stopped"
    assert not (cluster.run_dir / ".stop.lock").is_symlink()
    assert (mine / "work").read_text() == "mine\n"
    assert notes.read_text() == "mine\n"
    assert sorted(p.name for p in owner.home.iterdir()) == [".clusterbook", "elsewhere",
                                                             "notes", "victim"]  # fmt: skip
    assert list((owner.home / ".clusterbook" / "clusters").iterdir()) == []


@pytest.fixture
def others_process(other_user: LocalUser) -> Iterator[psutil.Process]:
    """A live process of the other user's: what a dead head's pid can belong to next."""
    marker = f"not-a-head-{os.getpid()}"
    code = f"import time; time.sleep(300)  # {marker}"
    popen = subprocess.Popen(
        other_user.argv([sys.executable, "-c", code], other_user.home),
        env=other_user.env(other_user.home),
    )
    try:
        proc = psutil.Process(popen.pid)  # the same pid once it runs as the user
        _wait(lambda: proc.uids().real == other_user.uid and marker in " ".join(proc.cmdline()))
        yield proc
    finally:
        popen.kill()
        popen.wait(10)


def _ls_state(owner: Owner, cluster_id: str) -> str:
    done = owner.cli("ls")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    (row,) = [r for r in rows if r[0] == cluster_id]
    return row[3]


def test_a_dead_cluster_whose_head_pid_another_process_has_is_stale_and_stops(
    openmpi_python: str, owner: Owner, others_process: psutil.Process
) -> None:
    import clusterbook as cb

    cluster = owner.start(openmpi_python, shared=False)
    owner.kill_head(cluster)
    # The head's pid is another process's now (another user's, started later): a pid alone
    # says the cluster runs.
    record = cluster.record() | {"head_pid": others_process.pid}
    (cluster.run_dir / "cluster.json").write_text(json.dumps(record))
    assert _ls_state(owner, cluster.id) == "stale"
    frame = cb.clusters()
    assert frame.loc[frame["id"] == cluster.id, "state"].tolist() == ["stale"]
    done = owner.cli("stop", cluster.id, "--timeout", "10")
    assert done.returncode == 0, done.stderr
    assert f"its head (pid {others_process.pid} on " in done.stdout
    assert "was gone" in done.stdout
    assert cluster.record()["state"] == "stopped"
    assert list((owner.home / ".clusterbook" / "clusters").iterdir()) == []
    assert others_process.is_running()  # the process that has the pid now is not touched


def test_force_stops_a_cluster_whose_head_cannot_be_verified(
    openmpi_python: str, owner: Owner, others_process: psutil.Process
) -> None:
    cluster = owner.start(openmpi_python, shared=False)
    owner.kill_head(cluster)
    # As an older clusterbook wrote it: a pid, no start time, and that pid runs.
    record = cluster.record() | {"head_pid": others_process.pid}
    for key in ("head_started", "head_program"):
        record.pop(key, None)
    (cluster.run_dir / "cluster.json").write_text(json.dumps(record))
    assert _ls_state(owner, cluster.id) == "running"  # the pid runs: taken at its word
    done = owner.cli("stop", cluster.id, "--timeout", "1")
    assert done.returncode == 1, done.stdout
    assert "did not act on it. If that process is not the cluster's head" in done.stderr
    assert "stopping it with --force cleans what it left here" in done.stderr
    assert "Asking it through its stop file" in done.stderr  # its head is not there to ask
    done = owner.cli("stop", "--force", cluster.id)
    assert done.returncode == 0, done.stderr
    assert f"its head (pid {others_process.pid} on " in done.stdout
    assert "could not be verified" in done.stdout
    assert cluster.record()["state"] == "stopped"
    assert not (cluster.run_dir / "stop").exists()
    assert list((owner.home / ".clusterbook" / "clusters").iterdir()) == []
    assert others_process.is_running()
    assert "--force" in owner.cli("stop", "--help").stdout


def test_without_its_token_file_stop_says_so_and_uses_the_stop_file(
    openmpi_python: str, owner: Owner
) -> None:
    cluster = owner.start(openmpi_python, shared=False)
    (cluster.run_dir / "token").unlink()
    done = owner.cli("stop", str(cluster.run_dir))
    assert done.returncode == 0, done.stderr
    assert f"only with the secret in its token file {cluster.run_dir / 'token'}" in done.stderr
    assert "and this process there is none (it was removed" in done.stderr
    assert f"Asking it through its stop file, {cluster.run_dir / 'stop'}." in done.stderr
    assert "write_secret" not in done.stderr
    assert f"Cluster {cluster.id} stopped (its stop file appeared)" in done.stdout
    _gone, alive = psutil.wait_procs(cluster.processes, timeout=15)
    assert alive == []


# Run as the other user: the mark of its own process sys.argv[1] (what a head writes).
MARK = """\
import json, sys
from clusterbook.head.liveness import process_mark
_state, started, program = process_mark(int(sys.argv[1]))
print(json.dumps({"head_pid": int(sys.argv[1]), "head_started": started, "head_program": program}))
"""


def test_prune_removes_nothing_a_changed_record_names_outside_its_cluster(
    openmpi_python: str, other_user: LocalUser, owner: Owner, others_process: psutil.Process
) -> None:
    cluster = owner.start(openmpi_python)
    owner.kill_head(cluster)
    mine = owner.home / "results"
    mine.mkdir()
    (mine / "model.pt").write_text("weeks of training\n")
    # The other user makes the dead cluster's record look alive (a process of its own as the
    # head, its start time and program too) with a job that ended long ago, in the owner's
    # directory: pruning removes a live cluster's old jobs.
    done = other_user.run_python(MARK, str(others_process.pid))
    assert done.returncode == 0, done.stderr
    job = {"id": "job-0001", "state": "succeeded", "directory": str(mine), "np": 1,
           "argv": ["x"], "started": 1.0, "ended": 2.0}  # fmt: skip
    changes = json.loads(done.stdout) | {"jobs": [job]}
    _as_other(other_user, CHANGE, str(cluster.run_dir), json.dumps(changes))
    done = owner.cli("prune", "--older-than", "1s")
    assert done.returncode == 0, done.stderr
    assert str(mine) not in done.stdout
    assert (mine / "model.pt").read_text() == "weeks of training\n"
    assert _ls_state(owner, cluster.id) == "damaged"  # not read: its job is not in its jobs/
    assert (cluster.run_dir / "cluster.json").exists()  # a damaged record is not pruned either
    # A job directory in its jobs/ that is a link to the owner's: refused the same way.
    (cluster.run_dir / "jobs").chmod(0o777)
    _as_other(other_user, LINK, str(cluster.run_dir / "jobs" / "job-0001"), str(mine))
    job["directory"] = str(cluster.run_dir / "jobs" / "job-0001")
    _as_other(other_user, CHANGE, str(cluster.run_dir), json.dumps({"jobs": [job]}))
    done = owner.cli("prune", "--older-than", "1s")
    assert done.returncode == 0, done.stderr
    assert (mine / "model.pt").read_text() == "weeks of training\n"
    assert _ls_state(owner, cluster.id) == "damaged"
