"""The first job of an elastic cluster whose nodes just joined: from ``wait_ready()`` until the
job's end, when the nodes' agents checked their node themselves and when the head logs in to
check it; beside it, a bare ``mpirun --host`` over ssh to the same hosts (a login per node).

An elastic cluster of the testbed's fake hosts, each agent inside its host with an sshd of its
own (``--start-sshd``), 2 slots a host, ``hostname`` on every slot. Each round starts a new
cluster on each side, one side after the other:

- **agents probed** (the join command as the cluster prints it): with ``--probe-mpi``, each
  agent checks its node for the cluster's MPI while it joins, and reports what it found; the
  head checks the node from that report (no login).
- **head logs in**: the same command without ``--probe-mpi`` (as an older cluster printed it):
  the head checks each node that joins over a login to its sshd, and the first job waits for
  that check where it is not done yet.
- **bare mpirun --host**: ``mpirun --host H1:2,H2:2 hostname`` with the testbed's key, a new
  ssh login per node (no check of the nodes at all).

    python benchmarks/first_job.py [--repeat 6] [--hosts 2]     (as root: fake hosts)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clusterbook as cb
from clusterbook.launch.command import OPENMPI_TUNING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.testbed: the fake hosts
from benchmarks.warm import bare_argv, end_agent
from tests.testbed import FakeHost, Testbed, agent_argv, make_testbed

TIMEOUT = 60.0


def agent(host: FakeHost, cluster: cb.Cluster, work: Path, probe: bool) -> list[str]:
    """The command of an agent of ``cluster`` inside ``host`` with an sshd of its own; without
    the join command's ``--probe-mpi`` where ``probe`` is false."""
    argv = agent_argv(host, cluster, work, "--slots", "2", "--start-sshd", "2222")
    if not probe:
        words = shlex.split(argv[-1].rpartition("exec ")[2])
        at = words.index("--probe-mpi")
        del words[at : at + 2]
        argv[-1] = argv[-1].rpartition("exec ")[0] + "exec " + shlex.join(words)
    return argv


def cluster_once(bed: Testbed, hosts: int, work: Path, probe: bool) -> float:
    """Seconds from ``wait_ready()`` until the end of a new cluster's first job."""
    agents: list[subprocess.Popen[bytes]] = []
    try:
        cluster = cb.Cluster.elastic(
            hosts, hosts, listen=bed.head_addr, last_call=0.1, python=sys.executable, run_dir=work
        )
        with contextlib.redirect_stdout(None), cluster:  # (not its join command each round)
            for host in bed.hosts[:hosts]:
                argv = agent(host, cluster, work, probe)
                agents.append(
                    subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
            cluster.wait_ready(timeout=TIMEOUT, progress=False)
            start = time.perf_counter()
            cluster.mpirun(["hostname"], np=2 * hosts, timeout=TIMEOUT).wait().check()
            return time.perf_counter() - start
    finally:
        for proc in agents:
            end_agent(proc)


def bare_once(bed: Testbed, hosts: int, work: Path) -> float:
    argv = bare_argv(bed, hosts, ["hostname"], None)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            argv,
            env={**OPENMPI_TUNING, **os.environ},
            cwd=work,
            capture_output=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        # Open MPI 5.0's daemons now and then miss a short rank's end, and mpirun then waits
        # for good (clusterbook.launch.linger): not counted.
        return math.nan
    if done.returncode != 0:
        sys.exit(f"bare mpirun failed ({done.returncode}): {done.stderr.decode()}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--hosts", type=int, default=2)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("fake hosts need root", file=sys.stderr)
        return 2
    print(f"clusterbook {cb.__version__}, {os.cpu_count()} CPUs, {args.hosts} hosts x 2 slots")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the fake hosts go all the same
    sides = ("agents probed", "head logs in", "bare mpirun --host")
    times: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        work = Path(scratch)
        bed = make_testbed(args.hosts, work / "bed")
        stack.callback(bed.close)
        for round_ in range(args.repeat + 1):  # the first round warms the caches up
            got = [
                cluster_once(bed, args.hosts, work / f"p{round_}", probe=True),
                cluster_once(bed, args.hosts, work / f"l{round_}", probe=False),
                bare_once(bed, args.hosts, work),
            ]
            said = " ".join(f"{t * 1000:.0f}" for t in got)
            print(f"round {round_}: {said} ms", file=sys.stderr, flush=True)
            if round_:
                for side, seconds in zip(sides, got, strict=True):
                    times[side].append(seconds)
    print(f"\nfrom wait_ready() to the first job's end, {args.repeat} runs each (ms):")
    for side, runs in times.items():
        runs_ms = " ".join(f"{t * 1000:.0f}" for t in runs)
        counted = [t for t in runs if not math.isnan(t)]
        hung = len(runs) - len(counted)
        note = f", {hung} hung and stopped after {TIMEOUT:g} s (not counted)" if hung else ""
        print(f"  {side:22} median {statistics.median(counted) * 1000:5.0f}   ({runs_ms}){note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
