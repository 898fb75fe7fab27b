"""Where a cluster's jobs keep their files: the run directory, a job's numbered directory, and
what an attempt writes there when it starts."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from clusterbook.errors import RunDirError
from clusterbook.launch.command import LaunchCommand, LaunchPlan
from clusterbook.launch.flavour import Launcher, MPIFlavour
from clusterbook.launch.jobdir import make_run_dir, new_job_dir, write_attempt_files
from clusterbook.spec import NodeSpec

MPICH = Launcher(path="/opt/mpich/bin/mpiexec", flavour=MPIFlavour.MPICH, version="4.2.3")
OMPI = Launcher(path="/opt/mpi/bin/mpirun", flavour=MPIFlavour.OPENMPI, version="5.0.11")


def test_the_run_directory_is_private_and_has_its_jobs(tmp_path: Path) -> None:
    run_dir = tmp_path / "a" / "run"
    make_run_dir(run_dir)
    make_run_dir(run_dir)  # again: nothing changes
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert (run_dir / "jobs").is_dir()


def test_a_run_directory_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match=str(tmp_path / "file" / "run")):
        make_run_dir(tmp_path / "file" / "run")


def test_a_first_job_is_numbered_after_every_job_before_it(tmp_path: Path) -> None:
    assert new_job_dir(tmp_path, 0) == ("job-0001", tmp_path / "jobs" / "job-0001")
    (tmp_path / "jobs" / "job-0007").mkdir()  # another process's
    (tmp_path / "jobs" / "job-99").mkdir()  # not a job's name: not counted
    job_id, directory = new_job_dir(tmp_path, 0)
    assert job_id == "job-0008"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_a_later_job_follows_the_heads_last_one_and_a_taken_number_is_skipped(
    tmp_path: Path,
) -> None:
    (tmp_path / "jobs" / "job-0009").mkdir(parents=True)  # another process's
    assert new_job_dir(tmp_path, 3)[0] == "job-0004"  # the head's own count, no listing
    assert new_job_dir(tmp_path, 20)[0] == "job-0021"
    (tmp_path / "jobs" / "job-0030").mkdir()  # taken meanwhile
    assert new_job_dir(tmp_path, 21)[0] == "job-0022"
    assert new_job_dir(tmp_path, 29)[0] == "job-0031"  # after every job, once it collides


def _plan(launcher: Launcher, folder: Path) -> LaunchPlan:
    return LaunchPlan(
        launcher=launcher,
        nodes=(NodeSpec("local-0", "localhost", 2),),
        np=2,
        argv=("/usr/bin/python3", "train.py"),
        env={},
        hostfile=str(folder / "hostfile"),
        output_dir=str(folder / "raw"),
        job_token="c1-abc",  # noqa: S106 - a job token, not a secret
    )


def test_an_attempt_writes_its_hostfile_and_what_it_runs(tmp_path: Path) -> None:
    command = LaunchCommand(argv=["mpiexec", "-n", "2"], env={}, hostfile_text="localhost:2\n")
    plan = _plan(MPICH, tmp_path)
    write_attempt_files(tmp_path, "job-0003", 2, plan, command, {0: "here", 1: "here"})
    assert (tmp_path / "hostfile").read_text() == "localhost:2\n"
    written = json.loads((tmp_path / "job.json").read_text())
    assert written.pop("started") > 0
    assert written == {
        "id": "job-0003",
        "attempt": 2,
        "argv": ["/usr/bin/python3", "train.py"],
        "np": 2,
        "launcher": "/opt/mpich/bin/mpiexec",
        "flavour": "mpich",
        "launcher_argv": ["mpiexec", "-n", "2"],
        "hosts": {"0": "here", "1": "here"},
        "token": "c1-abc",
    }
    assert (tmp_path / "raw").is_dir()  # where Hydra writes each rank's streams


def test_only_mpich_gets_a_directory_for_the_ranks_output(tmp_path: Path) -> None:
    command = LaunchCommand(argv=["mpirun"], env={}, hostfile_text="")
    write_attempt_files(tmp_path, "job-0001", 1, _plan(OMPI, tmp_path), command, {})
    assert not (tmp_path / "raw").exists()


def test_an_attempt_that_cannot_write_names_the_file(tmp_path: Path) -> None:
    command = LaunchCommand(argv=["mpirun"], env={}, hostfile_text="")
    gone = tmp_path / "gone"
    with pytest.raises(RunDirError, match=str(gone / "hostfile")):
        write_attempt_files(gone, "job-0001", 1, _plan(OMPI, gone), command, {})
