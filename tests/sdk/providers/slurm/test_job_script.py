"""``cluster.job_script()``: a Slurm cluster's batch script as ``start()`` submits it, its
sbatch options as ``#SBATCH`` lines, before and after ``start()`` (Slurm's commands answered
by FakeSlurm)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.providers.slurm.batch import with_directives
from clusterbook.testing import FakeProvider, FakeSlurm


def _directives(script: str) -> list[str]:
    return [shlex.split(line)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


def _without_directives(script: str) -> str:
    return "".join(line for line in script.splitlines(True) if not line.startswith("#SBATCH "))


def test_sbatchs_options_become_directives_after_the_first_line() -> None:
    argv = ["sbatch", "--parsable", "--nodes=2", "--comment=a b", "/run/slurm-job.sh"]
    text = with_directives("#!/bin/sh\n# what runs\nexec srun x\n", argv)
    assert text == (
        "#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH '--comment=a b'\n# what runs\nexec srun x\n"
    )


def test_before_start_it_shows_the_job_with_placeholders_for_what_start_makes(
    tmp_path: Path,
) -> None:
    fake = FakeSlurm()
    cluster = cb.Cluster.slurm(
        nodes=2, time="30m", partition="debug", runner=fake, run_dir=tmp_path / "run"
    )
    script = cluster.job_script()
    assert script.startswith("#!/bin/sh\n#SBATCH --job-name=clusterbook-")
    assert _directives(script)[1:] == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=00:30:00",
        f"--output={tmp_path / 'run' / 'slurm-%j.out'}",
        "--exclusive",
        "--partition=debug",
    ]
    assert "<URL: start() makes it>" in script
    assert "<TOKEN_FILE: start() makes it>" in script
    assert "exec srun --ntasks-per-node=1" in script
    assert fake.commands("sbatch") == []  # a dry run: nothing submitted
    assert not (tmp_path / "run" / "slurm-job.sh").exists()


def test_once_started_it_is_the_script_and_the_options_submitted(tmp_path: Path) -> None:
    fake = FakeSlurm(reason="Priority")
    cluster = cb.Cluster.slurm(
        nodes=2, slots=4, runner=fake, run_dir=tmp_path / "run", poll_interval=0.05
    )
    with cluster:
        script = cluster.job_script()
        (sbatch,) = fake.commands("sbatch")
        written = (tmp_path / "run" / "slurm-job.sh").read_text()
    assert _without_directives(script) == written
    assert _directives(script) == [a for a in sbatch[1:-1] if a != "--parsable"]
    assert f"--job-name=clusterbook-{cluster.id}" in _directives(script)
    assert "start() makes it" not in script


def test_kinds_that_submit_no_batch_job_say_so() -> None:
    with pytest.raises(cb.ConfigError, match=r"a fake cluster submits none"):
        cb.Cluster(FakeProvider(nodes=1)).job_script()
    with pytest.raises(cb.ConfigError, match=r"Slurm cluster \(Cluster.slurm\)"):
        cb.Cluster.local(1).job_script()


def test_an_attached_handle_shows_the_script_its_head_submitted(tmp_path: Path) -> None:
    """Through the head's control socket, as for a detached cluster's supervisor."""
    fake = FakeSlurm(reason="Priority")
    cluster = cb.Cluster.slurm(
        nodes=2, slots=4, runner=fake, run_dir=tmp_path / "run", poll_interval=0.05
    )
    with cluster, cb.Cluster.attach(cluster.run_dir) as handle:
        script = handle.job_script()
        written = (tmp_path / "run" / "slurm-job.sh").read_text()
        assert script == cluster.job_script()
    assert _without_directives(script) == written
    assert f"--job-name=clusterbook-{cluster.id}" in _directives(script)


def test_an_attached_handle_on_a_kind_that_submits_none_says_so(tmp_path: Path) -> None:
    options = ClusterOptions.make("fake", run_dir=tmp_path / "run")
    with (
        cb.Cluster(FakeProvider(nodes=1), options) as cluster,
        cb.Cluster.attach(cluster.run_dir) as handle,
        pytest.raises(cb.ConfigError, match=r"a fake cluster submits none"),
    ):
        handle.job_script()
