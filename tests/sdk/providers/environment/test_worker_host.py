"""A worker host of a training job (``clusterbook worker serve``): what it decides at each look,
the sshd it starts for each system, and the status the leader's cluster leaves for it (the node
tasks, in a home of the test's own). Served for real on fake hosts:
tests/integration/test_environment_hosts.py."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.nodes.tasks.install import cleanup, install, status
from clusterbook.providers.environment.detect import detect_environment
from clusterbook.providers.environment.worker import SshdPlan, Watch, sshd_plan, step

SAGEMAKER = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}
READY = {"cluster": "ssh-1", "state": "ready"}
DONE = {"cluster": "ssh-1", "state": "done"}


def look(
    watch: Watch, status: dict[str, str] | None, agent: bool, now: float
) -> tuple[Watch, str | None, str | None]:
    return step(watch, status, agent, now, lease=10.0, wait=600.0, leader="algo-1")


# -- what it decides ----------------------------------------------------------------------------


def test_it_waits_for_the_leaders_cluster_until_the_wait_is_over() -> None:
    watch = Watch(started=100.0)
    assert look(watch, None, False, 700.0) == (watch, None, None)
    _, done, lost = look(watch, None, False, 700.5)
    assert done is None
    assert lost is not None
    assert "no cluster of the leader (algo-1) reached this host within 600 s" in lost


def test_done_ends_it_whatever_the_agent() -> None:
    for agent in (True, False):
        assert look(Watch(0.0, heard=1.0), DONE, agent, 5000.0)[1:] == ("ssh-1", None)


def test_while_the_clusters_agent_runs_the_leader_is_there() -> None:
    watch, done, lost = look(Watch(0.0), READY, True, 9000.0)  # long past the wait: it came
    assert (watch.heard, done, lost) == (9000.0, None, None)


def test_without_the_agent_the_leader_has_the_lease_to_say_done() -> None:
    watch = Watch(0.0, heard=50.0)
    assert look(watch, READY, False, 60.0) == (watch, None, None)
    _, done, lost = look(watch, READY, False, 60.5)
    assert done is None
    assert lost is not None
    assert lost.startswith("the leader (algo-1) is gone: the agent of its cluster ssh-1 here")
    assert "within 10 s" in lost


def test_the_lease_counts_from_the_status_when_no_agent_was_seen() -> None:
    watch, _, lost = look(Watch(0.0), READY, False, 300.0)
    assert (watch.heard, lost) == (300.0, None)
    assert look(watch, READY, False, 310.5)[2] is not None


# -- its sshd, for each system ------------------------------------------------------------------


def test_a_sagemaker_worker_serves_on_the_port_the_leader_uses() -> None:
    found = detect_environment(environ=SAGEMAKER)
    assert sshd_plan(found, None) == SshdPlan(22)  # the leader's clusterbook: ssh's default
    assert sshd_plan(found, 2222) == SshdPlan(2222)
    with pytest.raises(cb.ConfigError, match="port"):
        sshd_plan(found, 70000)


def test_an_mpijob_worker_lets_the_job_key_in_and_shows_it_as_host_key(tmp_path: Path) -> None:
    mount = tmp_path / "mnt/ssh"
    mount.mkdir(parents=True)
    for name in ("id_rsa", "id_rsa.pub", "authorized_keys"):
        (mount / name).write_text("ecdsa-sha2-nistp521 AAAA job\n")
    env = {"K_MPI_JOB_ROLE": "worker", "CLUSTERBOOK_SSH_AUTH_MOUNT_PATH": "/mnt/ssh"}
    found = detect_environment(environ=env, root=tmp_path)  # a worker pod has no hostfile
    assert (found.role, found.hosts) == ("worker", [])
    assert sshd_plan(found, None) == SshdPlan(
        2222, more_keys=(str(mount / "authorized_keys"),), host_key=str(mount / "id_rsa")
    )
    bare = detect_environment(environ={"K_MPI_JOB_ROLE": "worker"}, root=tmp_path / "none")
    assert sshd_plan(bare, None) == SshdPlan(2222)  # no key mounted: the home's keys only


def test_the_leader_host_is_told_to_build_the_cluster(tmp_path: Path) -> None:
    env = {**SAGEMAKER, "SM_CURRENT_HOST": "algo-1"}
    with pytest.raises(cb.ConfigError, match=r"This host \(algo-1\) leads the sagemaker job"):
        cb.serve_worker(environ=env, root=tmp_path)
    with pytest.raises(cb.ConfigError, match="lease must be a duration > 0, got 0"):
        cb.serve_worker(environ=SAGEMAKER, root=tmp_path, lease=0)
    with pytest.raises(cb.EnvironmentNotFoundError):
        cb.serve_worker(environ={}, root=tmp_path)


# -- the status the leader's cluster leaves ------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def served(home: Path) -> Path:
    return home / ".clusterbook" / f"worker-{socket.gethostname()}" / "status.json"


def test_the_status_reaches_a_worker_only_where_one_serves(home: Path) -> None:
    install({"cluster_id": "ssh-1", "files": {}})
    assert status({"cluster_id": "ssh-1", "status": READY}) == {"served": False}
    assert json.loads((home / ".clusterbook/clusters/ssh-1/status.json").read_text()) == READY
    assert not served(home).parent.exists()  # nothing made on a host no worker serves
    served(home).parent.mkdir(parents=True)
    assert status({"cluster_id": "ssh-1", "status": READY}) == {"served": True}
    assert json.loads(served(home).read_text()) == READY


def test_done_outlives_the_clusters_directory(home: Path) -> None:
    install({"cluster_id": "ssh-1", "files": {}})
    served(home).parent.mkdir(parents=True)
    reply = cleanup({"cluster_id": "ssh-1", "tag": None, "grace": 0.1, "status": DONE})
    assert (reply["dir_removed"], reply["served"]) == (True, True)
    assert json.loads(served(home).read_text()) == DONE
    # A clean-up that brings no status (clusterbook cleanup) leaves no word.
    served(home).unlink()
    install({"cluster_id": "ssh-2", "files": {}})
    assert cleanup({"cluster_id": "ssh-2", "tag": None, "grace": 0.1})["served"] is False
    assert not served(home).exists()
