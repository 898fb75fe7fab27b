"""A worker host of a training job: what ``clusterbook worker serve`` (``cb.serve_worker``)
does on the hosts of a SageMaker training job or a Kubeflow MPIJob that do not lead it.

Every host of such a job runs the same entry point. The leader (SageMaker's first host, the
MPIJob's launcher pod) builds the cluster (``Cluster.from_environment``) and runs the job, which
reaches the other hosts over ssh. Each of those, as managed training services have it
(bootstrap_worker_node):

1. starts a user-level sshd (:func:`~clusterbook.ssh.sshd.start_sshd`) on every address, that
   lets in the keys of the home's ``~/.ssh/authorized_keys`` (the image's, and the cluster's
   own, which the leader adds there) and, in an MPIJob, the job's key, whose private half is
   then its host key (the launcher pins every worker to it);
2. says so, then waits for the leader's cluster, which leaves its state for this host in the
   worker's directory (``~/.clusterbook/worker-HOSTNAME/status.json``, see
   :func:`clusterbook.nodes.tasks.common.worker_dir`): ``ready`` once it started here, ``done`` when
   it stopped;
3. at ``done``, stops sshd and returns (the command exits 0, so the training job ends
   cleanly); it raises :class:`~clusterbook.errors.LeaderLostError` instead when the leader
   is gone: no cluster of it came within ``wait`` seconds, or the cluster's agent here stopped
   (it exits when it lost the leader for its own lease) and no ``done`` came within ``lease``
   seconds more.

What to do at each look is decided by :func:`step`, which is pure; :func:`serve_worker` looks,
waits and stops sshd.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clusterbook.durations import Duration, duration
from clusterbook.errors import ConfigError, LeaderLostError
from clusterbook.nodes.tasks.common import AGENTS, STATUS_FILE, process_tag, worker_dir
from clusterbook.nodes.tasks.procs import tagged
from clusterbook.providers.environment.detect import Detected, Runner, detect_environment
from clusterbook.spec import validate_port
from clusterbook.wording import spell

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_WAIT",
    "SshdPlan",
    "Watch",
    "serve_worker",
    "sshd_plan",
    "step",
]

#: Seconds a worker waits for the leader's word once the cluster's agent here is gone.
DEFAULT_LEASE = 10.0
#: Seconds a worker waits for the leader's cluster to reach it.
DEFAULT_WAIT = 600.0
_POLL = 0.2
_log = logging.getLogger("clusterbook.worker")


@dataclass(frozen=True, slots=True)
class SshdPlan:
    """The worker's sshd: its port, more files of keys that may log in (besides the home's
    ``.ssh/authorized_keys``) and the host key to show (None: its own)."""

    port: int
    more_keys: tuple[str, ...] = ()
    host_key: str | None = None


def sshd_plan(found: Detected, port: int | None) -> SshdPlan:
    """What the worker's sshd is for the job ``found``: the port the leader's clusterbook
    uses there unless ``port`` is given (22 in a SageMaker job; an MPIJob's 2222), and in an
    MPIJob the job's key pair (found at its ``sshAuthMountPath``): its ``authorized_keys``
    let the launcher in, its ``id_rsa`` is the host key the launcher pins."""
    from clusterbook.providers.environment.readers import MPIJOB_SSH_PORT as SSH_PORT

    if port is not None:
        port = validate_port(port, "port")
    if found.kind != "mpijob":
        return SshdPlan(22 if port is None else port)
    identity = found.ssh.get("identity")
    if identity is None:  # no key mounted: the home's keys only
        return SshdPlan(SSH_PORT if port is None else port)
    mount = Path(identity).parent
    return SshdPlan(
        SSH_PORT if port is None else port,
        more_keys=(str(mount / "authorized_keys"),),
        host_key=str(identity) if Path(f"{identity}.pub").is_file() else None,
    )


@dataclass(frozen=True, slots=True)
class Watch:
    """What the worker has seen so far: when it began (``started``), and when the leader last
    showed (``heard``: its cluster's agent ran here, or its status first came)."""

    started: float
    heard: float | None = None


def step(
    watch: Watch,
    status: Mapping[str, Any] | None,
    agent_running: bool,
    now: float,
    *,
    lease: float,
    wait: float,
    leader: str,
) -> tuple[Watch, str | None, str | None]:
    """One look: ``status`` (what the leader's cluster left for this host, None: nothing) and
    whether that cluster's agent runs here. Returns the watch, then the cluster that is done
    with this host (the worker is to exit), or None, then why the leader is lost (the worker
    is to fail), or None: to look again."""
    if status is None:
        if now - watch.started > wait:
            return (
                watch,
                None,
                (
                    f"no cluster of the leader ({leader}) reached this host within {wait:g} s; "
                    "check that the leader runs Cluster.from_environment() (or clusterbook run) "
                    "with this port, or wait longer"
                ),
            )
        return watch, None, None
    cluster = str(status.get("cluster"))
    if status.get("state") == "done":
        return watch, cluster, None
    if agent_running or watch.heard is None:
        return replace(watch, heard=now), None, None
    if now - watch.heard > lease:
        return (
            watch,
            None,
            (
                f"the leader ({leader}) is gone: the agent of its cluster {cluster} here stopped "
                f"(it had lost the leader), and no word that the leader was done came within "
                f"{lease:g} s"
            ),
        )
    return watch, None, None


def serve_worker(
    *,
    port: int | None = None,
    lease: Duration = DEFAULT_LEASE,
    wait: Duration = DEFAULT_WAIT,
    on_ready: Callable[[str], None] | None = None,
    kind: str | None = None,
    environ: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
    runner: Runner | None = None,
) -> str:
    """Serve this host to the leader of the training job around this process until the
    leader is done with it (see the module's description); return the leader's cluster.

    Parameters
    ----------
    port
        sshd's port; default: the one the leader's clusterbook uses for the job (22 in a
        SageMaker job, 2222 in an MPIJob).
    lease
        How long to wait for the leader's word once its cluster's agent here stopped (a
        duration: seconds, a ``datetime.timedelta`` or text like ``"30s"``).
    wait
        How long to wait for the leader's cluster to reach this host (a duration).
    on_ready
        Told, once sshd answers, what this host serves (default: logged).
    kind, environ, root, runner
        As for :func:`~clusterbook.providers.environment.detect.detect_environment`.

    Raises
    ------
    ConfigError
        This host leads the job (or no job is around: :class:`EnvironmentNotFoundError`).
    LeaderLostError
        The leader went, or never came, before it was done with this host.
    SshdError
        sshd could not start (a port taken, or one below 1024 without root).
    """
    from clusterbook.ssh.hostkeys import fingerprint
    from clusterbook.ssh.sshd import start_sshd

    lease = duration(lease, "lease")
    wait = duration(wait, "wait")
    found = detect_environment(kind, environ=environ, root=root, runner=runner)
    if found.role != "worker":
        raise ConfigError(
            f"This host ({found.current_host or 'unnamed'}) leads the {found.kind} job "
            f"({found.source}): build the cluster here with cb.Cluster.from_environment() or "
            "clusterbook run; clusterbook worker serve is for the job's other hosts."
        )
    leader = found.leader or "the leader"
    plan = sshd_plan(found, port)
    directory = Path(worker_dir())
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    status_file = directory / STATUS_FILE
    status_file.unlink(missing_ok=True)  # an earlier job's word is not this one's
    everywhere = "0.0.0.0"  # noqa: S104 - the leader must reach this sshd
    sshd = start_sshd(
        directory,
        port=plan.port,
        listen=everywhere,
        authorized_keys=Path(".ssh") / "authorized_keys",  # the home's: the cluster adds its key
        more_authorized_keys=plan.more_keys,
        host_key=plan.host_key,
    )
    try:
        said = (
            f"worker {found.current_host or '(unnamed)'} of the {found.kind} job serves ssh on "
            f"port {sshd.port} (host key {fingerprint(sshd.host_public_key.split()[1])}) "
            f"until its leader, {leader}, is done"
        )
        (on_ready or _log.info)(said)
        return _wait_for_leader(status_file, leader, lease, wait)
    finally:
        sshd.stop()
        status_file.unlink(missing_ok=True)


def _wait_for_leader(status_file: Path, leader: str, lease: float, wait: float) -> str:
    watch = Watch(time.monotonic())
    while True:
        status = _read_status(status_file)
        agents = None if status is None else process_tag(str(status.get("cluster")), AGENTS)
        running = agents is not None and bool(tagged([agents]))
        watch, done, lost = step(
            watch, status, running, time.monotonic(), lease=lease, wait=wait, leader=leader
        )
        if done is not None:
            return done
        if lost is not None:
            longer = spell("wait", 2 * wait) if watch.heard is None else None
            raise LeaderLostError(
                f"This worker stops: {lost}" + (f" ({longer})." if longer else "."), leader=leader
            )
        time.sleep(_POLL)


def _read_status(path: Path) -> dict[str, Any] | None:
    """The status the leader's cluster left here; None when there is none (yet)."""
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):  # written by rename: whole or absent
        return None
    return status if isinstance(status, dict) else None
