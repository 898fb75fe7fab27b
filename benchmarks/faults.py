"""How fast an SSH cluster on fake hosts notices and cleans up after faults.

Two fake hosts, one rank each running a sleeper:

- **node cut off** (its link down, or every packet silently dropped): seconds from the cut
  until the head marks the node lost, until the job has failed naming it, and until the
  node's agent has stopped every process of the cluster's jobs there (its lease);
- **owner SIGKILLed**: seconds from the SIGKILL of the Python process that owns the cluster
  until every node has no process, key line or file of the cluster left.

Bounds (README, "Promises"): lost within the heartbeat budget (1 s x 3 after the last
heartbeat); a node's agent acts once it has lost the head for its lease (2 s); clean-up after
the owner's death within 3 s. Medians of ``--repeat`` runs.

    python benchmarks/faults.py [--repeat 3]   (as root)

The exit status is 1 when a bound is missed, 2 when not run as root.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

import clusterbook as cb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.testbed: the fake hosts
from tests.testbed import FakeHost, Testbed, make_testbed

SLEEPER = """\
import time
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
print("started", flush=True)
time.sleep(600)
"""
OWNER = """\
import sys
import clusterbook as cb
hosts, identity, known_hosts, run_dir, sleeper = sys.argv[1:]
cluster = cb.Cluster.ssh(hosts.split(","), identity=identity, known_hosts=known_hosts,
                         run_dir=run_dir, connect_timeout=10)
cluster.start()
job = cluster.mpirun(["python", sleeper], np=2)
seen = 0
for record in job.stream():
    seen += record.line == "started"
    if seen == 2:
        break
print("READY", cluster.id, flush=True)
sys.stdin.read()
"""
BOUNDS = {"lost": 3.0 + 1.0, "agent done": 2.0 + 2.0, "owner clean": 3.0}


def wait_for(condition: Callable[[], object], since: float, timeout: float = 30.0) -> float:
    """Seconds from ``since`` until ``condition()`` holds (polled every 10 ms)."""
    while not condition():
        if time.monotonic() - since > timeout:
            raise TimeoutError("condition not met")
        time.sleep(0.01)
    return time.monotonic() - since


def job_processes(host: FakeHost) -> list[int]:
    out = []
    for pid in host.processes():
        try:
            line = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if line[1:2] != ["-c"] and any(
            w in " ".join(line) for w in ("prted", "sleeper", "worker join")
        ):
            out.append(pid)
    return out


def cut_once(bed: Testbed, work: Path, how: str) -> dict[str, float]:
    node2 = bed.hosts[1]
    cluster = bed.cluster(sys.executable, work / f"run-{time.monotonic_ns()}", hosts=2)
    with cluster:
        job = cluster.mpirun(["python", str(work / "sleeper.py")], np=2, timeout=300)
        seen = 0
        for record in job.stream():
            seen += record.line == "started"
            if seen == 2:
                break
        t0 = time.monotonic()
        node2.link_down() if how == "link down" else node2.drop_traffic()
        try:
            status = lambda: cluster.status().set_index("node")  # noqa: E731
            lost = wait_for(lambda: status().loc[node2.addr, "state"] == "lost", t0)
            failed = wait_for(lambda: job.done(), t0)
            agent = wait_for(lambda: not job_processes(node2), t0)
        finally:
            node2.link_up() if how == "link down" else node2.pass_traffic()
    return {"lost": lost, "job failed": failed, "agent done": agent}


def owner_once(bed: Testbed, work: Path) -> float:
    hosts = ",".join(f"{h.addr}:1" for h in bed.hosts[:2])
    args = [hosts, str(bed.identity), str(bed.write_known_hosts()), str(work / "run-owner")]
    owner = subprocess.Popen(
        [sys.executable, str(work / "owner.py"), *args, str(work / "sleeper.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    cluster_id = owner.stdout.readline().split()[1]

    def clean() -> bool:
        return all(
            not job_processes(h)
            and "clusterbook:" not in h.authorized_keys.read_text()
            and not (h.home / ".clusterbook" / "clusters" / cluster_id).exists()
            for h in bed.hosts[:2]
        )

    t0 = time.monotonic()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    return wait_for(clean, t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("fake hosts need root", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="cb-faults-"))
    (work / "sleeper.py").write_text(SLEEPER)
    (work / "owner.py").write_text(OWNER)
    bed = make_testbed(2, work / "bed")
    ok = True
    try:
        print(f"clusterbook {cb.__version__}, 2 fake hosts, medians of {args.repeat} runs (s)")
        for how in ("link down", "silent drop"):
            runs = [cut_once(bed, work, how) for _ in range(args.repeat)]
            for key in ("lost", "job failed", "agent done"):
                value = statistics.median(r[key] for r in runs)
                bound = BOUNDS.get(key)
                verdict = "" if bound is None else (" PASS" if value <= bound else " MISS")
                ok &= bound is None or value <= bound
                limit = f" (bound {bound:g})" if bound else ""
                print(f"  {how:12s} {key:11s} {value:6.2f}{limit}{verdict}")
        owner = statistics.median(owner_once(bed, work) for _ in range(args.repeat))
        ok &= owner <= BOUNDS["owner clean"]
        verdict = "PASS" if owner <= BOUNDS["owner clean"] else "MISS"
        print(f"  owner SIGKILLed -> nodes clean {owner:6.2f} (bound 3) {verdict}")
    finally:
        bed.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
