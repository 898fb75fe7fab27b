"""What every cluster is told besides where its nodes come from: one options object.

``Cluster.local``, ``Cluster.ssh``, ``Cluster.elastic`` and ``Cluster.from_spec`` all take these
same keyword arguments (:class:`ClusterOptionsArgs`), checked here once.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from clusterbook.durations import Duration, optional_duration
from clusterbook.errors import ConfigError
from clusterbook.head.mirror import is_url
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.setaside import SetAsidePolicy
from clusterbook.lifetime import DETACHED_LIFE_SPAN
from clusterbook.names import NAME_RULE, is_name
from clusterbook.paths import default_run_root
from clusterbook.spec import CLUSTER_OPTIONS, validate_env, validate_forward_env

if TYPE_CHECKING:
    from clusterbook.providers.base import Provider
    from clusterbook.providers.slurm.commands import SlurmRunner
    from clusterbook.ssh.hostkeys import HostKeyPolicy

__all__ = [
    "ClusterOptions",
    "ClusterOptionsArgs",
    "ElasticArgs",
    "SSHArgs",
    "SlurmArgs",
    "split_spec",
]


class ClusterOptionsArgs(TypedDict, total=False):
    """The keyword arguments every cluster constructor takes (see :class:`ClusterOptions`).
    Durations, here and in each kind's arguments, are seconds, a ``datetime.timedelta`` or
    text like ``"90s"``, ``"30m"``, ``"1h30m"`` (:mod:`clusterbook.durations`)."""

    name: str | None
    run_dir: str | os.PathLike[str] | None
    python: str | None
    launcher: str | None
    mpi: MPIFlavour | str | None
    env: Mapping[str, str] | None
    forward_env: Sequence[str] | None
    life_span: Duration | None
    idle_timeout: Duration | None
    retention: Duration | None
    detached: bool
    ephemeral: bool
    work_dir: str | os.PathLike[str] | None
    work_dir_options: Mapping[str, Any] | None
    set_aside: bool | Mapping[str, Any] | None


class SSHArgs(ClusterOptionsArgs, total=False):
    """What ``Cluster.ssh(hosts, ...)`` takes besides the hosts.

    ssh_config
        OpenSSH client config to read (default ``~/.ssh/config`` if there is one; ``"none"``:
        none): each host's ``HostName``, ``User``, ``Port``, ``IdentityFile`` and
        ``ProxyJump`` (jump hosts, one or a chain, for the head's connections and the MPI
        launcher's alike, every hop's host key checked). ``user``, ``port`` and ``identity``
        win over it.
    user, identity, passphrase
        Login user (default: yours) and private key (default: the keys of a running
        ssh-agent, then ``~/.ssh/id_ed25519``, ``id_ecdsa``, ``id_rsa``). A passphrase-
        protected key is opened with ``passphrase``, else asked for in a terminal or a
        notebook (never echoed); the passphrase is dropped once the key is open.
    known_hosts, host_keys
        Host key policy: by default keys must be in ``known_hosts`` (default the user's
        ``~/.ssh/known_hosts``); ``host_keys="accept-new"`` trusts new hosts on first use
        (recorded in ``known_hosts`` if given, else ``~/.clusterbook/known_hosts``; later
        changes are refused); a mapping of host to ``"SHA256:..."`` fingerprint pins keys. A
        changed key is always refused.
    port, connect_timeout
        sshd port of every node (default: the config's, else 22); seconds to wait for every
        node's sshd to answer (30).
    node_python
        Interpreters of nodes whose environment is at another path than the head's, like
        ``{"node2": "/opt/venv/bin/python"}`` (its MPI launcher must be beside it). Jobs then
        run through a per-cluster link to each node's own environment, which needs the same
        home directory on every node.
    launch
        How jobs start MPI's daemons on the nodes: ``"warm"`` (default) over an ssh
        connection the cluster keeps to each node from its start to its stop (no key exchange
        or login per node per job; where it has ended, a job logs in anew, with a
        :class:`~clusterbook.ColdLaunchWarning`), ``"cold"`` over a new ssh login each time.
    discover, every
        A command (run by ``/bin/sh`` in the current directory) that prints the cluster's
        hosts, one ``host[:slots]`` a line (comments and blank lines allowed, as in a
        hostfile), and how often it runs (default ``"10s"``; each run may take as long, 30 s
        at most). Hosts that appear are bootstrapped as at ``start()`` (same keys and
        host-key checks); hosts that go are drained (no new ranks; jobs with ``restarts=``
        relaunch without them, others fail naming them) and cleaned. A run that fails,
        times out or prints what is not a host list keeps the hosts the cluster has, and
        its error shows in ``status`` (the cluster's problem), the widget and the log.
    """

    user: str | None
    identity: str | os.PathLike[str] | None
    known_hosts: str | os.PathLike[str] | None
    host_keys: str | HostKeyPolicy | Mapping[str, str] | None
    port: int | None
    connect_timeout: Duration
    node_python: Mapping[str, str] | None
    ssh_config: str | os.PathLike[str] | None
    passphrase: str | None
    launch: str
    discover: str | None
    every: Duration | None


class ElasticArgs(ClusterOptionsArgs, total=False):
    """What ``Cluster.elastic(min_nodes, max_nodes, ...)`` takes besides the bounds.

    listen, port
        Where the rendezvous store listens (default 127.0.0.1, any free port).
    channel_port
        Where the agents of nodes with their own sshd dial the head, for their nodes' MPI
        daemons (default 0: any free port). Give one where a firewall lets the nodes reach
        known ports only, as the store's; ``None``: no channels (the head then starts the
        daemons over an OpenSSH master connection to each node, a login a node).
    last_call
        How long to wait for more nodes once ``min_nodes`` joined (1 s).
    join_timeout
        How long a node waits for a round to complete (600 s).
    keep_alive_interval, keep_alive_max_attempt
        Nodes heartbeat every ``keep_alive_interval`` seconds (1) and are dropped after
        ``keep_alive_max_attempt`` missed beats (3), or at once when their connection drops.
    """

    listen: str
    port: int
    channel_port: int | None
    last_call: Duration
    join_timeout: Duration
    keep_alive_interval: Duration
    keep_alive_max_attempt: int


class SlurmArgs(ClusterOptionsArgs, total=False):
    """What ``Cluster.slurm(nodes, ...)`` takes besides the job's own arguments.

    listen, port
        Where the rendezvous store listens: the nodes must reach it (default: this machine's
        address on the way to slurmctld, any free port).
    channel_port
        As for :class:`ElasticArgs`.
    last_call, join_timeout, keep_alive_interval, keep_alive_max_attempt
        As for :class:`ElasticArgs`.
    runner
        What runs Slurm's commands (``sbatch``, ``squeue``, ``scancel``, ``scontrol``):
        ``runner(argv, env, timeout) -> subprocess.CompletedProcess``; default: here, with
        ``subprocess``. Tests inject :class:`clusterbook.testing.FakeSlurm`.
    poll_interval
        How long between two ``squeue`` of the job while nodes are still to come (0.5 s).
    max_nodes
        The most nodes ``cluster.scale()`` and ``adapt()`` may grow it to (default: ``nodes``).
    signal_before
        Have Slurm warn this long before the time limit (``--signal=B:USR1@SECONDS``, like
        ``"2m"``): the ranks of the jobs on that batch job's nodes get SIGUSR1, so that they
        can checkpoint (:func:`clusterbook.on_preempt`). Default: no warning.
    requeue
        Requeue the batch job (``--requeue``; ``scontrol requeue`` half of ``signal_before``
        after the warning, 2 minutes by default): its nodes join again when Slurm starts it
        again, and jobs with ``restarts=`` resume there (``CLUSTERBOOK_RESTART``).
    """

    listen: str
    port: int
    channel_port: int | None
    last_call: Duration
    join_timeout: Duration
    keep_alive_interval: Duration
    keep_alive_max_attempt: int
    runner: SlurmRunner
    poll_interval: Duration
    max_nodes: int
    signal_before: Duration
    requeue: bool


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """A cluster's own settings, whatever its nodes.

    Attributes
    ----------
    name
        Shown in status and listings, and found by (1-63 letters, digits, '.', '-', '_');
        default ``KIND-xxxxxx``. A detached cluster keeps it in its supervisor.
    id
        What other processes find the cluster by: ``NAME-YYYYmmdd-HHMMSS`` as of when the
        cluster is made (``-2``, ``-3``... added at start if another cluster has it). It
        names the cluster's files on its nodes (``~/.clusterbook/clusters/ID``), its key
        line and its processes' tags.
    run_dir
        The cluster's directory: its record (``cluster.json``) and its jobs' logs (default:
        ``ID`` under ``default_run_root()``, made by the cluster: ``own_run_dir``).
    python
        The interpreter ``"python"`` in a job's argv stands for (default: this one); a
        relative path is made absolute.
    launcher, mpi
        Path of mpirun/mpiexec, or the MPI flavour (``"openmpi"``, ``"mpich"``) to look for; by
        default the launcher next to ``python`` is used, then the one on PATH.
    env
        Variables every job's ranks get (a job's own ``env`` adds to them).
    forward_env
        Variables of this process's environment that every rank gets too, by name or by
        prefix (``["NCCL_*", "WANDB_API_KEY"]``), under either MPI; besides those the system
        around it defines (see :data:`clusterbook.launch.command.LAUNCH_ENV`).
    life_span, idle_timeout
        Stop the cluster this long after it started, or after this long with no job running
        (seconds, or text like ``"2h"``, ``"30m"``); a warning is logged a minute before.
    retention
        How long the directories of this cluster's finished jobs, and the cluster's own once
        it stopped, are kept (``"7d"``): removed by the next cluster that starts, or by
        ``clusterbook prune``. Default: kept until pruned by hand.
    detached
        Keep the cluster and its jobs running when this process exits or dies: a supervisor
        process of its own runs the cluster, and this one (like any other) attaches to it.
        A detached cluster stops after 12 hours unless given another ``life_span``.
    ephemeral
        Stop the cluster once its first job has ended (``cb.run`` makes such a cluster).
    work_dir, work_dir_options
        Where the cluster's record and its jobs' logs are kept: a local directory (the same
        as ``run_dir``), or an fsspec URL (``sftp://host/path``, ``s3://bucket/path``) they
        are copied to from the local run directory (``work_dir_options``: the file system's
        options, like ``key_filename``; for SSH, ``known_hosts`` too).
    set_aside
        When a node whose ranks keep failing (or that keeps being lost) is set aside: left
        out of jobs' later attempts (retries, restarts) for a cool-down that doubles each time,
        until ``cluster.reinstate(node)``. Default (True): 3 failures within 10 minutes, a
        cool-down of 1 minute, 1 hour at most; a dict changes some of ``failures``,
        ``window``, ``cooldown``, ``limit``; False: never.
    """

    name: str
    id: str
    run_dir: Path
    own_run_dir: bool = False
    python: str = sys.executable
    launcher: str | None = None
    mpi: MPIFlavour | str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    forward_env: tuple[str, ...] = ()
    life_span: float | None = None
    idle_timeout: float | None = None
    retention: float | None = None
    detached: bool = False
    ephemeral: bool = False
    work_dir: str | None = None  # an fsspec URL the run directory is copied to
    work_dir_options: Mapping[str, Any] = field(default_factory=dict)
    set_aside: SetAsidePolicy = field(default_factory=SetAsidePolicy)

    @classmethod
    def given_names(cls) -> set[str]:
        """The options a user gives (the others are made from them):
        :data:`clusterbook.spec.CLUSTER_OPTIONS`."""
        return set(CLUSTER_OPTIONS)

    @classmethod
    def make(cls, kind: str, **given: object) -> ClusterOptions:
        """Check ``given`` (a :class:`ClusterOptionsArgs`) for a cluster of ``kind``."""
        known = cls.given_names()
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(
                f"Unknown cluster option(s) {', '.join(map(repr, unknown))}; the options every "
                f"cluster takes are {', '.join(sorted(known))}."
            )
        name = given.get("name") or f"{kind}-{secrets.token_hex(3)}"
        if not isinstance(name, str) or not is_name(name):
            raise ConfigError(f"Cluster name {name!r} must be {NAME_RULE}.")
        cluster_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        detached, ephemeral = given.get("detached", False), given.get("ephemeral", False)
        if not isinstance(detached, bool) or not isinstance(ephemeral, bool):
            raise ConfigError(
                f"detached and ephemeral must be True or False, got {detached!r} and {ephemeral!r}."
            )
        python = given.get("python")
        if python is not None and not isinstance(python, str):
            raise ConfigError(f"python must be the path of an interpreter, got {python!r}.")
        # A relative path would mean another file once a job runs in another directory.
        python = os.path.abspath(python) if python and os.sep in python else python
        run_dir = given.get("run_dir")
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
            raise ConfigError(f"run_dir must be a directory path, got {run_dir!r}.")
        work_dir, mirror = _work_dir(given.get("work_dir"), run_dir)
        run_dir = run_dir if run_dir is not None else work_dir
        work_dir_options = given.get("work_dir_options") or {}
        if not isinstance(work_dir_options, Mapping):
            raise ConfigError(
                f"work_dir_options must be a mapping of the file system's options, got "
                f"{work_dir_options!r}."
            )
        launcher = given.get("launcher")
        if launcher is not None and not isinstance(launcher, str):
            raise ConfigError(f"launcher must be the path of mpirun or mpiexec, got {launcher!r}.")
        mpi = given.get("mpi")
        if mpi is not None and not isinstance(mpi, (str, MPIFlavour)):
            raise ConfigError(f"mpi must be 'openmpi' or 'mpich', got {mpi!r}.")
        return cls(
            name=name,
            id=cluster_id,
            # Absolute: the record names it to processes that run in other directories.
            run_dir=Path(
                os.path.abspath(default_run_root() / cluster_id if run_dir is None else run_dir)
            ),
            own_run_dir=run_dir is None,
            python=python or sys.executable,
            launcher=launcher,
            mpi=mpi,
            env=validate_env(given.get("env")),  # type: ignore[arg-type]
            forward_env=validate_forward_env(given.get("forward_env")),
            life_span=_life_span(given.get("life_span"), detached),
            idle_timeout=optional_duration(given.get("idle_timeout"), "idle_timeout"),
            retention=optional_duration(given.get("retention"), "retention"),
            detached=detached,
            ephemeral=ephemeral,
            work_dir=mirror,
            work_dir_options=dict(work_dir_options),
            set_aside=SetAsidePolicy.make(given.get("set_aside")),
        )


def split_spec(spec: Mapping[str, Any]) -> tuple[Provider, ClusterOptions, dict[str, Any]]:
    """A cluster spec (``Cluster.from_spec``) split into where its nodes come from (the
    provider of its kind, made from the kind's own arguments), its options, and the spec as
    they took it (what a detached cluster's supervisor makes the cluster again from)."""
    from clusterbook.providers.registry import make_provider

    args = dict(spec)
    kind = args.pop("kind", None)
    own = {k: args.pop(k) for k in list(args) if k in CLUSTER_OPTIONS}
    provider = make_provider(kind, args)
    if own.get("life_span") is None and provider.life_span is not None:
        own["life_span"] = provider.life_span  # a batch job's nodes go at its time limit
    return provider, ClusterOptions.make(provider.kind, **own), {"kind": kind, **args, **own}


def _life_span(given: object, detached: bool) -> float | None:
    """The life span asked for; a detached cluster's default (nothing runs forever)."""
    life_span = optional_duration(given, "life_span")
    return DETACHED_LIFE_SPAN if life_span is None and detached else life_span


def _work_dir(given: object, run_dir: object) -> tuple[str | os.PathLike[str] | None, str | None]:
    """``work_dir`` as a local run directory, or as a URL to copy the run directory to."""
    if given is None:
        return None, None
    if not isinstance(given, (str, os.PathLike)):
        raise ConfigError(f"work_dir must be a directory or an fsspec URL, got {given!r}.")
    if isinstance(given, str) and is_url(given) and not given.startswith("file://"):
        return None, given
    local = given.removeprefix("file://") if isinstance(given, str) else given
    if run_dir is not None and Path(local) != Path(run_dir):  # type: ignore[arg-type]
        raise ConfigError(
            f"work_dir={given!r} and run_dir={run_dir!r} name two directories; a local "
            "work_dir is the run directory: give one of them."
        )
    return local, None
