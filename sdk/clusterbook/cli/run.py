"""``clusterbook run``: a command as an MPI job, on the nodes given (``--hosts``,
``--hostfile``, ``--slurm``), on those of the allocation or job this runs in, or on this machine;
its output printed as it comes, its exit code the job's."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from clusterbook.cli.hosts import add_ssh_options, slots_arg, split_hosts
from clusterbook.cli.job import (
    add_env_option,
    add_recovery_options,
    command,
    duration_arg,
    env_args,
    recovery_args,
)
from clusterbook.cli.live import print_failure, print_live
from clusterbook.cli.profiles import add_profile_option, profile_cluster
from clusterbook.errors import ConfigError

if TYPE_CHECKING:
    from clusterbook.cluster.facade import Cluster
    from clusterbook.launch.result import JobResult
    from clusterbook.providers.environment.detect import Detected

__all__ = ["EXIT_TIMEOUT", "add_run"]

EXIT_TIMEOUT = 124


def add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``run`` to the ``clusterbook`` parser's subcommands."""
    run = sub.add_parser(
        "run",
        help="run a command as an MPI job",
        description="Run CMD as an MPI job of N ranks and exit with its exit code "
        "(124 when it timed out, 130 when interrupted).",
        usage="clusterbook run -n N [--hosts H:S,... | --slurm N | --profile NAME] [options] "
        "-- CMD [ARG ...]",
    )
    run.add_argument(
        "-n", "-np", "--np", type=int, required=True, metavar="N", help="number of ranks"
    )
    _node_options(run)
    add_profile_option(run)
    add_ssh_options(run)
    _slurm_options(run)
    run.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="trust hosts seen for the first time (changed keys stay refused)",
    )
    _job_options(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="program and arguments")
    run.set_defaults(func=_run)


def _node_options(run: argparse.ArgumentParser) -> None:
    """Where the job runs: hosts and their slots, or how jobs start in an allocation."""
    run.add_argument(
        "--hosts",
        metavar="H:S,...",
        help="SSH hosts and slots, like node1:4,node2:4, bootstrapped with a per-cluster key "
        "(default: the nodes of the Slurm allocation, PBS job, SageMaker training job or MPIJob "
        "launcher pod this runs in, else this machine with one slot per core; "
        "CLUSTERBOOK_ENVIRONMENT=none: this machine)",
    )
    run.add_argument(
        "--hostfile",
        metavar="FILE",
        help="the hosts and slots in an Open MPI (host slots=N) or MPICH (host:N) hostfile",
    )
    run.add_argument(
        "--discover",
        metavar="CMD",
        help="a command that prints the SSH hosts, one host[:slots] a line (as a hostfile), "
        "run every --every: hosts that appear join, hosts that go are drained and cleaned; a "
        "run that fails keeps the hosts (with --hosts: the hosts to start with)",
    )
    run.add_argument(
        "--every", metavar="D", help="how often --discover runs (default 10s)", default=None
    )
    run.add_argument(
        "--via",
        choices=["auto", "srun", "ssh"],
        default=None,
        help="in an allocation or job found around this: start jobs as steps of the Slurm "
        "allocation (srun) or with mpirun over ssh (default auto: srun in a Slurm allocation "
        "where srun is found and no ssh option is given, else ssh)",
    )
    run.add_argument(
        "--slots",
        type=slots_arg,
        metavar="S",
        help="slots of each host given without its own (default 1), or of this machine "
        "without --hosts (default: the cores this process may use, its CPU affinity and cgroup "
        "CPU quota); 'gpus': one per GPU of the node",
    )


def _slurm_options(parser: argparse.ArgumentParser) -> None:
    """Nodes from a Slurm batch job (``Cluster.slurm``) instead of hosts."""
    parser.add_argument(
        "--slurm",
        type=int,
        metavar="N",
        help="run on N nodes of one Slurm batch job (sbatch; its nodes join the cluster and "
        "the job ends with it), with --slots ranks each (default: whole nodes)",
    )
    parser.add_argument("--partition", metavar="P", help="the Slurm partition (with --slurm)")
    parser.add_argument(
        "--time",
        metavar="T",
        help="the Slurm job's time limit, like 1:00:00 or 30m (with --slurm; default 1:00:00)",
    )
    parser.add_argument("--account", metavar="A", help="the Slurm account (with --slurm)")
    parser.add_argument(
        "--ready-timeout",
        type=duration_arg("--ready-timeout"),
        default=3600.0,
        metavar="D",
        help="with --slurm (or a profile of nodes that join): how long to wait for the nodes, "
        "queue included (default 1h; seconds or text like 90s, 30m)",
    )


