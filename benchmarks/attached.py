"""Round trips of an attached handle through a detached cluster's control channel.

A local detached cluster (one node, two slots) runs in its supervisor; this process attaches
to it and times, as medians of ``--repeat`` runs:

- **first call**: a new handle's first request (``wait_ready``): it connects and proves the
  secret, then asks;
- **wait_ready**: the same request on a connection already open (the channel's own cost: the
  head has nothing to do for it);
- **run_on_nodes**: ``run_on_nodes(["true"])`` on a connection already open;
- **mpirun**: ``mpirun(["true"], np=1).wait()`` (the launcher's own start dominates it).

With ``--over-ssh`` (as root) the cluster runs on a fake host instead (a network namespace
with its own sshd and run root, see ``tests/testbed.py``), started there over ssh, and the
handle attaches with ``ssh://root@HOST/NAME``; besides the figures above it times:

- **attach**: ``cb.Cluster.attach(address)``: log in, start the reader there, find the cluster;
- **status**: ``status()`` on an open handle (one read of the record there);
- **logs**: ``job.logs()`` of a finished 2-rank job (a listing and one read);
- **ssh true**: one plain OpenSSH round (``ssh root@HOST true``), for scale.

The first call then includes starting the relay there (a Python start on that machine).

    python benchmarks/attached.py [--repeat 20] [--over-ssh]
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
    parser.add_argument("--over-ssh", action="store_true", help="the cluster on a fake host")
    args = parser.parse_args()
    if args.over_ssh:
        return over_ssh(args.repeat)
    cluster = cb.Cluster.local(1, 2, python=sys.executable, detached=True).start()
    try:
        cluster.wait_ready(30)
        attached = cb.Cluster.attach(cluster.id)
        attached.run_on_nodes(["true"])  # warm: the node's shell, this process's imports
        attached.mpirun(["true"], np=1).wait(60)

        def first_call() -> None:
            with cb.Cluster.attach(cluster.id) as handle:
                handle.wait_ready(30)

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


def over_ssh(repeat: int) -> int:
    """The figures of a handle attached over ssh to a cluster on a fake host."""
    import os
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.testbed import make_testbed

    if os.geteuid() != 0:
        print("--over-ssh makes a fake host: run it as root", file=sys.stderr)
        return 2
    state = Path.home() / ".local" / "state" / "clusterbook"
    python, name = sys.executable, f"bench-{os.getpid()}"
    with tempfile.TemporaryDirectory() as scratch, make_testbed(1, Path(scratch)) as bed:
        host = bed.hosts[0]
        own = Path(scratch) / "state"
        own.mkdir(mode=0o700)
        host.rebind([(own, state)])  # its clusters are not on this machine's file system
        starter = (
            "import sys, clusterbook as cb\n"
            "cb.Cluster.local(1, 2, python=sys.argv[1], name=sys.argv[2], detached=True).start()"
        )
        done = bed.ssh(host, [python, "-c", starter, python, name], timeout=120)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        address = f"ssh://root@{host.addr}/{name}"
        how = {"identity": str(bed.identity), "known_hosts": str(bed.known_hosts)}
        attached = cb.Cluster.attach(address, python=python, **how)
        try:
            attached.wait_ready(30)
            attached.run_on_nodes(["true"])  # warm, as above
            job = attached.mpirun(["true"], np=1)
            job.wait(60)
            two = attached.mpirun([python, "-c", "print('x' * 70)"], np=2)
            two.wait(60)

            def first_call() -> None:
                with cb.Cluster.attach(address, python=python, **how) as handle:
                    handle.wait_ready(30)

            def plain_ssh() -> None:
                bed.ssh(host, ["true"])

            def attach() -> None:
                cb.Cluster.attach(address, python=python, **how).close()

            figures = {
                "attach": timed(attach, repeat),
                "first call": timed(first_call, repeat),
                "wait_ready": timed(lambda: attached.wait_ready(30), repeat),
                "status": timed(attached.status, repeat),
                "logs": timed(two.logs, repeat),
                "run_on_nodes": timed(lambda: attached.run_on_nodes(["true"]), repeat),
                "mpirun": timed(lambda: attached.mpirun(["true"], np=1).wait(60), repeat),
                "ssh true": timed(plain_ssh, repeat),
            }
        finally:
            attached.stop()
            attached.close()
    print(f"clusterbook {cb.__version__}, attached over ssh to a detached cluster on a fake "
          f"host, medians of {repeat} (ms)")  # fmt: skip
    for what, ms in figures.items():
        print(f"  {what:14s} {ms:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
