"""Cluster.slurm without a Slurm: the batch job it renders, what it reads from squeue, and
how it submits, shows and cancels its job (Slurm's commands answered by FakeSlurm)."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.launch.remote import SrunStep
from clusterbook.providers.base import StartContext
from clusterbook.providers.slurm.batch import (
    GONE,
    BatchJob,
    JobState,
    batch_env,
    controller_address,
    parse_job_id,
    parse_squeue,
    parse_time,
    render_script,
    sbatch_argv,
)
from clusterbook.providers.slurm.steps import StepCheck
from clusterbook.spec import NodeSpec
from clusterbook.testing import FakeSlurm
from tests.sdk.launch.test_command import OMPI


@pytest.mark.parametrize(
    ("given", "text", "seconds"),
    [
        ("1:00:00", "1:00:00", 3600),
        ("90", "90", 5400),  # Slurm: minutes
        ("5:30", "5:30", 330),  # MM:SS
        ("2-12", "2-12", 2 * 86400 + 12 * 3600),
        ("1-0:30", "1-0:30", 86400 + 1800),
        ("1-2:3:4", "1-2:3:4", 86400 + 7200 + 184),
        ("30m", "00:30:00", 1800),
        ("2h", "02:00:00", 7200),
        ("36h", "1-12:00:00", 36 * 3600),
        (90, "00:02:00", 90),  # seconds: Slurm's minutes, rounded up
        ("UNLIMITED", "UNLIMITED", None),
    ],
)
def test_time_limits_in_slurm_and_clusterbook_formats(given, text, seconds):
    assert parse_time(given) == (text, seconds)


@pytest.mark.parametrize("bad", ["soon", "1:2:3:4", "-5", "0", "0:00:00", "", None, True, "1h-2"])
def test_a_time_that_is_no_limit_is_a_config_error_listing_the_formats(bad):
    with pytest.raises(cb.ConfigError, match=r"is n.*'HH:MM:SS'.*'2h'"):
        parse_time(bad)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"nodes": 0}, "nodes must be >= 1"),
        ({"nodes": 2, "min_nodes": 3}, r"min_nodes \(3\) must be at most nodes \(2\)"),
        ({"nodes": 2, "slots": "all"}, "slots must be a whole number"),
        ({"nodes": 2, "partition": "-x"}, "starts with '-'"),
        ({"nodes": 2, "account": 7}, "account must be a name"),
        ({"nodes": 2, "sbatch_args": "--qos=x"}, "sbatch_args must be a list"),
    ],
)
def test_bad_job_arguments_are_config_errors(args, match):
    with pytest.raises(cb.ConfigError, match=match):
        BatchJob.make(**args)


def test_sbatch_gets_one_task_per_node_and_the_users_arguments_last(tmp_path):
    job = BatchJob.make(
        3, min_nodes=2, slots=4, partition="gpu", time="2h", account="proj",
        sbatch_args=["--qos=debug"],
    )  # fmt: skip
    argv = sbatch_argv(job, name="c1", script=tmp_path / "s.sh", output=tmp_path / "o-%j")
    assert argv == [
        "sbatch", "--parsable", "--job-name=clusterbook-c1", "--nodes=2-3",
        "--ntasks-per-node=1", "--time=02:00:00", f"--output={tmp_path}/o-%j",
        "--cpus-per-task=4", "--partition=gpu", "--account=proj", "--qos=debug",
        str(tmp_path / "s.sh"),
    ]  # fmt: skip
    whole = sbatch_argv(BatchJob.make(2), name="c1", script=tmp_path / "s.sh", output=tmp_path)
    assert "--exclusive" in whole
    assert "--nodes=2" in whole


def test_the_script_runs_the_agent_once_per_node_then_removes_its_sshd_files():
    agent = ["/venv/bin/python", "-m", "clusterbook", "worker", "join", "tcp://h:1/c?x=1&y=2"]
    script = render_script(agent, cluster="c1", slots=None)
    assert script.startswith("#!/bin/sh\n")
    srun = shlex.split(script.split("\nexec ", 1)[1])
    assert srun[:5] == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "sh", "-c"]
    step = srun[-1]
    assert shlex.join(agent) in step  # the URL is quoted for the shell, & and all
    assert '--node-id "$node" --slots "${SLURM_CPUS_ON_NODE:-1}"' in step
    assert 'rm -rf "$HOME/.clusterbook/sshd-$node"' in step
    assert "--slots 4" in render_script(agent, cluster="c1", slots=4)


def test_the_step_script_as_sh_runs_it(tmp_path):
    """The step is valid sh: run with a stand-in agent, it passes node id and slots."""
    agent = ["sh", "-c", 'echo "$@" > "$OUT"', "agent"]
    script = render_script(agent, cluster="c1", slots=None)
    step = shlex.split(script.split("\nexec ", 1)[1])[-1]
    home = tmp_path / "home"
    (home / ".clusterbook" / "sshd-n1-7").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "OUT": str(tmp_path / "out")}
    env |= {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "3"}
    subprocess.run(["sh", "-c", step], env=env, check=True)
    assert (tmp_path / "out").read_text() == "--node-id n1-7 --slots 3\n"
    assert not (home / ".clusterbook" / "sshd-n1-7").exists()


def test_what_slurm_prints_is_read():
    assert parse_job_id("42\n") == 42
    assert parse_job_id("42;cluster\n") == 42
    with pytest.raises(ValueError, match="not a job id"):
        parse_job_id("Submitted nothing")
    assert parse_squeue("PENDING PartitionNodeLimit\n") == JobState("PENDING", "PartitionNodeLimit")
    assert parse_squeue("RUNNING None\n") == JobState("RUNNING", None)
    assert parse_squeue("") == GONE
    assert not parse_squeue("CANCELLED None").active
    assert controller_address("X = 1\nSlurmctldHost[0]        = head(10.79.0.1)\n") == "10.79.0.1"
    assert controller_address("SlurmctldHost[0] = ctl1\n") == "ctl1"
    assert controller_address("nothing") is None


def test_the_batch_job_does_not_inherit_the_slurm_job_it_is_submitted_from():
    env = batch_env({"PATH": "/bin", "SLURM_JOB_ID": "3", "SLURM_CONF": "/c", "PMI_RANK": "0"})
    assert env == {"PATH": "/bin", "SLURM_CONF": "/c"}


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm(reason="Priority")


def _cluster(fake: FakeSlurm, tmp_path: Path, **args) -> cb.Cluster:
    return cb.Cluster.slurm(runner=fake, run_dir=tmp_path / "run", poll_interval=0.05, **args)


def test_a_queued_job_shows_a_pending_row_per_node_with_slurms_reason(fake, tmp_path):
    cluster = _cluster(fake, tmp_path, nodes=2, partition="debug")
    with cluster:
        status = cluster.status()
        assert list(status["state"]) == ["pending", "pending"]
        assert set(status["host"]) == {"(queued)"}
        assert set(status["last_reason"]) == {"Slurm job 1 is PENDING (Priority)"}
        with pytest.raises(cb.ReadyTimeoutError, match=r"Slurm job 1 is PENDING \(Priority\)"):
            cluster.wait_ready(timeout=0.3)
        script = (tmp_path / "run" / "slurm-job.sh").read_text()
        assert fake.scripts == [script]
        assert "worker join tcp://" in script.replace("'\"'\"'", "")
        [sbatch] = fake.commands("sbatch")
        assert "--partition=debug" in sbatch
        assert f"--output={tmp_path / 'run' / 'slurm-%j.out'}" in sbatch
    assert fake.commands("scancel") == [["scancel", "1"]]
    assert fake.jobs[1][0] == "CANCELLED"


def test_the_time_limit_is_the_clusters_life_span(fake, tmp_path):
    assert _cluster(fake, tmp_path, time="30m")._options.life_span == 1800
    assert _cluster(fake, tmp_path, time="1:00:00", life_span="10m")._options.life_span == 600
    assert _cluster(fake, tmp_path, time="UNLIMITED")._options.life_span is None


def test_sbatchs_refusal_is_a_config_error_quoting_it_and_nothing_is_left(tmp_path):
    said = "sbatch: error: invalid partition specified: nope"
    cluster = _cluster(FakeSlurm(refuse=said), tmp_path, partition="nope")
    with pytest.raises(cb.ConfigError, match=f"Slurm refused the cluster's job: {said}"):
        cluster.start()
    assert cluster.state == "created"
    assert not (Path.home() / ".clusterbook" / "clusters" / cluster.id / "token").exists()


def test_a_job_that_ends_before_its_nodes_joined_fails_wait_ready_and_is_a_problem(fake, tmp_path):
    with _cluster(fake, tmp_path) as cluster:
        fake.set_state(1, "FAILED", "NonZeroExitCode")
        with pytest.raises(cb.ClusterStateError, match=r"Slurm job 1 is FAILED.*nodes are gone"):
            cluster.wait_ready(timeout=10)
        gone = "Slurm job 1 is FAILED (NonZeroExitCode): its nodes are gone"
        assert gone in (cluster.snapshot().problem or "")
        with pytest.raises(cb.ClusterStateError, match=re.escape(gone)):
            cluster.mpirun(["true"], np=1)  # the same words, not "no nodes yet"
        assert len(cluster.status()) == 0
    assert fake.commands("scancel") == []  # it had ended


def test_a_running_job_whose_agents_are_late_shows_starting_rows(fake, tmp_path):
    with _cluster(fake, tmp_path, nodes=1) as cluster:
        fake.set_state(1, "RUNNING")
        deadline = time.monotonic() + 10
        while cluster.status()["host"].iloc[0] != "(starting)" and time.monotonic() < deadline:
            time.sleep(0.02)  # the watcher's next squeue
        row = cluster.status().iloc[0]
        assert row["host"] == "(starting)"
        assert row["last_reason"] == "Slurm job 1 is RUNNING; its agent has not joined yet"


def test_without_slurm_commands_it_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    cluster = cb.Cluster.slurm(nodes=1, run_dir=tmp_path / "run")
    with pytest.raises(cb.ConfigError, match="Slurm's 'scontrol' is not on PATH"):
        cluster.start()


# -- clusterbook run --slurm: what it refuses before asking Slurm -----------------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--partition", "debug"], "--partition go with --slurm N"),
        (["--time", "1:00", "--account", "a"], "--time, --account go with --slurm N"),
        (["--slurm", "2", "--hosts", "n1:2"], "with --slurm or with --hosts/--hostfile"),
        (["--slurm", "0"], "--slurm must be a number of nodes >= 1, got 0"),
        (["--slurm", "2", "--slots", "gpus"], "--slots gpus does not go with --slurm"),
        (["--slurm", "2", "--time", "soon"], "--time soon is not a time limit"),
    ],
)
def test_clusterbook_run_slurm_refuses_what_does_not_fit(argv, said, capsys):
    from clusterbook.cli.main import main

    assert main(["run", "-n", "2", *argv, "--", "true"]) == 2
    assert said in capsys.readouterr().err


def test_the_widgets_node_table_shows_slurms_reason_beside_pending(fake, tmp_path):
    from clusterbook.views.html import render_nodes

    with _cluster(fake, tmp_path, nodes=2) as cluster:
        html = render_nodes(cluster.snapshot())
    assert html.count('class="cb-pending-reason"') == 2
    assert "Slurm job 1 is PENDING (Priority)" in html


def test_a_start_interrupted_once_the_job_was_submitted_cancels_it(tmp_path):
    class Interrupting(FakeSlurm):
        def _answer(self, argv):  # type: ignore[no-untyped-def]
            if argv[0] == "squeue" and len(self.commands("squeue")) == 1:
                raise KeyboardInterrupt  # the first one, right after sbatch
            return super()._answer(argv)

    slurm = Interrupting()
    cluster = _cluster(slurm, tmp_path, nodes=1)
    with pytest.raises(KeyboardInterrupt):
        cluster.start()
    assert slurm.commands("scancel") == [["scancel", "1"]]
    assert slurm.jobs[1][0] == "CANCELLED"
    assert not (Path.home() / ".clusterbook" / "clusters" / cluster.id).exists()


# -- jobs as steps of the batch job ------------------------------------------------------------


SRUN = "/opt/slurm/bin/srun"  # where the step check finds srun (its which is given)
CTX = StartContext("c1", "/venv/bin/python", OMPI, {})


def _nodes(*names: str) -> tuple[NodeSpec, ...]:
    """Nodes of a round: ``snodeI-JOB`` are the batch job's, others joined by hand."""
    return tuple(NodeSpec(name, f"10.0.0.1{i}", 2) for i, name in enumerate(names, 1))


