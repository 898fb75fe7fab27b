"""Cluster lifecycle and input checks, with a stand-in launcher (no MPI program runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

import clusterbook as cb

OMPI = "mpirun (Open MPI) 5.0.11\n"


@pytest.fixture
def launcher(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "mpirun"
    path.parent.mkdir()
    path.write_text(f"#!/bin/sh\necho '{OMPI}'\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def cluster(launcher: str, tmp_path: Path):
    c = cb.Cluster.local(workers=2, slots=2, launcher=launcher, run_dir=tmp_path / "run")
    yield c
    c.stop()


def test_lifecycle(cluster, tmp_path):
    assert cluster.state == "created"
    assert cluster.status().state.tolist() == ["pending", "pending"]
    with pytest.raises(cb.ClusterStateError, match=r"not started; call cluster.start\(\)"):
        cluster.mpirun(["true"], np=1)
    with pytest.raises(cb.ClusterStateError, match="not started"):
        cluster.wait_ready(timeout=1)
    with cluster as same:
        assert same is cluster
        assert cluster.state == "running"
        cluster.wait_ready(timeout=1)
        assert (tmp_path / "run" / "jobs").is_dir()
        assert (tmp_path / "run").stat().st_mode & 0o077 == 0  # logs are private
        assert cluster.status().state.tolist() == ["joined", "joined"]
        assert repr(cluster).endswith("running: 2 nodes, 4 slots openmpi 5.0.11>")
    assert cluster.state == "stopped"
    cluster.stop()
    with pytest.raises(cb.ClusterStateError, match="stopped; make a new cluster"):
        cluster.start()
    with pytest.raises(cb.ClusterStateError, match="stopped; make a new cluster"):
        cluster.mpirun(["true"], np=1)


def test_stop_runs_on_error_inside_with(cluster):
    with pytest.raises(RuntimeError), cluster:
        raise RuntimeError("user code failed")
    assert cluster.state == "stopped"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"argv": "python train.py"}, cb.ConfigError, r"not the string 'python train.py'"),
        ({"argv": []}, cb.ConfigError, "non-empty list"),
        ({"argv": ["true", 3]}, cb.ConfigError, "3 is not"),
        ({"argv": ["true"], "np": 0}, cb.ConfigError, "np must be >= 1"),
        ({"argv": ["true"], "np": 5}, cb.ConfigError, "np=5 is more than the cluster's 4 slots"),
        ({"argv": ["true"], "env": {"BAD-NAME": "1"}}, cb.ConfigError, "'BAD-NAME' is invalid"),
        ({"argv": ["true"], "env": {"N": 1}}, cb.ConfigError, "pass a string, like N='1'"),
        ({"argv": ["true"], "timeout": 0}, cb.ConfigError, "timeout must be a duration"),
        ({"argv": ["true"], "timeout": -5}, cb.ConfigError, "got -5"),
        ({"argv": ["true"], "cwd": "/no/such/dir"}, cb.ConfigError, "'/no/such/dir' is not a dir"),
        (
            {"argv": ["no-such-program-xyz"]},
            cb.ProgramNotFoundError,
            "'no-such-program-xyz' was not found on PATH",
        ),
        ({"argv": ["/opt/none/prog"]}, cb.ProgramNotFoundError, "'/opt/none/prog' was not found"),
        (
            {"argv": ["python", "trian.py"]},
            cb.ProgramNotFoundError,
            "script 'trian.py' does not exist in",
        ),
    ],
)
def test_bad_job_input_is_refused_before_anything_runs(cluster, kwargs, error, message):
    with cluster:
        with pytest.raises(error, match=message):
            cluster.mpirun(**kwargs)
        assert cluster.jobs == []
        assert not any((cluster.run_dir / "jobs").iterdir())


def test_bad_cluster_input():
    with pytest.raises(cb.ConfigError, match="workers must be >= 1, got 0"):
        cb.Cluster.local(workers=0)
    with pytest.raises(cb.ConfigError, match="slots must be a whole number"):
        cb.Cluster.local(workers=1, slots=2.5)
    with pytest.raises(cb.ConfigError, match="'A B' is invalid"):
        cb.Cluster.local(env={"A B": "x"})


def test_errors_are_cluster_errors():
    assert issubclass(cb.ConfigError, ValueError)
    assert issubclass(cb.LauncherNotFoundError, cb.ConfigError)
    assert issubclass(cb.JobTimeoutError, TimeoutError)
    for exc in (cb.ConfigError, cb.ClusterStateError, cb.JobFailedError, cb.ReadyTimeoutError):
        assert issubclass(exc, cb.ClusterError)


def test_a_relative_python_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cluster = cb.Cluster.local(1, 1, python="venv/bin/python", run_dir=tmp_path / "run")
    assert cluster.python == str(tmp_path / "venv" / "bin" / "python")
    assert cb.Cluster.local(1, 1, python="python3", run_dir=tmp_path / "run").python == "python3"


def test_the_options_every_cluster_takes_are_named_once_below_the_providers() -> None:
    from dataclasses import fields

    from clusterbook.cluster.options import ClusterOptions, ClusterOptionsArgs
    from clusterbook.spec import CLUSTER_OPTIONS

    made = {"id", "own_run_dir"}  # made from the others, never given
    assert {f.name for f in fields(ClusterOptions)} - made == CLUSTER_OPTIONS
    assert ClusterOptionsArgs.__required_keys__ | ClusterOptionsArgs.__optional_keys__ == (
        CLUSTER_OPTIONS
    )
