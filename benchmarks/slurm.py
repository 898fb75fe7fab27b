"""Slurm clusters: how long ``Cluster.slurm(nodes=2)`` takes to be ready, next to a bare
2-node batch job on the same Slurm, and one MPI job through clusterbook next to bare ``srun``.

The test bed of ``tests/slurm_testbed.sh`` (slurmctld here, slurmd on the fake hosts snode1 and
snode2) is brought up for the run and taken down after it, whatever happens.

1. Ready: from ``Cluster.slurm(nodes=2)`` to ``start()`` + ``wait_ready()`` returning (both
   nodes joined, each with its sshd), against ``sbatch -N2 --wrap 'srun hostname'`` from
   submission to COMPLETED (squeue polled every 20 ms) on the idle Slurm. They take turns;
   medians. Goal: clusterbook <= 1.5x the bare job.

   slurmctld allocates queued jobs in a scheduling pass about once a second (on this test bed
   a job submitted to idle nodes waits for the next pass: 0 to 1 s). Turns taken one after the
   other would lock each side to its own phase of that second, so every run starts with both
   nodes idle, at a set phase after the last pass (read from slurmctld's log); the phases,
   spread over the second, are the same for both sides. One run of each, untimed, comes first
   (the first job of a fresh Slurm is slower).
2. MPI (unless ``--no-mpi``): an mpi4py allreduce of 4 ranks over both nodes,
   ``cluster.mpirun(...).wait()`` against ``srun --jobid=ID --overlap -N2 -n4 --mpi=pmix`` in
   the same allocation (the cluster's own job), the same environment for both (libfabric's
   probe off: ``OMPI_MCA_btl=^ofi``, ``OMPI_MCA_mtl=^ofi``). Goal: ratio <= 1.10.
   clusterbook starts the job as a step of the cluster's Slurm job too (``srun --mpi=pmix``,
   see ``clusterbook.launch.srun``); its first job, untimed, checks once that MPI gets its
   world through the plugin. For information, bare ``mpirun`` over the ssh path clusterbook
   takes when srun cannot start the job (the agents' sshd, the cluster's ssh config).
3. Scale (unless ``--no-scale``): a running ``Cluster.slurm(nodes=1, max_nodes=2)``, from
   ``cluster.scale(2)`` to a job with ranks on every slot (``hostname``, 4 ranks over both
   nodes) having run, against ``sbatch -N1 --wrap 'srun hostname'`` from submission to
   COMPLETED on the node left idle; each run then scales back to 1 node (untimed). The same
   phases as part 1. Goal: scale <= 1.5x the bare job. Its phases, medians: until the new node
   joined (``wait_ready()`` returns), until the job started (its nodes checked), until it ended.
   For information: what scaling adds to the bare job run at the same phase (the median of
   the differences: the wait for the pass, in both, left out), and the ratio of the means.
   ``--only-scale`` runs this part alone.

    python benchmarks/slurm.py [--repeat 5] [--no-mpi] [--no-scale | --only-scale]
    (as root, with Slurm)

clusterbook's bytecode is compiled first, as installing its wheel does: an editable checkout
under ``PYTHONDONTWRITEBYTECODE`` (this machine's shells set it) would otherwise compile its
modules again in every agent that starts (~80 ms of each agent's start here), which no
installed clusterbook pays.

The exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clusterbook as cb

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "tests" / "slurm_testbed.sh"
GOAL_READY = 1.5
GOAL_MPI = 1.10
POLL = 0.02
MPI_ENV = {"OMPI_MCA_btl": "^ofi", "OMPI_MCA_mtl": "^ofi"}
PROGRAM = """\
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(comm.rank, comm.size, socket.gethostname(), comm.allreduce(comm.rank))
"""


def last_pass(bed: Path) -> float:
    """When slurmctld's last scheduling pass allocated a job (epoch seconds, from its log)."""
    lines = (bed / "log" / "slurmctld.log").read_text().splitlines()
    stamp = next(ln for ln in reversed(lines) if "sched: Allocate" in ln)[1:24]
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def at_phase(bed: Path, phase: float, idle: int = 2) -> None:
    """Return with ``idle`` nodes idle, ``phase`` seconds after a scheduling pass."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, check=False
        ).stdout.split()
        if states.count("idle") >= idle:
            break
        time.sleep(POLL)
    else:
        sys.exit("the test bed's nodes did not become idle within 60 s")
    tick, now = last_pass(bed), time.time()
    target = tick + phase + math.ceil(now - tick - phase + 0.05)  # passes come once a second
    time.sleep(target - now)


def bare_batch_job(tmp: Path, nodes: int = 2) -> float:
    """Seconds from ``sbatch -N2 --wrap 'srun hostname'`` (``nodes``) to the job's COMPLETED."""
    t0 = time.perf_counter()
    out = str(tmp / "bare-%j.out")
    job = subprocess.run(
        ["sbatch", "--parsable", f"-N{nodes}", "-o", out, "--wrap", "srun hostname"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"],
            capture_output=True, text=True, check=False, timeout=30,
        ).stdout.strip()  # fmt: skip
        if state == "COMPLETED":
            return time.perf_counter() - t0
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            sys.exit(f"the bare batch job {job} ended {state}")
        time.sleep(POLL)
    sys.exit(f"the bare batch job {job} did not complete within 60 s")


def clusterbook_ready(tmp: Path, i: int) -> tuple[float, float]:
    """Seconds from ``Cluster.slurm(nodes=2)`` to ready, and then to stopped."""
    t0 = time.perf_counter()
    cluster = cb.Cluster.slurm(nodes=2, run_dir=tmp / f"ready-{i}")
    cluster.start(progress=False)
    try:
        cluster.wait_ready(timeout=60, progress=False)
        ready = time.perf_counter() - t0
    finally:
        t1 = time.perf_counter()
        cluster.stop()
    return ready, time.perf_counter() - t1


def mpi_side_by_side(tmp: Path, repeat: int) -> tuple[float, float, float]:
    """Median seconds of the MPI job through clusterbook, through bare srun, and through bare
    mpirun over the cluster's ssh path."""
    program = tmp / "allreduce.py"
    program.write_text(PROGRAM)
    through, bare, over_ssh = [], [], []
    with cb.Cluster.slurm(nodes=2, run_dir=tmp / "mpi") as cluster:
        cluster.wait_ready(timeout=60, progress=False)
        job_id = cluster._provider.job_id  # type: ignore[attr-defined]
        srun = ["srun", f"--jobid={job_id}", "--overlap", "-N2", "-n4", "--mpi=pmix"]
        env = {**os.environ, **MPI_ENV}
        remote = cluster._provider.reach.remote()  # type: ignore[attr-defined]
        hosts = ",".join(f"{n.host}:{n.slots}" for n in cluster.nodes)
        mpirun = [cluster.launcher.path, "--host", hosts, "-n", "4", "--allow-run-as-root"]
        mpirun += ["--prefix", cluster.launcher.prefix, "--prtemca", "plm_ssh_args"]
        mpirun += [" ".join(remote.ssh_args), "--prtemca", "plm_ssh_no_tree_spawn", "1"]
        # Untimed: the cluster's first job checks, once, that MPI gets its world through
        # srun's PMI plugin (about one MPI start); a cluster pays it once.
        cluster.mpirun(["python", str(program)], np=4, env=MPI_ENV, timeout=120).wait().check()
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = cluster.mpirun(["python", str(program)], np=4, env=MPI_ENV, timeout=120).wait()
            through.append(time.perf_counter() - t0)
            result.check()
            t0 = time.perf_counter()
            done = subprocess.run(
                [*srun, sys.executable, str(program)],
                env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            bare.append(time.perf_counter() - t0)
            _check(done, "bare srun")
            t0 = time.perf_counter()
            done = subprocess.run(
                [*mpirun, sys.executable, str(program)],
                env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            over_ssh.append(time.perf_counter() - t0)
            _check(done, "bare mpirun over ssh")
    return statistics.median(through), statistics.median(bare), statistics.median(over_ssh)


def scale_side_by_side(
    tmp: Path, bed: Path, repeat: int
) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """Seconds from ``scale(2)`` to a job over both nodes having run, and of the bare 1-node
    batch job, each run at the phases of part 1; and when, in each, the node had joined and
    the job had started."""
    scaled, bare, marks = [], [], []
    with cb.Cluster.slurm(nodes=1, max_nodes=2, run_dir=tmp / "scale") as cluster:
        cluster.wait_ready(timeout=60, progress=False)
        for i in range(repeat):
            phase = (i + 0.5) / repeat
            at_phase(bed, phase, idle=1)
            bare.append(bare_batch_job(tmp, nodes=1))
            at_phase(bed, phase, idle=1)
            t0 = time.perf_counter()
            cluster.scale(2)
            cluster.wait_ready(timeout=60, progress=False)
            t1 = time.perf_counter()
            job = cluster.mpirun(["hostname"], timeout=60)
            t2 = time.perf_counter()
            result = job.wait()
            scaled.append(time.perf_counter() - t0)
            marks.append((t1 - t0, t2 - t0))
            result.check()
            hosts = set(cluster.jobs[-1].logs().query("rank >= 0").line)
            if hosts != {"snode1", "snode2"}:
                sys.exit(f"the job after scale(2) ran on {sorted(hosts)}, not both nodes")
            cluster.scale(1)
    return scaled, bare, marks


def _check(done: subprocess.CompletedProcess[str], what: str) -> None:
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 4 or any(" 4 " not in ln for ln in lines):
        sys.exit(f"{what} failed ({done.returncode}): {done.stdout}{done.stderr}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (default 5)")
    parser.add_argument("--no-mpi", action="store_true", help="skip part 2")
    parser.add_argument("--no-scale", action="store_true", help="skip part 3")
    parser.add_argument("--only-scale", action="store_true", help="run part 3 only")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if os.geteuid() != 0 or shutil.which("slurmctld") is None:
        print("error: the Slurm test bed needs root and Slurm's packages.", file=sys.stderr)
        return 2
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    compileall.compile_dir(Path(cb.__file__).parent, quiet=1)  # as a wheel's install does
    missed = False
    with tempfile.TemporaryDirectory(prefix="cb-slurm-") as tmp:
        tmp_dir = Path(tmp)
        tmp_dir.chmod(0o755)  # munged wants every directory above its socket open to all
        bed = tmp_dir / "bed"
        up = subprocess.run(
            ["bash", str(TESTBED), "up", str(bed)], capture_output=True, text=True, check=False
        )
        if up.returncode != 0:
            print(f"error: the Slurm test bed did not come up:\n{up.stderr}", file=sys.stderr)
            return 2
        os.environ["SLURM_CONF"] = str(bed / "slurm.conf")
        try:
            print(f"clusterbook {cb.__version__}, Slurm test bed (2 nodes), {os.cpu_count()} CPUs")
            bare_batch_job(tmp_dir)  # untimed: the first job of a fresh Slurm is slower
            if not args.only_scale:
                missed |= ready_and_mpi(tmp_dir, bed, args.repeat, mpi=not args.no_mpi)
            if not args.no_scale:
                missed |= scale_part(tmp_dir, bed, args.repeat)
        finally:
            subprocess.run(["bash", str(TESTBED), "down", str(bed)], capture_output=True)
    return 1 if missed else 0


def ready_and_mpi(tmp_dir: Path, bed: Path, repeat: int, *, mpi: bool) -> bool:
    """Parts 1 and 2 (``mpi``); whether a goal was missed."""
    clusterbook_ready(tmp_dir, -1)
    ready, stopped, batch = [], [], []
    for i in range(repeat):
        phase = (i + 0.5) / repeat
        at_phase(bed, phase)
        batch.append(bare_batch_job(tmp_dir))
        at_phase(bed, phase)
        r, s = clusterbook_ready(tmp_dir, i)
        ready.append(r)
        stopped.append(s)
    b, r = statistics.median(batch), statistics.median(ready)
    print(f"{'':34} {'median':>8} {'min':>8} {'max':>8}")
    print(f"{'sbatch -N2 --wrap srun hostname':34} " + _row(batch))
    print(f"{'Cluster.slurm(nodes=2) to ready':34} " + _row(ready))
    print(f"{'  then stop() (job ended)':34} " + _row(stopped))
    ok = r <= GOAL_READY * b
    missed = not ok
    print(f"ready / bare batch job: {r / b:.2f}x (goal <= {GOAL_READY}x) {_ok(ok)}")
    if mpi:
        through, bare, over_ssh = mpi_side_by_side(tmp_dir, repeat)
        ok = through <= GOAL_MPI * bare
        missed |= not ok
        print(f"{'MPI job, 4 ranks: cluster.mpirun':34} {through:>8.3f}")
        print(f"{'MPI job, 4 ranks: srun --mpi=pmix':34} {bare:>8.3f}")
        print(f"{'  bare mpirun over the same ssh':34} {over_ssh:>8.3f}")
        print(f"mpirun / srun: {through / bare:.2f}x (goal <= {GOAL_MPI}x) {_ok(ok)}")
    return missed


def scale_part(tmp_dir: Path, bed: Path, repeat: int) -> bool:
    """Part 3, with its phases; whether its goal was missed."""
    scaled, one, marks = scale_side_by_side(tmp_dir, bed, repeat)
    s, b = statistics.median(scaled), statistics.median(one)
    print(f"{'':34} {'median':>8} {'min':>8} {'max':>8}")
    print(f"{'sbatch -N1 --wrap srun hostname':34} " + _row(one))
    print(f"{'scale 1 -> 2 nodes, ranks ran there':34} " + _row(scaled))
    print(f"{'  the new node joined':34} " + _row([m[0] for m in marks]))
    print(f"{'  the job started (nodes checked)':34} " + _row([m[1] for m in marks]))
    ok = s <= GOAL_READY * b
    print(f"scale / bare batch job: {s / b:.2f}x (goal <= {GOAL_READY}x) {_ok(ok)}")
    # Each pair ran at the same phase of Slurm's scheduling passes: their difference is what
    # scaling adds to a bare job, without the wait for the pass (0 to 1 s) in both.
    added = statistics.median(x - y for x, y in zip(scaled, one, strict=True))
    mean = statistics.fmean(scaled) / statistics.fmean(one)
    print(f"  for information: scale - bare at the same phase, median {added:.3f} s; "
          f"ratio of the means {mean:.2f}x")  # fmt: skip
    return not ok


def _row(values: list[float]) -> str:
    return f"{statistics.median(values):>8.3f} {min(values):>8.3f} {max(values):>8.3f}  (s)"


def _ok(ok: bool) -> str:
    return "ok" if ok else "MISSED"


if __name__ == "__main__":
    sys.exit(main())
