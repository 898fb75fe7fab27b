"""``clusterbook demo``: an mpi4py allreduce on a local cluster, with how long each part took."""

from __future__ import annotations

import argparse
import os
import time

from clusterbook.cli.live import print_live
from clusterbook.cli.profiles import add_profile_option, profile_cluster

__all__ = ["add_demo"]


def add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to the ``clusterbook`` parser's subcommands."""
    demo = sub.add_parser(
        "demo", help="run an mpi4py allreduce on a local cluster (or a profile's)"
    )
    demo.add_argument("--workers", type=int, help="nodes (default 2)")
    demo.add_argument(
        "--slots",
        type=int,
        help="slots per node (default: the cores this process may use, shared among the nodes)",
    )
    demo.add_argument("--mpi", choices=["openmpi", "mpich"], help="MPI flavour to use")
    demo.add_argument("--python", metavar="PATH", help="interpreter for the ranks (with mpi4py)")
    add_profile_option(demo)
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from clusterbook.cluster.facade import Cluster

    t0 = time.perf_counter()
    options = {"mpi": args.mpi, "python": args.python}
    if args.profile is not None:  # --workers and --slots, where given, override the profile's
        nodes = {"workers": args.workers, "slots": args.slots}
        cluster = profile_cluster(args.profile, {**nodes, **options}, refused={})
    else:
        cluster = Cluster.local(workers=args.workers or 2, slots=args.slots, **options)
    with cluster:
        cluster.wait_ready(timeout=60)
        started = time.perf_counter()
        print(f"{cluster!r}\n")
        print(cluster.status().to_string(index=False), end="\n\n")
        program = os.path.join(os.path.dirname(os.path.dirname(__file__)), "_demo_rank.py")
        job = cluster.mpirun(["python", program], np=cluster.total_slots, timeout=120)
        print_live(job)
        result = job.wait()
        finished = time.perf_counter()
    print()
    print(result.summary())
    print(
        f"cluster start {started - t0:.3f} s, job {result.duration:.3f} s, "
        f"total {finished - t0:.3f} s; logs in {job.directory}"
    )
    return 0 if result.ok else 1
