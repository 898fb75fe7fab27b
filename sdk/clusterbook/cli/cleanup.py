"""``clusterbook cleanup``: what a cluster whose owner is gone left on this machine and on its
hosts, removed as ``stop()`` would (see :mod:`clusterbook.head.clean`)."""

from __future__ import annotations

import argparse
import sys

from clusterbook.cli.hosts import add_ssh_options, split_hosts

__all__ = ["add_cleanup"]


def add_cleanup(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cleanup`` to the ``clusterbook`` parser's subcommands."""
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
    add_ssh_options(clean)
    clean.add_argument(
        "--python", default="python3", help="a Python 3 on the hosts (default python3)"
    )
    clean.set_defaults(func=_cleanup)


def _cleanup(args: argparse.Namespace) -> int:
    from clusterbook.head.clean import clean_cluster

    hosts = split_hosts(args.hosts) if args.hosts else []
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
