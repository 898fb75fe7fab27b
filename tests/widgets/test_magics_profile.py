"""``%cluster profile NAME``: the cluster of a profile, started for real, or a clear word why
not (the config directory named by ``CLUSTERBOOK_CONFIG``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.utils.capture import capture_output

from clusterbook.config import FILE_NAME
from clusterbook_widgets.arguments import parse_cluster_args
from clusterbook_widgets.magics import ClusterMagics
from tests.widgets import test_magics

ip, magics = test_magics.ip, test_magics.magics  # the fixtures of the %cluster tests


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openmpi_python: str) -> Path:
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    (directory / FILE_NAME).write_text(
        f'[profiles.pair]\nkind = "local"\nworkers = 2\nslots = 1\npython = "{openmpi_python}"\n'
        'name = "from-profile"\nenv = { GREETING = "from the profile" }\n'
    )
    monkeypatch.setenv("CLUSTERBOOK_CONFIG", str(directory))
    return directory


def said(ip, line: str) -> str:  # type: ignore[no-untyped-def]
    """What ``%cluster LINE`` said of its failure: on stderr, or as the error it raised."""
    with capture_output() as out:
        try:
            ip.run_line_magic("cluster", line)
        except Exception as exc:  # a magic that raises says it in the error
            return str(exc)
    return out.stderr


def test_the_profile_command_takes_a_name() -> None:
    assert parse_cluster_args("profile lab").name == "lab"


@pytest.mark.mpi
def test_cluster_profile_starts_the_profile_s_cluster(
    ip, magics: ClusterMagics, config: Path
) -> None:  # type: ignore[no-untyped-def]
    with capture_output() as out:
        ip.run_line_magic("cluster", "profile pair")
    cluster = magics.cluster
    assert cluster is not None
    assert out.stdout == f"Started {cluster!r}.\n"
    assert cluster.state == "running"
    assert cluster.name == "from-profile"
    assert [n.slots for n in cluster.nodes] == [1, 1]
    with capture_output() as out:
        ip.run_cell_magic("mpirun", "-n 2", "import os\nprint(os.environ['GREETING'])")
    assert sorted(out.stdout.splitlines()) == ["[0] from the profile", "[1] from the profile"]


def test_cluster_profile_of_a_missing_one_lists_those_there_are(
    ip, magics: ClusterMagics, config: Path
) -> None:  # type: ignore[no-untyped-def]
    text = said(ip, "profile pairs")
    assert "No profile 'pairs': the profiles in" in text
    assert "are 'pair'. Did you mean 'pair'?" in text
    assert "Traceback" not in text
    assert magics.cluster is None
