"""``clusterbook worker``: this machine as a node of an elastic cluster (``join``: the agent,
until the cluster closes or its head is gone for longer than the lease), or as a worker of the
SageMaker training job or MPIJob it runs in, until the job's leader is done with it (``serve``;
see :mod:`clusterbook.providers.environment.worker`)."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from clusterbook.cli.hosts import slots_arg
from clusterbook.cli.job import duration_arg
from clusterbook.nodes.tasks.cpus import usable_cores_here

if TYPE_CHECKING:
    from clusterbook.gpus import GPUInfo
    from clusterbook.launch.daemon_server import DaemonServer
    from clusterbook.rendezvous.dialler import Dialler
    from clusterbook.ssh.aside import Aside
    from clusterbook.ssh.sshd import Sshd

__all__ = ["add_worker"]

#: Seconds the join waits for its channel to the head to be let in (a TLS handshake, under
#: the sshd's start); one that is not by then keeps trying, and jobs log in meanwhile.
CHANNEL_WAIT = 2.0
#: Seconds the join waits for the agent's own probe (``--probe-mpi``; ~6 ms here). One that
#: takes longer is left out of the report, and the head checks the node over a login.
PROBE_WAIT = 10.0


def add_worker(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], only: str | None = None
) -> None:
    """Add ``worker`` and its commands (``only``: that one, for an agent's ``join`` without
    making, or importing for, the rest) to the ``clusterbook`` parser's subcommands."""
    worker = sub.add_parser(
        "worker",
        help="run this machine as a node of an elastic cluster, or a worker of a training job",
    )
    worker_sub = worker.add_subparsers(title="worker commands")
    if only in (None, "join"):
        _add_join(worker_sub)
    if only in (None, "serve"):
        _add_serve(worker_sub)