def _check(fake: FakeSlurm) -> StepCheck:
    return StepCheck(fake, which=lambda name: SRUN if name == "srun" else None)


def test_jobs_of_a_slurm_cluster_are_steps_of_its_job_once_mpi_gets_its_world():
    fake = FakeSlurm()
    check = _check(fake)
    step = check.step(42, CTX, _nodes("snode1-42", "snode2-42"))
    assert step == SrunStep(SRUN, "42", {"10.0.0.11": "snode1", "10.0.0.12": "snode2"})
    checks = fake.commands(SRUN)
    assert len(checks) == 1
    assert "--mpi=pmix" in checks[0]
    assert "--nodelist=snode1,snode2" in checks[0]
    assert check.step(42, CTX, _nodes("snode1-42", "snode2-42")) == step
    assert len(fake.commands(SRUN)) == 1  # checked once
    # Not started, or no job: no step to start jobs in.
    assert check.step(None, CTX, _nodes("snode1-42")) is None
    assert check.step(42, None, _nodes("snode1-42")) is None


def test_a_slurm_cluster_starts_jobs_over_ssh_when_srun_cannot_place_or_start_them(caplog):
    # A node that joined by hand, from outside the job: srun cannot start ranks there.
    fake = FakeSlurm()
    assert _check(fake).step(42, CTX, _nodes("snode1-42", "laptop-1")) is None
    assert fake.commands(SRUN) == []
    # The MPI does not get its world through the plugin: mpirun over ssh, and it says why.
    fake = FakeSlurm(world=1)
    singletons = _check(fake)
    with caplog.at_level("WARNING"):
        assert singletons.step(42, CTX, _nodes("snode1-42", "snode2-42")) is None
    assert "Jobs start with mpirun over ssh, not srun: srun --mpi=pmix started every" in (
        caplog.text
    )
    assert singletons.step(42, CTX, _nodes("snode1-42", "snode2-42")) is None
    assert len([c for c in fake.calls if "--mpi=pmix" in c]) == 1  # not asked again
    # No srun here: mpirun over ssh, saying so.
    missing = StepCheck(FakeSlurm(), which=lambda name: None)
    assert missing.step(42, CTX, _nodes("snode1-42")) is None
    assert missing.failed == "Jobs start with mpirun over ssh, not srun: srun is not on PATH here"
