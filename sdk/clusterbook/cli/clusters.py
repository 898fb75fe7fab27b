"""The ``clusterbook`` commands about clusters that run (or ran) elsewhere: ``ls``, ``status``,
``logs``, ``scale``, ``adapt``, ``exec``, ``stop`` and ``prune``. They read the clusters'
directories and ask their heads (see :mod:`clusterbook.cluster.remote.attached`): on this
machine, or on another one over ssh (``ssh://user@host/ID``, ``ls --host user@host``; see
:mod:`clusterbook.cluster.remote.sshdir`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from clusterbook.cli.job import duration_arg
from clusterbook.durations import optional_duration
from clusterbook.lifetime import format_duration

if TYPE_CHECKING:
    from clusterbook.cluster.remote.attached import AttachedCluster

__all__ = ["add_commands"]


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the commands to the ``clusterbook`` parser's subcommands."""
    ls = sub.add_parser(
        "ls",
        help="list your clusters, running ones first",
        description="List the clusters under the run directory root: running ones first, "
        "'stale' where the process that ran a cluster is gone. With --host, those of the "
        "user you log in as there, over ssh.",
    )
    ls.add_argument("--host", metavar="[USER@]HOST[:PORT]", help="list that machine's clusters")
    _remote_options(ls)
    ls.set_defaults(func=_ls)

    status = sub.add_parser("status", help="a cluster's nodes and jobs")
    _cluster_arg(status)
    status.set_defaults(func=_status)

    logs = sub.add_parser(
        "logs",
        help="print a job's output",
        description="Print the output of JOB (default: the cluster's newest job), each line "
        "behind its rank.",
    )
    _cluster_arg(logs)
    logs.add_argument("job", nargs="?", metavar="JOB", help="a job id, like job-0001")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing output until the job ends"
    )
    logs.add_argument("--rank", type=int, metavar="R", help="only rank R (-1: the launcher)")
    logs.set_defaults(func=_logs)

    stop = sub.add_parser(
        "stop",
        help="stop a cluster another process runs",
        description="Stop cluster ID: its head stops its jobs and nodes within a second. When "
        "the process that ran it is gone, stop what it left on this machine. Without its "
        "token file, ask the head through its stop file.",
    )
    _cluster_arg(stop)
    _timeout_option(stop, 30, "how long to wait")
    stop.add_argument(
        "--force",
        action="store_true",
        help="also when this machine cannot verify that the process that ran the cluster "
        "still runs (it ran elsewhere, or an older version wrote a record whose pid may be "
        "another process's now): stop what it left here and mark it stopped",
    )
    stop.set_defaults(func=_stop)

    _add_resize(sub)

    run_there = sub.add_parser(
        "exec",
        help="run a command on every node of a cluster",
        description="Run CMD on every node of cluster ID at once (through its head), print "
        "each node's output behind its name, and exit 0 if it succeeded everywhere, else 1.",
        usage="clusterbook exec ID [--timeout D] -- CMD [ARG ...]",
    )
    _cluster_arg(run_there)
    _timeout_option(run_there, 60, "stop it after D")
    # After '--' (the ID comes first, so a remainder would swallow --timeout).
    run_there.add_argument("cmd", nargs="*", metavar="CMD", help="the command, after --")
    run_there.set_defaults(func=_exec)

    prune = sub.add_parser(
        "prune",
        help="remove the directories of old clusters and jobs",
        description="Remove the directories of clusters that stopped, and of jobs that ended, "
        "longer ago than --older-than (default: each cluster's own retention). A running "
        "cluster's or job's files are never removed.",
    )
    prune.add_argument("--older-than", metavar="AGE", help="like 7d, 12h, 30m")
    prune.add_argument(
        "--dry-run", action="store_true", help="print what would be removed; remove nothing"
    )
    prune.set_defaults(func=_prune)