def _add_join(worker_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    join = worker_sub.add_parser(
        "join",
        help="join an elastic cluster and stay until it closes",
        description="Join the elastic cluster at URL (as the head printed it) and stay, "
        "heartbeating, until the cluster closes or the head is gone for longer than the lease.",
    )
    join.add_argument("url", help="join URL printed by the head (tcp://HOST:PORT/ID?...)")
    join.add_argument(
        "--token-file",
        required=True,
        metavar="F",
        help="file with the cluster's secret (mode 0600)",
    )
    join.add_argument(
        "--slots",
        type=slots_arg,
        default=None,
        help="ranks this node takes (default: the cores it may use, its CPU affinity and "
        "cgroup CPU quota; 'gpus': one per GPU it has)",
    )
    join.add_argument("--node-id", help="this node's id (default: HOSTNAME-PID)")
    join.add_argument(
        "--lease",
        type=duration_arg("--lease"),
        default=10.0,
        metavar="D",
        help="how long without the head before stopping the cluster's jobs here and exiting "
        "(default 10s; seconds or text like 30s, 2m)",
    )
    join.add_argument(
        "--clean-on-lost",
        action="store_true",
        help="when the head is lost for longer than the lease, also remove the cluster's key "
        "line and files the head installed on this node (set by clusters the head bootstraps)",
    )
    join.add_argument(
        "--start-sshd",
        type=int,
        metavar="PORT",
        help="start a user-level sshd on PORT and report its host key",
    )
    join.add_argument(
        "--daemon-socket",
        metavar="PATH",
        help="start MPI's daemons for the head's launcher when asked on the Unix socket at "
        "PATH (set by clusters the head bootstraps over SSH, which forward it to the head; "
        "with --start-sshd, one in that sshd's directory by default)",
    )
    join.add_argument(
        "--probe-mpi",
        type=_probe_mpi_arg,
        metavar="FLAVOUR:PREFIX",
        help="check this node for the head's MPI launcher (openmpi or mpich, installed at "
        "PREFIX) as the head's pre-flight check would, and report what it found with the "
        "join: the head then checks this node without logging in (set by Slurm clusters)",
    )
    join.set_defaults(func=_join)


def _probe_mpi_arg(value: str) -> tuple[str, str]:
    flavour, colon, prefix = value.partition(":")
    if not colon or flavour not in ("openmpi", "mpich") or not prefix.startswith("/"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not FLAVOUR:PREFIX: give openmpi or mpich and the absolute path the "
            "launcher is installed under, like openmpi:/opt/venv"
        )
    return flavour, prefix


def _join(args: argparse.Namespace) -> int:
    import socket

    from clusterbook.rendezvous.backends._secret import read_secret
    from clusterbook.ssh.aside import start_aside

    node_id = args.node_id or f"{socket.gethostname()}-{os.getpid()}"
    slots, gpus = _slots(args.slots, node_id)  # what was asked is checked first
    secret = read_secret(args.token_file)
    started = None
    if args.start_sshd is not None:  # first: it starts while the agent's modules load
        sshd_args = (args.url, secret, node_id, args.start_sshd, args.daemon_socket)
        started = start_aside(functools.partial(_agent_sshd, *sshd_args))
    socket_path = args.daemon_socket
    if started is not None and socket_path is None:  # the head reaches it through this sshd
        socket_path = _daemon_socket_in(node_id)
    try:
        return _join_with(args, node_id, (slots, gpus), secret, socket_path, started)
    finally:
        if started is not None:
            started.end()


def _slots(given: int | str | None, node_id: str) -> tuple[int, GPUInfo | None]:
    """The slots ``--slots`` asks for (checked), and the GPUs found where it asks for one slot a
    GPU (None: not looked for yet: nvidia-smi takes its time, while the sshd starts)."""
    cores = usable_cores_here()
    if given is None or isinstance(given, int):  # a number: checked by --slots' own type
        return cores if given is None else given, None
    from clusterbook.gpus import GPUS, probe_gpus, slots_from_gpus
    from clusterbook.spec import validate_slots

    validate_slots(given, "--slots")  # "gpus"
    gpus = probe_gpus()
    fix = f"pass a number (--slots {cores}), or join from a machine with GPUs"
    return slots_from_gpus(gpus, node=node_id, asked=f"--slots {GPUS}", fix=fix), gpus


def _join_with(
    args: argparse.Namespace,
    node_id: str,
    asked: tuple[int, GPUInfo | None],
    secret: bytes,
    socket_path: str | None,
    started: Aside | None,
) -> int:
    import logging

    from clusterbook.gpus import probe_gpus

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    slots, found = asked
    gpus = found if found is not None else probe_gpus()
    probed = _probe_meanwhile(args.probe_mpi)

    from clusterbook.launch.daemon_server import DaemonServer
    from clusterbook.rendezvous.agent import Agent
    from clusterbook.rendezvous.report import NodeReport

    daemons = DaemonServer(socket_path) if started is not None or socket_path else None
    dialler = None
    if started is not None and daemons is not None:  # while the sshd starts
        dialler = _dial_meanwhile(args.url, secret, node_id, daemons)
    try:
        sshd = started.sshd() if started is not None else None
        facts = NodeReport.here(
            slots,
            sshd_host_key=sshd.host_public_key if sshd else None,
            sshd_port=sshd.port if sshd else None,
            daemon_socket=socket_path if sshd else None,
            gpus=gpus,
            probe=probed(),
        )
        agent = Agent(
            args.url,
            secret,
            node_id=node_id,
            slots=slots,
            lease=args.lease,
            facts=facts,
            clean_on_lost=args.clean_on_lost,
        )

        def stop(signum: int, _frame: object) -> None:
            agent.stop_event.set()
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        if daemons is not None:
            daemons.start()
        if dialler is not None:  # joined with its channel up, so that its first job uses it
            dialler.first(CHANNEL_WAIT)
        return agent.run()
    finally:
        if dialler is not None:
            dialler.close()
        if daemons is not None:
            daemons.close()


def _probe_meanwhile(probe_mpi: tuple[str, str] | None) -> Callable[[], str | None]:
    """Start the head's pre-flight probe of this node for ``probe_mpi`` (flavour, prefix) on
    a thread of its own (it imports mpi4py and reads distributions while the sshd starts);
    returns what waits for it: the probe's JSON (:attr:`NodeReport.probe`), or None if it
    was not asked for or failed (the head then logs in to check the node)."""
    if probe_mpi is None:
        return lambda: None
    import json
    import threading

    from clusterbook.nodes.tasks.probe import probe

    flavour, prefix = probe_mpi
    found: list[str] = []

    def run() -> None:
        try:
            facts = probe({"flavour": flavour, "prefix": prefix, "gpus": False})
        except Exception:  # the head's own probe, over a login, will say what is wrong
            return
        found.append(json.dumps({"flavour": flavour, "prefix": prefix, "facts": facts}))

    thread = threading.Thread(target=run, name="clusterbook-probe", daemon=True)
    thread.start()

    def result() -> str | None:
        thread.join(PROBE_WAIT)
        return found[0] if found else None

    return result


def _dial_meanwhile(url: str, secret: bytes, node_id: str, daemons: DaemonServer) -> Dialler | None:
    """Dial the head's channel for MPI's daemons (:mod:`clusterbook.rendezvous.channels`)
    where the join URL names one, on a thread of its own; None where it names none."""
    from clusterbook.rendezvous.backends.url import parse_store_url
    from clusterbook.rendezvous.dialler import Dialler
    from clusterbook.rendezvous.registry import channel_port, parse_join_url

    port = channel_port(url)
    if port is None:
        return None
    host, _, fingerprint = parse_store_url(parse_join_url(url)[0])
    if fingerprint is None:
        return None
    dialler = Dialler((host, port), fingerprint, secret, node_id, daemons)
    dialler.start()
    return dialler


def _daemon_socket_in(node_id: str) -> str | None:
    """The socket beside the agent's own sshd (a 0700 directory) where it starts MPI's
    daemons; None where the path cannot be one (too long for a Unix socket, or a character
    the sshd's PermitOpen cannot hold): jobs then start them over ssh."""
    from clusterbook.launch.daemons import SOCKET_PATH_MAX
    from clusterbook.paths import agent_sshd_dir
    from clusterbook.ssh.sshd_config import openable

    path = str(agent_sshd_dir(node_id) / "daemons.sock")
    fits = len(path.encode()) < SOCKET_PATH_MAX and openable(path)
    return path if fits else None


def _agent_sshd(url: str, secret: bytes, node_id: str, port: int, socket: str | None) -> Sshd:
    """The agent's own sshd; it lets in the cluster's key only (derived from the secret),
    for a session and a connection to ``socket`` (None: :func:`_daemon_socket_in`, as the
    agent finds it too)."""
    from clusterbook.paths import agent_sshd_dir
    from clusterbook.rendezvous.registry import parse_join_url
    from clusterbook.ssh.agent_sshd import start_agent_sshd
    from clusterbook.ssh.keys import derived_public_line

    _, settings = parse_join_url(url)
    everywhere = "0.0.0.0"  # noqa: S104 - the head must reach this sshd
    line = derived_public_line(secret, settings.run_id)
    directory = agent_sshd_dir(node_id)
    if socket is None:
        socket = _daemon_socket_in(node_id)
    return start_agent_sshd(directory, line, socket=socket, port=port, listen=everywhere)


def _add_serve(worker_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from clusterbook.providers.environment.worker import DEFAULT_LEASE, DEFAULT_WAIT

    serve = worker_sub.add_parser(
        "serve",
        help="serve this host to the leader of its training job until the leader is done",
        description="On a host of a SageMaker training job or a Kubeflow MPIJob that does not "
        "lead it: start a user-level sshd that lets in the home's ~/.ssh/authorized_keys (and "
        "an MPIJob's key), then wait until the cluster of the job's leader says it is done "
        "with this host (exit 0), or the leader is gone (exit 1, saying why).",
    )
    serve.add_argument(
        "--port",
        type=int,
        help="sshd's port (default: the one the leader's clusterbook uses: 22 in a SageMaker "
        "job, 2222 in an MPIJob)",
    )
    serve.add_argument(
        "--lease",
        type=duration_arg("--lease"),
        default=DEFAULT_LEASE,
        metavar="D",
        help="how long to wait for the leader's word once its cluster's agent here stopped "
        f"(default {DEFAULT_LEASE:g}s)",
    )
    serve.add_argument(
        "--wait",
        type=duration_arg("--wait"),
        default=DEFAULT_WAIT,
        metavar="D",
        help=f"how long to wait for the leader's cluster to reach this host "
        f"(default {DEFAULT_WAIT:g}s)",
    )
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from clusterbook.providers.environment.worker import serve_worker

    def say(text: str) -> None:
        print(f"clusterbook: {text}", flush=True)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # serve_worker stops sshd on the way out

    signal.signal(signal.SIGTERM, stop)
    cluster = serve_worker(port=args.port, lease=args.lease, wait=args.wait, on_ready=say)
    print(f"clusterbook: the leader is done with this host (cluster {cluster})", file=sys.stderr)
    return 0
