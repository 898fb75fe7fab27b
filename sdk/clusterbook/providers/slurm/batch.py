"""The pure part of a Slurm cluster: its time limit, its batch job, and what Slurm answers.

Nothing here runs a command: :mod:`clusterbook.providers.slurm.commands` runs ``sbatch``,
``squeue``, ``scancel`` and ``scontrol`` with what these functions build, and hands their
output back to them.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterbook.durations import optional_duration
from clusterbook.errors import ConfigError
from clusterbook.spec import validate_host, validate_positive_int
from clusterbook.wording import spell_or

__all__ = [
    "ACTIVE_STATES",
    "BatchJob",
    "JobState",
    "batch_env",
    "controller_address",
    "parse_job_id",
    "parse_squeue",
    "parse_time",
    "render_script",
    "sbatch_argv",
    "step_script",
]

#: States of a job that holds (or waits for) its nodes; any other state is an end.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "RESIZING",
        "SUSPENDED",
        "STAGE_OUT",
        "SIGNALING",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "STOPPED",
    }
)

_FORMATS = (
    "'MM', 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS' (Slurm's), seconds, a "
    "datetime.timedelta, or text like '30m', '2h' or '1h30m'"
)
_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def parse_time(value: object) -> tuple[str, float | None]:
    """A job's time limit as ``(text for sbatch --time, seconds)``; seconds is None for
    ``"UNLIMITED"``. Takes Slurm's formats (``"1:00:00"``, ``"2-12"``, ``"90"`` minutes),
    a number of seconds, or clusterbook's durations (``"30m"``, ``"2h"``)."""
    if value is None:
        raise ConfigError(
            f"{spell_or('time', None, 'No time')} is not a time limit; give {_FORMATS}."
        )
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in ("UNLIMITED", "INFINITE"):
            return "UNLIMITED", None
        match = _SLURM_TIME.fullmatch(text)
        if match:
            return text, _slurm_seconds(match)
        if not re.fullmatch(r"[0-9.smhdw ]+", text.lower()):
            raise ConfigError(f"{_time(value)} is not a time limit; give {_FORMATS}.")
    try:
        seconds = optional_duration(value, "time")
    except ConfigError:
        raise ConfigError(f"{_time(value)} is not a time limit; give {_FORMATS}.") from None
    assert seconds is not None
    return _as_slurm(seconds), seconds


def _time(value: object) -> str:
    """The time limit ``value`` as it was given, in the interface that gave it."""
    return spell_or("time", value, f"The time limit {value!r}")


def _slurm_seconds(match: re.Match[str]) -> float:
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, secs = int(first), int(second or 0), int(third or 0)
        total = int(days) * 86400 + hours * 3600 + minutes * 60 + secs
    elif third is not None:  # HH:MM:SS
        total = int(first) * 3600 + int(second) * 60 + int(third)
    else:  # MM[:SS]
        total = int(first) * 60 + int(second or 0)
    if total <= 0:
        raise ConfigError(f"{_time(match.group(0))} is no time at all; give {_FORMATS}.")
    return float(total)


def _as_slurm(seconds: float) -> str:
    """``seconds`` as Slurm's ``D-HH:MM:SS`` (whole minutes, rounded up: Slurm's unit)."""
    total = math.ceil(seconds / 60) * 60
    days, rest = divmod(total, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:00"
    return f"{days}-{text}" if days else text


@dataclass(frozen=True, slots=True)
class BatchJob:
    """What the cluster's one batch job asks Slurm for (checked when made)."""

    nodes: int
    min_nodes: int | None = None
    slots: int | None = None
    partition: str | None = None
    time: str | None = "1:00:00"  # None: the partition's default
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()

    @classmethod
    def make(
        cls,
        nodes: object,
        *,
        min_nodes: object = None,
        slots: object = None,
        partition: object = None,
        time: object = "1:00:00",
        account: object = None,
        sbatch_args: object = (),
    ) -> BatchJob:
        count = validate_positive_int(nodes, "nodes")
        least = None if min_nodes is None else validate_positive_int(min_nodes, "min_nodes")
        if least is not None and least > count:
            raise ConfigError(
                f"min_nodes ({least}) must be at most nodes ({count}): the job starts with at "
                "least min_nodes and at most nodes nodes."
            )
        per_node = None if slots is None else validate_positive_int(slots, "slots")
        for name, given in (("partition", partition), ("account", account)):
            if given is not None:
                if not isinstance(given, str):
                    raise ConfigError(f"{name} must be a name, got {given!r}.")
                validate_host(given)  # a plain name, never read as an option
        text = None if time is None else parse_time(time)[0]
        if isinstance(sbatch_args, str) or not all(isinstance(a, str) for a in sbatch_args):  # type: ignore[attr-defined]
            raise ConfigError(
                f"sbatch_args must be a list of sbatch's arguments, like ['--qos=debug'], "
                f"got {sbatch_args!r}."
            )
        return cls(
            nodes=count,
            min_nodes=least,
            slots=per_node,
            partition=partition,  # type: ignore[arg-type]
            time=text,
            account=account,  # type: ignore[arg-type]
            sbatch_args=tuple(sbatch_args),  # type: ignore[arg-type]
        )

    @property
    def seconds(self) -> float | None:
        """The time limit in seconds (None: unlimited, or the partition's default)."""
        return None if self.time is None else parse_time(self.time)[1]


def sbatch_argv(job: BatchJob, *, name: str, script: Path, output: Path) -> list[str]:
    """``sbatch`` submitting ``script`` for ``job``: one task a node, whole nodes unless
    ``slots`` says how many CPUs each node gives; the user's ``sbatch_args`` last (they win)."""
    nodes = f"{job.min_nodes}-{job.nodes}" if job.min_nodes else str(job.nodes)
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name=clusterbook-{name}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--output={output}",
    ]
    if job.time is not None:
        argv.insert(5, f"--time={job.time}")
    argv.append("--exclusive" if job.slots is None else f"--cpus-per-task={job.slots}")
    if job.partition:
        argv.append(f"--partition={job.partition}")
    if job.account:
        argv.append(f"--account={job.account}")
    return [*argv, *job.sbatch_args, str(script)]


