"""Round trips of an attached handle through a detached cluster's control channel.

A local detached cluster (one node, two slots) runs in its supervisor; this process attaches
to it and times, as medians of ``--repeat`` runs:

- **first call**: a new handle's first request (``wait_ready``): it connects and proves the
  secret, then asks;
- **wait_ready**: the same request on a connection already open (the channel's own cost: the
  head has nothing to do for it);
- **run_on_nodes**: ``run_on_nodes(["true"])`` on a connection already open;
- **mpirun**: ``mpirun(["true"], np=1).wait()`` (the launcher's own start dominates it).

    python benchmarks/attached.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import clusterbook as cb


def timed(action: Callable[[], object], repeat: int) -> float:
    """The median of ``repeat`` timed calls of ``action``, in milliseconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        action()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    cluster = cb.Cluster.local(1, 2, python=sys.executable, detached=True).start()
    try:
        cluster.wait_ready(30)
        attached = cb.Cluster.attach(cluster.id)
        attached.run_on_nodes(["true"])  # warm: the node's shell, this process's imports
        attached.mpirun(["true"], np=1).wait(60)

        def first_call() -> None:
            handle = cb.Cluster.attach(cluster.id)
            handle.wait_ready(30)
            if handle._client is not None:
                handle._client.close()

        figures = {
            "first call": timed(first_call, args.repeat),
            "wait_ready": timed(lambda: attached.wait_ready(30), args.repeat),
            "run_on_nodes": timed(lambda: attached.run_on_nodes(["true"]), args.repeat),
            "mpirun": timed(lambda: attached.mpirun(["true"], np=1).wait(60), args.repeat),
        }
    finally:
        cluster.stop()
    print(f"clusterbook {cb.__version__}, attached to a local detached cluster, medians of "
          f"{args.repeat} (ms)")  # fmt: skip
    for what, ms in figures.items():
        print(f"  {what:14s} {ms:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
