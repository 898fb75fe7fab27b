"""``%cluster env``: the nodes of the system the kernel runs in, or an error saying why not."""

from __future__ import annotations

import pytest

import clusterbook as cb
from clusterbook_widgets.magics import ClusterMagics
from tests.widgets import test_magics

ip, magics = test_magics.ip, test_magics.magics  # the fixtures of the %cluster tests

SYSTEM_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE", "K_MPI_JOB_ROLE",
               "OMPI_MCA_orte_default_hostfile", "HYDRA_HOST_FILE", "SM_HOSTS")  # fmt: skip


def test_env_via_srun_outside_slurm_says_so_as_the_magic_spells_it(
    ip, magics: ClusterMagics, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    for name in SYSTEM_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("CLUSTERBOOK_ENVIRONMENT", raising=False)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("cn01\ncn01\n")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    with pytest.raises(cb.ConfigError) as raised:
        ip.run_line_magic("cluster", "env --via srun")
    said = str(raised.value)
    assert said.startswith(
        "--via srun starts jobs as steps of a Slurm allocation, but the nodes are a pbs job's"
    )
    assert said.endswith("use --via ssh.")
    assert magics.cluster is None


def test_env_outside_any_system_says_what_it_looked_for(
    ip, magics: ClusterMagics, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    for name in SYSTEM_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLUSTERBOOK_ENVIRONMENT", "none")
    with pytest.raises(cb.EnvironmentNotFoundError) as raised:
        ip.run_line_magic("cluster", "env")
    assert str(raised.value).startswith("No scheduler or launcher environment was found")
    assert "SLURM_JOB_NODELIST" in str(raised.value)
    assert magics.cluster is None


def test_env_on_a_sagemaker_worker_host_says_it_is_one(
    ip, magics: ClusterMagics, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("CLUSTERBOOK_ENVIRONMENT", raising=False)
    monkeypatch.setenv("SM_HOSTS", '["algo-1", "algo-2"]')
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-2")
    with pytest.raises(cb.WorkerHostError, match=r"^This host \(algo-2\) is a worker of the sag"):
        ip.run_line_magic("cluster", "env sagemaker")
    assert magics.cluster is None
