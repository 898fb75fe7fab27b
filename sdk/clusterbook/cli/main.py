"""The ``clusterbook`` command: ``demo``, ``run``, ``cleanup`` and ``worker join`` (``worker
serve`` is in :mod:`clusterbook.cli.worker`); the
commands about clusters elsewhere (``ls``, ``status``, ``logs``, ``stop``, ``prune``) are in
:mod:`clusterbook.cli.clusters`, ``export mpijob`` in :mod:`clusterbook.cli.export`; what
``run`` and ``export`` share of a job in :mod:`clusterbook.cli.job`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.wording import speaking

if TYPE_CHECKING:
    from clusterbook.cluster.facade import Cluster
    from clusterbook.launch.job import Job
    from clusterbook.launch.result import JobResult
    from clusterbook.launch.saved import SavedJob
    from clusterbook.ssh.sshd import Sshd

__all__ = ["main"]

EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``clusterbook`` command; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["serve-dir"]:
        # What a handle attached over ssh runs here (not a command people type): no parser.
        from clusterbook.cluster.remote.dirservice import main as serve_dir

        return serve_dir(words[1:])
    worker = words[1] if words[:1] == ["worker"] and len(words) > 1 else None
    parser = _parser(worker_only=worker if worker in ("join", "serve") else None)
    command: list[str] | None = None
    if words[:1] == ["exec"] and "--" in words:
        # exec's ID comes before its options: argparse would take the command for its own.
        cut = words.index("--")
        words, command = words[:cut], words[cut + 1 :]
    args, unknown = parser.parse_known_args(words)
    if command is not None:
        args.cmd = command
    if unknown:
        return _unknown_options(parser, words, unknown)
    if not hasattr(args, "func"):
        _subparser(parser, words).print_help()
        return EXIT_USAGE
    try:
        with speaking("cli"):  # messages name the options of this command, not Python's
            return int(args.func(args))
    except ClusterError as exc:
        print(f"clusterbook: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ConfigError) else 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _slots_arg(text: str) -> int | str:
    """``--slots``: a whole number >= 1, or ``gpus`` (one slot per GPU of the node)."""
    if text == "gpus":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--slots must be a whole number >= 1 or 'gpus' (one per GPU), got {text!r}"
        )
    return value


def _ssh_options(parser: argparse.ArgumentParser) -> None:
    """How a command logs in to its hosts (what ~/.ssh/config does not say, or overrides)."""
    parser.add_argument("--user", help="ssh login user on the hosts (default: yours)")
    parser.add_argument(
        "--identity",
        metavar="FILE",
        help="ssh private key (default: the ssh-agent's keys, then ~/.ssh/id_*)",
    )
    parser.add_argument("--known-hosts", metavar="FILE", help="known_hosts file to trust")
    parser.add_argument(
        "--port", type=int, help="sshd port of the hosts (default: the ssh config's, else 22)"
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
        type=float,
        default=3600.0,
        metavar="S",
        help="with --slurm: seconds to wait for the job's nodes, queue included (default 3600)",
    )


def _slurm_cluster(args: argparse.Namespace, options: dict[str, str | None]) -> Cluster:
    """The cluster of ``--slurm N`` (the other ways to give nodes are refused beside it)."""
    from clusterbook.cluster.facade import Cluster

    if args.hosts or args.hostfile:
        raise ConfigError("Give the nodes with --slurm or with --hosts/--hostfile, not both.")
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


def _subparser(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The (sub)command ``words`` name: ``clusterbook worker join ...`` is ``join``'s parser."""
    current = parser
    for word in words:
        if word.startswith("-"):
            continue
        choices = next(
            (a.choices for a in current._actions if isinstance(a, argparse._SubParsersAction)),
            None,
        )
        if not choices or word not in choices:
            break
        current = choices[word]
    return current


def _unknown_options(parser: argparse.ArgumentParser, words: list[str], unknown: list[str]) -> int:
    """A mistyped option: the subcommand's usage, and the closest options it has."""
    import difflib

    where = _subparser(parser, words)
    known = [s for a in where._actions for s in a.option_strings]
    lines = []
    for word in unknown:
        if not word.startswith("-"):
            continue
        close = difflib.get_close_matches(word.partition("=")[0], known, n=1, cutoff=0.6)
        lines.append(f"{word} (did you mean {close[0]}?)" if close else word)
    if not lines:  # stray words: a command without '--' before it, say
        lines = [" ".join(unknown) + " (put the command after '--')"]
    where.print_usage(sys.stderr)
    print(f"{where.prog}: error: unrecognized arguments: {'; '.join(lines)}", file=sys.stderr)
    return EXIT_USAGE


