"""Where a cluster's jobs keep their files: the cluster's run directory and its ``jobs/``, a
job's directory there, numbered after every job before it, and what each attempt writes there
when it starts: the hostfile its launcher reads and ``job.json``, what it runs (which
:class:`~clusterbook.launch.saved.SavedJob` reads back). A retry's attempt writes them in
``attempt-N/``; its logs go beside them (:mod:`clusterbook.launch.logstore`)."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path

from clusterbook.errors import RunDirError
from clusterbook.launch.command import LaunchCommand, LaunchPlan
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.result import JobResult
from clusterbook.nodes.tasks.common import write_atomic

__all__ = [
    "attempt_dir",
    "job_number",
    "make_run_dir",
    "new_job_dir",
    "write_attempt_files",
    "write_result",
]

_log = logging.getLogger("clusterbook.job")
_JOB_RE = re.compile(r"job-\d{4,}")


def attempt_dir(directory: Path, number: int) -> Path:
    """Where attempt ``number`` of the job in ``directory`` keeps its files."""
    return directory if number == 1 else directory / f"attempt-{number}"


def write_result(directory: Path, result: JobResult) -> None:
    """Write ``result`` to ``directory/result.json``, in one step (another process, an
    attached handle, may read it at any time); a failure is logged, not raised: the job's end
    must not wait on its disk."""
    try:
        data = json.dumps(result.to_dict(), indent=2).encode()
        write_atomic(str(directory / "result.json"), data, 0o600)
    except OSError as exc:
        _log.warning("Could not write the result of job %s: %s", result.job_id, exc)


def make_run_dir(run_dir: Path) -> None:
    """Make a cluster's run directory (0700: logs are private) and its ``jobs/``."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (run_dir / "jobs").mkdir(exist_ok=True)
    except OSError as exc:
        raise RunDirError.from_os_error(run_dir, exc) from exc


def new_job_dir(run_dir: Path, after: int) -> tuple[str, Path]:
    """The next job's id and directory, made now. ``after``: the number of the last job this
    head made, whose successor is tried first; 0 before its first job, which is numbered after
    every job already in ``run_dir`` (one used before, or by another process). A number taken
    meanwhile sends it to the same count (a job start need not list every job of a long
    session)."""
    jobs = run_dir / "jobs"
    number = after + 1 if after > 0 else _after_every_job(jobs, 0)
    while True:
        job_id = f"job-{number:04d}"
        try:
            (jobs / job_id).mkdir(parents=True, mode=0o700)
        except FileExistsError:
            number = _after_every_job(jobs, number)
            continue
        except OSError as exc:
            raise RunDirError.from_os_error(jobs / job_id, exc) from exc
        return job_id, jobs / job_id


def job_number(job_id: str) -> int:
    """The number in a job's id (``job-0042``: 42), 0 for an id of another form."""
    return int(job_id[4:]) if _JOB_RE.fullmatch(job_id) else 0


def _after_every_job(jobs: Path, taken: int) -> int:
    """The number after ``taken`` and after every job in ``jobs``."""
    try:
        found = [int(p.name[4:]) for p in jobs.iterdir() if _JOB_RE.fullmatch(p.name)]
    except OSError:
        found = []
    return max(taken, *found, 0) + 1


def write_attempt_files(
    directory: Path,
    job_id: str,
    number: int,
    plan: LaunchPlan,
    command: LaunchCommand,
    hosts: Mapping[int, str],
) -> None:
    """Write what attempt ``number`` of job ``job_id`` runs into its ``directory``: the
    launcher's hostfile and ``job.json`` (``hosts``: each rank's host as known before it
    starts), and make the directory MPICH writes the ranks' output to."""
    job_file = {
        "id": job_id,
        "attempt": number,
        "argv": list(plan.argv),
        "np": plan.np,
        "launcher": plan.launcher.path,
        "flavour": plan.launcher.flavour.value,
        "launcher_argv": command.argv,
        "started": time.time(),
        "hosts": {str(rank): host for rank, host in hosts.items()},
        "token": plan.job_token,
    }
    path = directory / "hostfile"
    try:
        path.write_text(command.hostfile_text)
        path = directory / "job.json"
        path.write_text(json.dumps(job_file, indent=2))
        if plan.launcher.flavour is MPIFlavour.MPICH:
            path = Path(plan.output_dir)
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError.from_os_error(path, exc) from exc
