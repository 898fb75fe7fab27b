"""What an attempt writes in its directory when it starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterbook.errors import RunDirError
from clusterbook.launch.command import LaunchCommand, LaunchPlan
from clusterbook.launch.flavour import Launcher, MPIFlavour
from clusterbook.launch.jobdir import write_attempt_files
from clusterbook.spec import NodeSpec

MPICH = Launcher(path="/opt/mpich/bin/mpiexec", flavour=MPIFlavour.MPICH, version="4.2.3")
OMPI = Launcher(path="/opt/mpi/bin/mpirun", flavour=MPIFlavour.OPENMPI, version="5.0.11")


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
