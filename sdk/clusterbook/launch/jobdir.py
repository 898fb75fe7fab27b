"""What each attempt of a job writes in its directory when it starts: the hostfile its
launcher reads and ``job.json``, what it runs (which :class:`~clusterbook.launch.saved.SavedJob`
reads back). A retry's attempt writes them in ``attempt-N/``; its logs go beside them
(:mod:`clusterbook.launch.logstore`)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from clusterbook.errors import RunDirError
from clusterbook.launch.command import LaunchCommand, LaunchPlan
from clusterbook.launch.flavour import MPIFlavour

__all__ = ["write_attempt_files"]


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
