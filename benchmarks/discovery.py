"""How fast host discovery changes a running SSH cluster on fake hosts.

Three fake hosts; a discovery command (``cat`` of a file) run every ``--every`` seconds lists
node1 and node2, and a job with ``restarts=`` and ``restart_on_join=True`` runs a sleeping
rank on each. Each run times, from the moment the file lists node3 too:

- **joined**: until node3 is one of ``cluster.nodes`` (bootstrapped, its agent in the round);
- **ranks on it**: until the relaunched job's rank on node3 has started;

then, from the moment the file drops node3 again:

- **relaunched without it**: until the job's next attempt has started its ranks on the two
  nodes left.

Beside them, for reference, the start of a new SSH cluster of node3 alone (``start()``, which
pays the same connection, checks, files and agent), and the discovery interval (a change is
seen up to one interval late). Medians of ``--repeat`` runs; no goal is judged.

    python benchmarks/discovery.py [--repeat 5] [--every 0.2]   (as root)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import clusterbook as cb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.testbed import Testbed, make_testbed

SLEEPER = """\
import os, socket, time
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
print("started", socket.gethostname(), os.environ["CLUSTERBOOK_RESTART"], flush=True)
time.sleep(600)
"""


def wait_for(check, t0: float, limit: float = 120.0) -> float:
    while not check():
        if time.monotonic() - t0 > limit:
            raise TimeoutError("no change within the limit")
        time.sleep(0.01)
    return time.monotonic() - t0


def started_on(job: cb.Job, restart: int, hosts: set[str]) -> bool:
    logs = job.logs()
    said = set(logs.line[logs.line.str.startswith("started ")])
    return all(f"started {h} {restart}" in said for h in hosts)


def once(bed: Testbed, work: Path, every: float) -> dict[str, float]:
    h1, h2, h3 = (h.addr for h in bed.hosts)
    hostlist = work / "hosts.txt"
    hostlist.write_text(f"{h1}\n{h2}\n")
    cluster = cb.Cluster.ssh(
        discover=f"cat {hostlist}",
        every=every,
        identity=bed.identity,
        known_hosts=bed.write_known_hosts(),
        run_dir=work / f"run-{time.monotonic_ns()}",
    )
    figures = {}
    with cluster:
        job = cluster.mpirun(["python", str(work / "sleeper.py")], restarts=3, restart_on_join=True)
        wait_for(lambda: started_on(job, 0, {"node1", "node2"}), time.monotonic())
        t0 = time.monotonic()
        hostlist.write_text(f"{h1}\n{h2}\n{h3}\n")
        figures["joined"] = wait_for(lambda: h3 in {n.host for n in cluster.nodes}, t0)
        figures["ranks on it"] = wait_for(lambda: started_on(job, 1, {"node3"}), t0)
        t0 = time.monotonic()
        hostlist.write_text(f"{h1}\n{h2}\n")
        figures["relaunched without it"] = wait_for(
            lambda: started_on(job, 2, {"node1", "node2"}), t0
        )
        job.cancel()
    alone = cb.Cluster.ssh(
        [h3], identity=bed.identity, known_hosts=bed.write_known_hosts(), run_dir=work / "alone"
    )
    t0 = time.monotonic()
    alone.start()
    figures["start() of node3 alone"] = time.monotonic() - t0
    alone.stop()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--every", type=float, default=0.2)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("fake hosts need root", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="cb-discovery-"))
    (work / "sleeper.py").write_text(SLEEPER)
    bed = make_testbed(3, work / "bed")
    try:
        runs = [once(bed, work, args.every) for _ in range(args.repeat)]
    finally:
        bed.close()
    print(f"clusterbook {cb.__version__}, 3 fake hosts, discovery every {args.every:g} s, ", end="")
    print(f"medians of {args.repeat} runs (min-max), seconds:")
    for key in runs[0]:
        values = [r[key] for r in runs]
        low, high = min(values), max(values)
        print(f"  {key:24s} {statistics.median(values):6.2f}  ({low:.2f}-{high:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
