"""The pure part of a Slurm cluster: its time limit, its batch job, and what Slurm answers.

Nothing here runs a command: :mod:`clusterbook.providers.slurm.commands` runs ``sbatch``,
``squeue``, ``scancel`` and ``scontrol`` with what these functions build, and hands their
output back to them.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
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
    "parse_squeue_jobs",
    "parse_time",
    "render_script",
    "sbatch_argv",
    "step_script",
    "with_directives",
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
    signal: int | None = None  # seconds before the time limit at which Slurm warns
    requeue: bool = False

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
        signal_before: object = None,
        requeue: object = False,
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
        if not isinstance(requeue, bool):
            raise ConfigError(f"requeue must be True or False, got {requeue!r}.")
        return cls(
            nodes=count,
            min_nodes=least,
            slots=per_node,
            partition=partition,  # type: ignore[arg-type]
            time=text,
            account=account,  # type: ignore[arg-type]
            sbatch_args=tuple(sbatch_args),  # type: ignore[arg-type]
            signal=_signal_seconds(signal_before, requeue, text),
            requeue=requeue,
        )

    def more(self) -> BatchJob:
        """The job that adds one node to the cluster: this one's settings, one node."""
        return replace(self, nodes=1, min_nodes=None)

    @property
    def seconds(self) -> float | None:
        """The time limit in seconds (None: unlimited, or the partition's default)."""
        return None if self.time is None else parse_time(self.time)[1]


#: Slurm's warning before the time limit when ``requeue=True`` is given without one.
REQUEUE_SIGNAL = 120


def _signal_seconds(given: object, requeue: bool, time: str | None) -> int | None:
    """``signal_before`` as whole seconds for ``--signal=B:USR1@S`` (Slurm takes 0-65535),
    shorter than the time limit; ``requeue`` without it warns :data:`REQUEUE_SIGNAL` s
    before."""
    limit = None if time is None else parse_time(time)[1]
    if given is None:
        if not requeue:
            return None
        return REQUEUE_SIGNAL if limit is None else min(REQUEUE_SIGNAL, math.ceil(limit / 2))
    seconds = optional_duration(given, "signal_before")
    assert seconds is not None
    whole = math.ceil(seconds)
    if not 1 <= whole <= 65535:
        raise ConfigError(
            f"signal_before={given!r} is out of Slurm's range for --signal: give 1 s to "
            "65535 s (like '2m')."
        )
    if limit is not None and whole >= limit:
        raise ConfigError(
            f"signal_before={given!r} is not shorter than the time limit ({time}): the "
            "warning would come before the job starts; give a shorter signal_before."
        )
    return whole


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
    if job.signal is not None:  # to the batch shell only: it tells the head (the script)
        argv.append(f"--signal=B:USR1@{job.signal}")
    if job.requeue:
        argv.append("--requeue")
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


def render_script(
    agent: Sequence[str], *, cluster: str, slots: int | None, warned: Path | None = None
) -> str:
    """The batch script: one step (``srun``) running :func:`step_script` once on every node.
    ``warned``: the directory where Slurm's warning before the time limit (``--signal=B:USR1``,
    sent to this script's shell only) leaves ``slurm-JOBID.warned`` for the head, which
    forwards the signal to the ranks; the shell then waits for the step again."""
    step = step_script(agent, slots=slots)
    head = (
        "#!/bin/sh\n"
        f"# clusterbook cluster {cluster}: an agent on every node of this job joins its\n"
        "# rendezvous; the job ends when the cluster stops (or at its time limit).\n"
    )
    srun = f"srun --ntasks-per-node=1 --kill-on-bad-exit=0 sh -c {shlex.quote(step)}"
    if warned is None:
        return f"{head}exec {srun}\n"
    marker = f'{shlex.quote(str(warned))}/slurm-"$SLURM_JOB_ID".warned'
    return (
        f"{head}trap 'touch {marker}' USR1\n"
        f"{srun} &\n"
        "step=$!\n"
        "# wait returns early when the trap runs: wait again until the step has ended.\n"
        'while :; do wait "$step"; rc=$?; kill -0 "$step" 2>/dev/null || exit "$rc"; done\n'
    )


def with_directives(script: str, sbatch: Sequence[str]) -> str:
    """``script`` with the options of ``sbatch`` (its argv, as :func:`sbatch_argv` makes it)
    as ``#SBATCH`` lines after its first line: the script as one would submit it by hand
    (``sbatch FILE``), as dask-jobqueue's ``job_script()`` shows it. ``--parsable`` is how
    clusterbook reads the job id, not an option of the job: left out."""
    first, _, rest = script.partition("\n")
    options = [a for a in sbatch[1:-1] if a != "--parsable"]
    directives = "".join(f"#SBATCH {shlex.quote(a)}\n" for a in options)
    return f"{first}\n{directives}{rest}"


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


def parse_squeue_jobs(stdout: str, job_ids: Iterable[int]) -> dict[int, JobState]:
    """The states of ``job_ids`` from ``squeue -h -t all -j ID,ID -o '%i %T %r'`` (GONE:
    not listed)."""
    found = {}
    for line in stdout.splitlines():
        job, _, rest = line.strip().partition(" ")
        if job.isdigit() and rest:
            found[int(job)] = parse_squeue(rest)
    return {i: found.get(i, GONE) for i in job_ids}


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