def _job_options(run: argparse.ArgumentParser) -> None:
    """How the job runs: its limits, recovery, environment, launcher and files."""
    run.add_argument(
        "--timeout",
        type=duration_arg("--timeout"),
        metavar="D",
        help="stop the job after D (seconds or text like 90s, 30m, 1h30m)",
    )
    add_recovery_options(run)
    run.add_argument(
        "--wdir", "-wdir", metavar="DIR", help="the ranks' working directory (default: this one)"
    )
    add_env_option(run)
    run.add_argument(
        "--forward-env",
        action="append",
        default=[],
        metavar="NAME",
        help="a variable of this environment for the ranks too, or a prefix like NCCL_* "
        "(repeatable; the job's own, SageMaker's, Slurm's and PBS's go anyway)",
    )
    run.add_argument("--mpi", choices=["openmpi", "mpich"], help="MPI flavour to use")
    run.add_argument("--launcher", metavar="PATH", help="mpirun/mpiexec to use")
    run.add_argument("--oversubscribe", action="store_true", help="allow more ranks than slots")
    run.add_argument("--run-dir", metavar="DIR", help="where the job's logs go")
    run.add_argument(
        "--put",
        action="append",
        default=[],
        metavar="PATH",
        help="copy a file or directory to the same path on every host first (repeatable)",
    )
    run.add_argument(
        "--gather",
        metavar="DIR",
        help="afterwards, move the files the ranks wrote in DIR on the hosts to DIR here",
    )


def _run(args: argparse.Namespace) -> int:
    cmd = command(args.cmd, "clusterbook run -n 2 -- python train.py")
    env = env_args(args.env)
    for path in args.put:  # before any host is bootstrapped
        if not os.path.exists(os.path.expanduser(path)):
            raise ConfigError(f"--put {path!r}: there is no such file or directory here.")
    with _cluster(args) as cluster:
        if cluster.kind in ("slurm", "elastic"):  # nodes that join: --slurm, or a profile's
            _say_waiting(cluster, args.slurm)
            cluster.wait_ready(timeout=args.ready_timeout)
        cluster.put(*args.put)
        how = recovery_args(args)
        how["env"], how["timeout"], how["cwd"] = env, args.timeout, args.wdir
        how["oversubscribe"] = args.oversubscribe
        job = cluster.mpirun(cmd, np=args.np, **how)
        tracebacks = print_live(job)
        result = job.wait()
        if args.gather:
            for path in cluster.gather(args.gather):
                print(f"clusterbook: gathered {path}", file=sys.stderr)
    if not result.ok:
        print_failure(result, tracebacks)
        print(f"clusterbook: each rank's log is in {job.directory}", file=sys.stderr)
    return _exit_code(result)


def _say_waiting(cluster: Cluster, slurm: int | None) -> None:
    """That the job waits for nodes to join, from Slurm or with the command they join by."""
    if slurm is not None:
        said = f"{slurm} node(s) from Slurm"
    elif cluster.kind == "slurm":
        said = "the nodes of the Slurm job"
    else:  # an elastic profile's nodes join when told how
        said = f"the nodes to join: {cluster.join_command}"
    print(f"clusterbook: waiting for {said}", file=sys.stderr)


def _exit_code(result: JobResult) -> int:
    """124 for a timeout, else the first failed rank's exit code (or the launcher's)."""
    if result.timed_out:
        return EXIT_TIMEOUT
    if not result.ok:
        codes = [f.exit_code for f in result.failed]
        return codes[0] if codes else (result.returncode if result.returncode > 0 else 1)
    return 0


def _hosts(args: argparse.Namespace) -> list[str]:
    """The hosts of ``--hosts`` or ``--hostfile``, each with its slots (``--slots`` where it
    has none)."""
    from clusterbook.spec import read_hostfile

    if args.hosts and args.hostfile:
        raise ConfigError("Give the hosts with --hosts or with --hostfile, not both.")
    hosts = split_hosts(args.hosts) if args.hosts else []
    if args.hostfile:
        hosts = read_hostfile(args.hostfile)
    if args.slots is not None:
        hosts = [h if ":" in h else f"{h}:{args.slots}" for h in hosts]
    return hosts