def _add_resize(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``scale`` and ``adapt``: asked of a Slurm cluster's head (its supervisor)."""
    scale = sub.add_parser(
        "scale",
        help="grow or shrink a Slurm cluster",
        description="Grow or shrink Slurm cluster ID to N nodes (within its min_nodes and "
        "max_nodes): its head submits or cancels batch jobs of one node, and ends an adapt.",
    )
    _cluster_arg(scale)
    scale.add_argument("nodes", type=int, metavar="N", help="the number of nodes")
    scale.set_defaults(func=_scale)

    adapt = sub.add_parser(
        "adapt",
        help="let a Slurm cluster grow and shrink with its jobs",
        description="Have the head of Slurm cluster ID grow it while its jobs' ranks "
        "outnumber its slots and let go of nodes idle for --grace, between MIN and MAX "
        "nodes, looking every --interval; until a scale, another adapt or its stop.",
    )
    _cluster_arg(adapt)
    adapt.add_argument("minimum", type=int, metavar="MIN", help="the fewest nodes")
    adapt.add_argument("maximum", type=int, metavar="MAX", help="the most nodes")
    for option, default in (("--interval", 30.0), ("--grace", 60.0)):
        adapt.add_argument(
            option,
            type=duration_arg(option),
            default=default,
            metavar="D",
            help=f"default {default:g}s (seconds or text like 90s, 2m)",
        )
    adapt.set_defaults(func=_adapt)


def _timeout_option(parser: argparse.ArgumentParser, default: float, what: str) -> None:
    parser.add_argument(
        "--timeout",
        type=duration_arg("--timeout"),
        default=float(default),
        metavar="D",
        help=f"{what} (default {default:g}s; seconds or text like 90s, 2m)",
    )


def _cluster_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "cluster",
        metavar="ID",
        help="a cluster's id, name or directory; on another machine: ssh://[USER@]HOST/ID",
    )
    _remote_options(parser)


def _remote_options(parser: argparse.ArgumentParser) -> None:
    """How a cluster on another machine is reached (what ~/.ssh/config does not say)."""
    parser.add_argument(
        "--identity", metavar="FILE", help="ssh private key (default: the ssh-agent's, ~/.ssh/id_*)"
    )
    parser.add_argument("--known-hosts", metavar="FILE", help="known_hosts file to trust")
    parser.add_argument("--ssh-config", metavar="FILE", help="ssh config (default ~/.ssh/config)")
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="the Python with clusterbook on that machine (default: clusterbook on its PATH)",
    )


def _attach(args: argparse.Namespace) -> AttachedCluster:
    from clusterbook.cluster.remote.attached import AttachedCluster

    return AttachedCluster.attach(
        args.cluster,
        identity=args.identity,
        known_hosts=args.known_hosts,
        ssh_config=args.ssh_config,
        python=args.python,
    )


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in lines)  # fmt: skip


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _ls(args: argparse.Namespace) -> int:
    from clusterbook.head.catalog import ordered, scan, time_left

    now = time.time()
    if args.host is not None:
        from clusterbook.cluster.remote.sshdir import remote_clusters

        found = remote_clusters(
            args.host,
            identity=args.identity,
            known_hosts=args.known_hosts,
            ssh_config=args.ssh_config,
            python=args.python,
        )
    else:
        how = {"--identity": args.identity, "--known-hosts": args.known_hosts,
               "--ssh-config": args.ssh_config, "--python": args.python}  # fmt: skip
        if given := [flag for flag, value in how.items() if value is not None]:
            from clusterbook.errors import ConfigError

            raise ConfigError(
                f"{', '.join(given)} say how to reach another machine; give it with --host "
                "(or leave them out to list this machine's clusters)."
            )
        found = ordered(list(scan()))
    if not found:
        print("No clusters.")
        return 0
    rows = []
    for f in found:
        r = f.record
        if r is None:
            rows.append([f.id, "-", "-", "damaged", "-", "-", "-", "-", "-"])
            continue
        running = sum(j.state == "running" for j in r.jobs)
        jobs = f"{len(r.jobs)}" + (f" ({running} running)" if running else "")
        rows.append([
            r.id, r.name, r.kind, f.state, str(len(r.nodes)), str(sum(n.slots for n in r.nodes)),
            jobs, _when(r.created), time_left(r, now) or "-",
        ])  # fmt: skip
    headers = ["ID", "NAME", "KIND", "STATE", "NODES", "SLOTS", "JOBS", "CREATED", "TIME LEFT"]
    print(_table(headers, rows))
    return 0


def _status(args: argparse.Namespace) -> int:
    with _attach(args) as cluster:
        return _print_status(cluster)