def _parser(*, worker_only: str | None = None) -> argparse.ArgumentParser:
    """The command's parser; with ``worker_only``, of that ``worker`` command alone (``join``:
    what an agent parses, every node's at every bootstrap), without making, or importing for,
    the rest."""
    from clusterbook.version import __version__

    parser = argparse.ArgumentParser(
        prog="clusterbook", description="Run MPI on a handful of machines."
    )
    parser.add_argument("--version", action="version", version=f"clusterbook {__version__}")
    sub = parser.add_subparsers(title="commands")
    if not worker_only:
        _add_commands(sub)
    _add_worker(sub, worker_only)
    return parser


def _add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Every command but ``worker``."""
    from clusterbook.cli.clusters import add_commands
    from clusterbook.cli.export import add_export
    from clusterbook.cli.job import add_env_option, add_recovery_options

    demo = sub.add_parser("demo", help="run an mpi4py allreduce on a local cluster")
    demo.add_argument("--workers", type=int, default=2, help="nodes (default 2)")
    demo.add_argument("--slots", type=int, default=2, help="slots per node (default 2)")
    demo.add_argument("--mpi", choices=["openmpi", "mpich"], help="MPI flavour to use")
    demo.add_argument("--python", metavar="PATH", help="interpreter for the ranks (with mpi4py)")
    demo.set_defaults(func=_demo)

    run = sub.add_parser(
        "run",
        help="run a command as an MPI job",
        description="Run CMD as an MPI job of N ranks and exit with its exit code "
        "(124 when it timed out, 130 when interrupted).",
        usage="clusterbook run -n N [--hosts H:S,... | --slurm N] [options] -- CMD [ARG ...]",
    )
    run.add_argument(
        "-n", "-np", "--np", type=int, required=True, metavar="N", help="number of ranks"
    )
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
        "--via",
        choices=["auto", "srun", "ssh"],
        default=None,
        help="in an allocation or job found around this: start jobs as steps of the Slurm "
        "allocation (srun) or with mpirun over ssh (default auto: srun in a Slurm allocation "
        "where srun is found and no ssh option is given, else ssh)",
    )
    run.add_argument(
        "--slots",
        type=_slots_arg,
        metavar="S",
        help="slots of each host given without its own (default 1), or of this machine "
        "without --hosts (default: its cores); 'gpus': one per GPU of the node",
    )
    _ssh_options(run)
    _slurm_options(run)
    run.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="trust hosts seen for the first time (changed keys stay refused)",
    )
    run.add_argument("--timeout", type=float, metavar="S", help="stop the job after S seconds")
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
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="program and arguments")
    run.set_defaults(func=_run)

    clean = sub.add_parser(
        "cleanup",
        help="remove what a cluster whose owner is gone left here and on its hosts",
        description="Stop the processes of cluster ID and remove its key line, files and what "
        "put() made, on this machine and on each host of --hosts (as stop() would). Its nodes "
        "do this themselves when they lose the head; this is for what is left when they could "
        "not.",
    )
    clean.add_argument(
        "cluster_id",
        metavar="ID",
        help="the cluster's id, as clusterbook ls shows it (like ssh-1a2b3c-20261123-101500)",
    )
    clean.add_argument("--hosts", metavar="H,...", help="its SSH hosts, like node1,node2")
    _ssh_options(clean)
    clean.add_argument(
        "--python", default="python3", help="a Python 3 on the hosts (default python3)"
    )
    clean.set_defaults(func=_cleanup)

    add_commands(sub)
    add_export(sub)


def _add_worker(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], only: str | None = None
) -> None:
    """``worker`` and its commands (``only``: that one)."""
    worker = sub.add_parser(
        "worker",
        help="run this machine as a node of an elastic cluster, or a worker of a training job",
    )
    worker_sub = worker.add_subparsers(title="worker commands")
    if only in (None, "join"):
        _add_join(worker_sub)
    if only in (None, "serve"):
        from clusterbook.cli.worker import add_serve

        add_serve(worker_sub)


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
        type=_slots_arg,
        default=os.cpu_count() or 1,
        help="ranks this node takes (default: its cores; 'gpus': one per GPU it has)",
    )
    join.add_argument("--node-id", help="this node's id (default: HOSTNAME-PID)")
    join.add_argument(
        "--lease",
        type=float,
        default=10.0,
        help="seconds without the head before stopping the cluster's jobs here and exiting "
        "(default 10)",
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
    join.set_defaults(func=_worker_join)


def _worker_join(args: argparse.Namespace) -> int:
    import logging
    import signal
    import socket

    from clusterbook.gpus import GPUS, probe_gpus, slots_from_gpus
    from clusterbook.rendezvous.agent import Agent
    from clusterbook.rendezvous.backends.tcp import read_secret
    from clusterbook.rendezvous.report import NodeReport
    from clusterbook.spec import validate_slots

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    asked = validate_slots(args.slots, "--slots")
    node_id = args.node_id or f"{socket.gethostname()}-{os.getpid()}"
    gpus = probe_gpus()
    if asked == GPUS:
        cores = os.cpu_count() or 1
        slots = slots_from_gpus(
            gpus,
            node=node_id,
            asked=f"--slots {GPUS}",
            fix=f"pass a number (--slots {cores}), or join from a machine with GPUs",
        )
    else:
        slots = asked
    secret = read_secret(args.token_file)
    sshd = None
    if args.start_sshd is not None:
        sshd = _agent_sshd(args.url, secret, node_id, args.start_sshd)
    facts = NodeReport.here(
        slots,
        sshd_host_key=sshd.host_public_key if sshd else None,
        sshd_port=sshd.port if sshd else None,
        gpus=gpus,
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
    try:
        return agent.run()
    finally:
        if sshd is not None:
            sshd.stop()


def _agent_sshd(url: str, secret: bytes, node_id: str, port: int) -> Sshd:
    """The agent's own sshd; it lets in the cluster's key only (derived from the secret)."""
    from clusterbook.paths import agent_sshd_dir
    from clusterbook.rendezvous.agent import parse_join_url
    from clusterbook.ssh.keys import derived_public_line
    from clusterbook.ssh.sshd import start_sshd

    _, settings = parse_join_url(url)
    directory = agent_sshd_dir(node_id)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = directory / "authorized_keys"
    # Rewritten for each cluster: a key of an earlier cluster must not get in.
    fd = os.open(keys, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write("restrict " + derived_public_line(secret, settings.run_id) + "\n")
    everywhere = "0.0.0.0"  # noqa: S104 - the head must reach this sshd
    return start_sshd(directory, port=port, listen=everywhere, authorized_keys=keys)


def _cleanup(args: argparse.Namespace) -> int:
    from clusterbook.head.clean import clean_cluster

    hosts = _split(args.hosts) if args.hosts else []
    results = clean_cluster(
        args.cluster_id,
        hosts,
        user=args.user,
        identity=args.identity,
        known_hosts=args.known_hosts,
        port=args.port,
        python=args.python,
    )
    failed = 0
    for host, done in results.items():
        if isinstance(done, Exception):
            failed += 1
            print(f"{host}: not cleaned: {done}", file=sys.stderr)
        else:
            print(
                f"{host}: stopped {len(done['killed'])} process(es), removed "
                f"{done['keys_removed']} key line(s); cluster directory removed: "
                f"{'yes' if done['dir_removed'] else 'no'}"
            )
    return 1 if failed else 0


def _run(args: argparse.Namespace) -> int:
    from clusterbook.cli.job import command, env_args, recovery_args
    from clusterbook.cluster.facade import Cluster
    from clusterbook.providers.environment.detect import cluster_spec, find_environment, launch_via
    from clusterbook.spec import read_hostfile

    cmd = command(args.cmd, "clusterbook run -n 2 -- python train.py")
    env = env_args(args.env)
    for path in args.put:  # before any host is bootstrapped
        if not os.path.exists(os.path.expanduser(path)):
            raise ConfigError(f"--put {path!r}: there is no such file or directory here.")
    options = {"run_dir": args.run_dir, "mpi": args.mpi, "launcher": args.launcher}
    options["forward_env"] = args.forward_env or None
    if args.hosts and args.hostfile:
        raise ConfigError("Give the hosts with --hosts or with --hostfile, not both.")
    hosts = _split(args.hosts) if args.hosts else []
    if args.hostfile:
        hosts = read_hostfile(args.hostfile)
    if args.slots is not None:
        hosts = [h if ":" in h else f"{h}:{args.slots}" for h in hosts]
    slurm_only = [f"--{n}" for n in ("partition", "time", "account") if getattr(args, n)]
    if slurm_only and args.slurm is None:
        raise ConfigError(f"{', '.join(slurm_only)} go with --slurm N (nodes from Slurm).")
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
    # --slurm asks for new nodes: the allocation this may run in is not looked for.
    found = None if hosts or args.slurm is not None else find_environment()
    if args.slurm is not None:
        cluster = _slurm_cluster(args, options)
    elif hosts:
        cluster = Cluster.ssh(hosts, **ssh, **options)
    elif found is not None:
        slots = args.slots if isinstance(args.slots, int) else None
        given = {**ssh, **options}
        import shutil

        via = launch_via(found, args.via, given, srun_found=shutil.which("srun") is not None)
        print(
            f"clusterbook: the nodes of {found.kind}: {found.source}"
            + (" (jobs as steps of the allocation, through srun)" if via == "srun" else ""),
            file=sys.stderr,
        )
        cluster = Cluster.from_spec(cluster_spec(found, given, slots, via=via))
    else:
        cluster = Cluster.local(workers=1, slots=args.slots, **options)
    with cluster:
        if args.slurm is not None:
            print(f"clusterbook: waiting for {args.slurm} node(s) from Slurm", file=sys.stderr)
            cluster.wait_ready(timeout=args.ready_timeout)
        cluster.put(*args.put)
        how = recovery_args(args)
        how["env"], how["timeout"], how["cwd"] = env, args.timeout, args.wdir
        how["oversubscribe"] = args.oversubscribe
        job = cluster.mpirun(cmd, np=args.np, **how)
        tracebacks = _print_live(job)
        result = job.wait()
        if args.gather:
            for path in cluster.gather(args.gather):
                print(f"clusterbook: gathered {path}", file=sys.stderr)
    if not result.ok:
        _print_failure(result, tracebacks)
        print(f"clusterbook: each rank's log is in {job.directory}", file=sys.stderr)
    if result.timed_out:
        return EXIT_TIMEOUT
    if not result.ok:
        codes = [f.exit_code for f in result.failed]
        return codes[0] if codes else (result.returncode if result.returncode > 0 else 1)
    return 0


def _split(hosts: str) -> list[str]:
    entries = [h.strip() for h in hosts.split(",")]
    if any(not e for e in entries):
        raise ConfigError(f"--hosts {hosts!r} has an empty entry; write it like node1:4,node2:4.")
    return entries


def _print_live(job: Job | SavedJob) -> dict[int, list[tuple[str, ...]]]:
    """Print the job's output as it comes, each line behind its rank, folded as ``%%mpirun``
    folds it (no abort banners; tracebacks held, to be told once); return the tracebacks."""
    from clusterbook.launch.fold import fold_live
    from clusterbook.launch.logs import LAUNCHER_RANK, LiveText, LogRecord

    live = LiveText()

    def emit(rank: int, stream: str, text: str, partial: bool) -> None:
        prefix = "[launcher]" if rank == LAUNCHER_RANK else f"[{rank}]"
        record = LogRecord(0.0, rank, "", stream, text, partial)
        out = sys.stdout if stream == "stdout" else sys.stderr
        print(live.render(record, prefix), file=out, end="", flush=True)

    def announce(attempt: int) -> None:
        print(f"clusterbook: attempt {attempt}", file=sys.stderr, flush=True)

    try:
        return fold_live(job.stream(), emit, continues=live.continues, on_attempt=announce)
    except KeyboardInterrupt:
        job.cancel()
        raise


def _print_failure(result: JobResult, tracebacks: dict[int, list[tuple[str, ...]]]) -> None:
    """Each distinct error once with its ranks, then how the job ended (in full when no
    rank's error said it already)."""
    from clusterbook.launch.fold import failure_report

    report = failure_report(tracebacks, result.failed)
    for text in report:
        print(text, file=sys.stderr)
    summary = result.summary()
    print(f"clusterbook: {summary.splitlines()[0] if report else summary}", file=sys.stderr)


def _demo(args: argparse.Namespace) -> int:
    from clusterbook.cluster.facade import Cluster

    t0 = time.perf_counter()
    cluster = Cluster.local(
        workers=args.workers, slots=args.slots, mpi=args.mpi, python=args.python
    )
    with cluster:
        cluster.wait_ready(timeout=60)
        started = time.perf_counter()
        print(f"{cluster!r}\n")
        print(cluster.status().to_string(index=False), end="\n\n")
        program = os.path.join(os.path.dirname(os.path.dirname(__file__)), "_demo_rank.py")
        job = cluster.mpirun(["python", program], np=cluster.total_slots, timeout=120)
        _print_live(job)
        result = job.wait()
        finished = time.perf_counter()
    print()
    print(result.summary())
    print(
        f"cluster start {started - t0:.3f} s, job {result.duration:.3f} s, "
        f"total {finished - t0:.3f} s; logs in {job.directory}"
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
