"""Slurm's commands, run through one injected runner: submit, ask, cancel.

Every command goes through a :data:`SlurmRunner` (by default :func:`run_command`, a
``subprocess.run``), so that unit tests answer them with
:class:`clusterbook.testing.FakeSlurm` instead of a real Slurm. What the commands print is
read by the pure functions of :mod:`clusterbook.providers.slurm.batch`.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.providers.slurm.batch import (
    GONE,
    JobState,
    batch_env,
    controller_address,
    parse_job_id,
    parse_squeue,
    parse_squeue_jobs,
)

__all__ = ["SlurmCommands", "SlurmRunner", "run_command"]

#: Runs one Slurm command (argv, environment, timeout in seconds) and returns how it ended.
SlurmRunner = Callable[
    [Sequence[str], Mapping[str, str], float], "subprocess.CompletedProcess[str]"
]

_TIMEOUT = 30.0


def run_command(
    argv: Sequence[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command here; a missing command or one that hangs is a ClusterError."""
    try:
        return subprocess.run(
            list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise ConfigError(
            f"Slurm's {argv[0]!r} is not on PATH here: Cluster.slurm submits its nodes' job "
            "from a machine with Slurm's client commands (a login node)."
        ) from None
    except subprocess.TimeoutExpired:
        raise ClusterError(
            f"Slurm's {argv[0]} did not answer within {timeout:g} s (is slurmctld up? "
            "'sinfo' says)."
        ) from None


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").strip()


class SlurmCommands:
    """The Slurm commands one cluster uses, through ``runner``."""

    def __init__(self, runner: SlurmRunner | None = None) -> None:
        self._run: SlurmRunner = runner or run_command
        self._env = batch_env(os.environ)

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``srun``) with this environment (no Slurm job's variables)
        and ``env`` over it."""
        return self._run(argv, {**self._env, **env}, timeout)

    def submit(self, argv: Sequence[str]) -> int:
        """Submit with ``argv`` (``sbatch --parsable ...``); sbatch's refusal (an unknown
        partition, a bad time, no such account) is a ConfigError quoting it."""
        done = self._run(argv, self._env, _TIMEOUT)
        if done.returncode != 0:
            raise ConfigError(f"Slurm refused the cluster's job: {_said(done)}")
        try:
            return parse_job_id(done.stdout)
        except ValueError as exc:
            raise ClusterError(f"Could not read the job id sbatch gave: {exc}.") from None

    def state(self, job_id: int) -> JobState:
        """The job's state and reason now (GONE once squeue no longer lists it)."""
        done = self._run(
            ["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T %r"], self._env, _TIMEOUT
        )
        if done.returncode != 0:
            # "Invalid job id specified": purged from slurmctld's memory, so it ended.
            if "Invalid job id" in done.stderr:
                return GONE
            raise ClusterError(f"squeue could not tell the state of job {job_id}: {_said(done)}")
        return parse_squeue(done.stdout)

    def states(self, job_ids: Sequence[int]) -> dict[int, JobState]:
        """The states of several jobs in one ``squeue`` (a cluster of many batch jobs asks
        slurmctld once a look, not once a job)."""
        ids = ",".join(str(i) for i in job_ids)
        done = self._run(
            ["squeue", "-h", "-t", "all", "-j", ids, "-o", "%i %T %r"], self._env, _TIMEOUT
        )
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:  # none of them is known any more
                return dict.fromkeys(job_ids, GONE)
            raise ClusterError(f"squeue could not tell the state of jobs {ids}: {_said(done)}")
        return parse_squeue_jobs(done.stdout, job_ids)

    def cancel(self, job_id: int) -> None:
        """``scancel`` the job (a job that already ended is no error)."""
        done = self._run(["scancel", str(job_id)], self._env, _TIMEOUT)
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise ClusterError(f"scancel {job_id} failed: {_said(done)}")

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue`` the job: Slurm ends what runs and queues it again, same id."""
        done = self._run(["scontrol", "requeue", str(job_id)], self._env, _TIMEOUT)
        if done.returncode != 0:
            raise ClusterError(f"scontrol requeue {job_id} failed: {_said(done)}")

    def wait_ended(
        self,
        job_id: int,
        timeout: float,
        interval: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> JobState:
        """Poll until the job has ended (or ``timeout`` passed); return its last state."""
        deadline = time.monotonic() + timeout
        state = self.state(job_id)
        while state.active and time.monotonic() < deadline:
            sleep(interval)
            state = self.state(job_id)
        return state

    def controller(self) -> str | None:
        """slurmctld's address or name, from ``scontrol show config`` (None: not said)."""
        done = self._run(["scontrol", "show", "config"], self._env, _TIMEOUT)
        return controller_address(done.stdout) if done.returncode == 0 else None


def write_script(path: Path, text: str) -> None:
    """Write the batch script (0700: it names the token file, not the token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o700)