def step_script(agent: Sequence[str], *, slots: int | None, home_dir: str = ".clusterbook") -> str:
    """What runs on every node of the job: the agent (``agent``: its argv, without node id
    and slots), then the removal of its sshd's files. The node id is the node's name and the
    job id (``snode1-42``); slots are the node's CPUs in the job unless given."""
    count = str(slots) if slots is not None else '"${SLURM_CPUS_ON_NODE:-1}"'
    return "\n".join(
        [
            'node="${SLURMD_NODENAME:-$(hostname)}-${SLURM_JOB_ID}"',
            # scancel's SIGTERM reaches every process of the step: the agent stops its sshd
            # and ranks, and this shell lives on to remove their files.
            "trap : TERM INT HUP",
            f'{shlex.join(agent)} --node-id "$node" --slots {count}',
            "rc=$?",
            f'rm -rf "$HOME/{home_dir}/sshd-$node"',
            'exit "$rc"',
        ]
    )


def render_script(agent: Sequence[str], *, cluster: str, slots: int | None) -> str:
    """The batch script: one step (``srun``) running :func:`step_script` once on every node."""
    step = step_script(agent, slots=slots)
    return (
        "#!/bin/sh\n"
        f"# clusterbook cluster {cluster}: an agent on every node of this job joins its\n"
        "# rendezvous; the job ends when the cluster stops (or at its time limit).\n"
        f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 sh -c {shlex.quote(step)}\n"
    )


def batch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment sbatch passes on: this one, without the variables of a Slurm job
    this process may run in (they would describe that job, not the new one)."""
    keep = ("SLURM_CONF",)
    return {
        k: v
        for k, v in environ.items()
        if k in keep or not (k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PMI_")))
    }


def parse_job_id(stdout: str) -> int:
    """The job id ``sbatch --parsable`` printed (``42`` or ``42;cluster``)."""
    first = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    text = first.split(";")[0]
    if not text.isdigit():
        raise ValueError(f"sbatch printed {stdout.strip()!r}, not a job id")
    return int(text)


@dataclass(frozen=True, slots=True)
class JobState:
    """A batch job as squeue says: its state (``PENDING``), and why (``Resources``;
    ``None`` when there is no reason)."""

    state: str
    reason: str | None = None

    @property
    def active(self) -> bool:
        """Whether the job holds or waits for its nodes."""
        return self.state in ACTIVE_STATES

    def describe(self, job_id: int) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"Slurm job {job_id} is {self.state}{why}"


#: What a job that squeue no longer lists is taken to be.
GONE = JobState("GONE")


def parse_squeue(stdout: str) -> JobState:
    """The job's state from ``squeue -h -t all -j ID -o '%T %r'`` (GONE: not listed)."""
    line = stdout.strip().splitlines()[0] if stdout.strip() else ""
    if not line:
        return GONE
    state, _, reason = line.partition(" ")
    reason = reason.strip()
    return JobState(state, None if reason in ("", "None", "(null)") else reason)


def controller_address(config: str) -> str | None:
    """The address (or name) of the first slurmctld in ``scontrol show config``'s output:
    ``SlurmctldHost[0] = head(10.79.0.1)`` gives ``10.79.0.1``, ``= ctl1`` gives ``ctl1``."""
    for line in config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("SlurmctldHost[0]", "ControlMachine", "ControlAddr"):
            value = value.strip()
            match = re.fullmatch(r"([^()\s]+)(?:\(([^()\s]+)\))?", value)
            if match:
                return match.group(2) or match.group(1)
    return None