def _cluster(args: argparse.Namespace) -> Cluster:
    """The cluster the options ask for: of ``--slurm``, of the hosts given, of the allocation
    or job found around this, else of this machine."""
    from clusterbook.cluster.facade import Cluster
    from clusterbook.providers.environment.detect import find_environment

    options = {"run_dir": args.run_dir, "mpi": args.mpi, "launcher": args.launcher}
    options["forward_env"] = args.forward_env or None
    hosts = _hosts(args)
    slurm_only = [f"--{n}" for n in ("partition", "time", "account") if getattr(args, n)]
    if slurm_only and args.slurm is None and args.profile is None:
        raise ConfigError(
            f"{', '.join(slurm_only)} go with --slurm N (nodes from Slurm), or a --profile "
            "of kind slurm."
        )
    ssh = {
        "user": args.user,
        "identity": args.identity,
        "known_hosts": args.known_hosts,
        "port": args.port,
        "host_keys": "accept-new" if args.accept_new_host_keys else None,
    }
    if args.via is not None and (hosts or args.slurm is not None):
        raise ConfigError(
            "--via says how jobs start in an allocation or job found around this; with "
            "--hosts, --hostfile or --slurm they start with mpirun over ssh."
        )
    if args.profile is not None:
        given = {"--hosts": bool(args.hosts), "--hostfile": bool(args.hostfile)}
        given["--discover"] = bool(args.discover or args.every)
        given.update({"--slurm": args.slurm is not None, "--via": args.via is not None})
        nodes = {n: getattr(args, n) for n in ("slots", "partition", "time", "account")}
        return profile_cluster(args.profile, {**options, **ssh, **nodes}, refused=given)
    # --slurm asks for new nodes: the allocation this may run in is not looked for.
    asked = hosts or args.slurm is not None or args.discover or args.every
    found = None if asked else find_environment()
    if args.slurm is not None:
        return _slurm_cluster(args, options)
    if args.discover or args.every:
        found_by = {"discover": args.discover, "every": args.every}
        return Cluster.ssh(hosts or None, **found_by, **ssh, **options)
    if hosts:
        return Cluster.ssh(hosts, **ssh, **options)
    if found is not None:
        return _found_cluster(args, found, {**ssh, **options})
    return Cluster.local(workers=1, slots=args.slots, **options)


def _found_cluster(args: argparse.Namespace, found: Detected, given: dict[str, Any]) -> Cluster:
    """The cluster of the allocation or job ``found`` around this (said on stderr), its jobs
    started as ``--via`` asks."""
    import shutil

    from clusterbook.cluster.facade import Cluster
    from clusterbook.providers.environment.detect import cluster_spec, launch_via

    slots = args.slots if isinstance(args.slots, int) else None
    via = launch_via(found, args.via, given, srun_found=shutil.which("srun") is not None)
    print(
        f"clusterbook: the nodes of {found.kind}: {found.source}"
        + (" (jobs as steps of the allocation, through srun)" if via == "srun" else ""),
        file=sys.stderr,
    )
    return Cluster.from_spec(cluster_spec(found, given, slots, via=via))


def _slurm_cluster(args: argparse.Namespace, options: dict[str, str | None]) -> Cluster:
    """The cluster of ``--slurm N`` (the other ways to give nodes are refused beside it)."""
    from clusterbook.cluster.facade import Cluster

    if args.hosts or args.hostfile or args.discover:
        raise ConfigError(
            "Give the nodes with --slurm or with --hosts/--hostfile/--discover, not both."
        )
    if args.slurm < 1:
        raise ConfigError(f"--slurm must be a number of nodes >= 1, got {args.slurm}.")
    if args.slots == "gpus":
        raise ConfigError("--slots gpus does not go with --slurm; give a number of ranks per node.")
    return Cluster.slurm(
        nodes=args.slurm,
        slots=args.slots,
        partition=args.partition,
        time=args.time or "1:00:00",
        account=args.account,
        **options,  # type: ignore[arg-type]
    )
