"""``clusterbook run`` without ``--hosts`` or ``--hostfile`` reads the system it runs in; what
that system says wrong is told, with exit code 2, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterbook.cli.main import main

SYSTEM_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE", "K_MPI_JOB_ROLE",
               "OMPI_MCA_orte_default_hostfile", "HYDRA_HOST_FILE", "I_MPI_HYDRA_HOST_FILE",
               "SM_HOSTS", "CLUSTERBOOK_ENVIRONMENT")  # fmt: skip


@pytest.fixture(autouse=True)
def nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SYSTEM_VARS:
        monkeypatch.delenv(name, raising=False)


def test_a_pbs_nodefile_with_a_bad_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("cn1\ncn1 cpus=2\n")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    assert main(["run", "-n", "1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert f"the PBS nodefile {str(nodefile)!r} line 2: 'cn1 cpus=2' is not 'HOST'" in err
    assert "Traceback" not in err


def test_a_slurm_node_list_that_does_not_expand(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-")
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: expanded here
    assert main(["run", "-n", "1", "--", "true"]) == 2
    assert "SLURM_JOB_NODELIST='n[1-' has an unclosed '['" in capsys.readouterr().err


def test_a_kind_asked_for_and_not_there(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLUSTERBOOK_ENVIRONMENT", "slurm")
    assert main(["run", "-n", "1", "--", "true"]) == 2
    assert "SLURM_JOB_NODELIST is not set" in capsys.readouterr().err


def test_a_hostfile_with_a_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\n\nnode2 slots=two\n")
    assert main(["run", "-n", "1", "--hostfile", str(hostfile), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert f"hostfile {str(hostfile)!r} line 3: 'node2 slots=two'" in err
    assert "'HOST slots=N' (Open MPI) or 'HOST:N' (MPICH)" in err


def test_via_goes_with_an_allocation_found_not_with_hosts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--via", "srun", "--hosts", "n1:2", "-n", "1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "--via says how jobs start in an allocation or job found around this" in err


def test_via_srun_with_an_ssh_option_is_refused_as_the_command_line_spells_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # no scontrol: expanded here
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    assert main(["run", "--via", "srun", "--port", "2222", "-n", "1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert (
        "--port 2222 is an option of clusters reached over ssh; jobs started with --via srun" in err
    )