def _print_status(cluster: AttachedCluster) -> int:
    snap = cluster.snapshot()
    record = cluster.record
    line = f"{snap.name} ({record.id}) {snap.kind} {snap.state}"
    if snap.uptime is not None:
        line += f", up {format_duration(snap.uptime)}"
    if snap.time_left is not None:
        line += f", stops in {format_duration(snap.time_left[0])} ({snap.time_left[1]})"
    if record.stop_reason and not record.live:
        line += f", stopped: {record.stop_reason}"
    print(line)
    print(f"directory: {record.directory}")
    if snap.problem:
        print(f"problem: {snap.problem}")
    print()
    gpus = any(n.gpus for n in snap.nodes)  # a GPUS column where there are GPUs
    rows = [
        [n.name, n.host, str(n.slots), *([str(n.gpus)] if gpus else []), n.state,
         ",".join(map(str, n.ranks)) or "-", n.job or "-"]
        for n in snap.nodes
    ]  # fmt: skip
    headers = ["NODE", "HOST", "SLOTS", *(["GPUS"] if gpus else []), "STATE", "RANKS", "JOB"]
    print(_table(headers, rows) if rows else "No nodes.")
    print()
    jobs = [
        [j.id, j.state, str(j.np), "-" if j.returncode is None else str(j.returncode),
         "-" if j.duration is None else f"{j.duration:.1f}s", " ".join(j.argv)]
        for j in snap.jobs
    ]  # fmt: skip
    print(_table(["JOB", "STATE", "NP", "EXIT", "TIME", "COMMAND"], jobs) if jobs else "No jobs.")
    return 0


def _logs(args: argparse.Namespace) -> int:
    from clusterbook.launch.logs import LAUNCHER_RANK, LiveText

    with _attach(args) as cluster:
        job = cluster.job(args.job)
        live = LiveText()
        records = job.stream() if args.follow else job.records(args.rank)
        for record in records:
            if args.rank is not None and record.rank != args.rank:
                continue
            prefix = "[launcher]" if record.rank == LAUNCHER_RANK else f"[{record.rank}]"
            out = sys.stdout if record.stream == "stdout" else sys.stderr
            print(live.render(record, prefix), file=out, end="", flush=True)
    return 0


def _stop(args: argparse.Namespace) -> int:
    with _attach(args) as cluster:
        before = cluster.state
        if before == "stopped":
            print(f"Cluster {cluster.id} was already stopped.")
            return 0
        cluster.stop(timeout=args.timeout, force=args.force)
        reason = cluster.record.stop_reason or "stopped"
        print(f"Cluster {cluster.id} stopped ({reason}).")
    return 0


def _scale(args: argparse.Namespace) -> int:
    with _attach(args) as cluster:
        cluster.scale(args.nodes)
        print(f"Cluster {cluster.id} scales to {args.nodes} node(s).")
    return 0


def _adapt(args: argparse.Namespace) -> int:
    with _attach(args) as cluster:
        cluster.adapt(args.minimum, args.maximum, interval=args.interval, grace=args.grace)
        print(f"Cluster {cluster.id} adapts between {args.minimum} and {args.maximum} nodes.")
    return 0


def _exec(args: argparse.Namespace) -> int:
    from clusterbook.errors import ConfigError

    cmd = list(args.cmd)
    if not cmd:
        raise ConfigError("clusterbook exec needs a command: clusterbook exec ID -- CMD [ARG ...]")
    with _attach(args) as cluster:
        runs = cluster.node_runs(cmd, timeout=args.timeout)
    failed = []
    for run in runs:
        for stream, text in ((sys.stdout, run.stdout), (sys.stderr, run.stderr)):
            for line in text.splitlines():
                print(f"[{run.node}] {line}", file=stream)
        if run.returncode is None:
            failed.append(f"{run.node} ({run.host}): stopped at its timeout, or not reached")
        elif run.returncode != 0:
            failed.append(f"{run.node} ({run.host}): exit code {run.returncode}")
    for line in failed:
        print(f"clusterbook: {line}", file=sys.stderr)
    return 1 if failed else 0


def _prune(args: argparse.Namespace) -> int:
    from clusterbook.head.catalog import prune

    keep = optional_duration(args.older_than, "--older-than")
    removals = prune(older_than=keep, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for removal in removals:
        print(f"{verb} {removal.path} ({removal.why})")
    if not removals:
        print("Nothing to remove.")
    return 0
