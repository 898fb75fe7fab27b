"""Log capture at line rate: ranks printing as fast as they can, through clusterbook and
through the bare Open MPI launcher, in one run.

Two ranks print ``--lines`` lines each (short lines, written in big blocks, so the ranks are
not what limits the rate). Timed, alternately:

- clusterbook: ``cluster.mpirun(...).wait()`` on a local cluster; every line parsed, dated,
  written to ``rank-N.log`` and kept (up to the buffer's bound) for ``job.logs()``;
- bare: ``mpirun --output tag`` to a file, as a user would keep tagged output, and to
  ``/dev/null`` (the launcher alone).

Also printed: the time from the start of a job to its first line on the head (a program that
prints one line and sleeps), through clusterbook's live stream and through mpirun's pipe; the
head's own CPU (this process, user + system) per line, the lines counted in
the files and in ``job.logs()`` (none may be lost or out of order within a rank), and this
process's memory after each of several jobs (the buffer is bounded across a cluster's jobs).

    python benchmarks/logs.py [--lines 500000] [--repeat 3]

Goals: clusterbook / bare-to-file <= 1.25 (median), head CPU <= 2 us a line, memory bounded.
The exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clusterbook as cb
from clusterbook.launch.command import OPENMPI_TUNING

GOAL_RATIO, GOAL_CPU_US = 1.25, 2.0
PRINTER = """\
import sys
from mpi4py import MPI
rank, count = MPI.COMM_WORLD.rank, int(sys.argv[1])
block = 10_000
for start in range(0, count, block):
    sys.stdout.write("".join(f"rank {rank} line {i}\\n" for i in range(start, start + block)))
sys.stdout.flush()
"""


FIRST = """\
import time
from mpi4py import MPI
print(f"first from {MPI.COMM_WORLD.rank}", flush=True)
time.sleep(0.3)
"""


def first_line_bare(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting ``argv`` to its first line of output."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    proc.stdout.readline()
    took = time.perf_counter() - started
    proc.stdout.read()
    proc.wait(timeout=60)
    return took


def first_line_clusterbook(cluster: cb.Cluster, script: Path) -> float:
    started = time.perf_counter()
    job = cluster.mpirun(["python", str(script)], np=2)
    next(iter(job.stream()))
    took = time.perf_counter() - started
    job.wait(timeout=60)
    return took


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def check_files(job: cb.Job, lines: int) -> int:
    """Lines of each rank in its file, in order; return how many the files hold."""
    total = 0
    for rank in (0, 1):
        expected = 0
        with open(job.directory / f"rank-{rank}.log", encoding="utf-8") as f:
            for raw in f:
                text = raw.rstrip("\n").split(" ", 2)[2]
                if text != f"rank {rank} line {expected}":
                    sys.exit(f"rank {rank}: line {expected} is {text!r} in its file")
                expected += 1
        if expected != lines:
            sys.exit(f"rank {rank}: {expected} lines in its file, not {lines}")
        total += expected
    return total


def check_buffer(job: cb.Job, lines: int) -> int:
    """The lines ``job.logs()`` holds: the newest of each rank, in order, none missing."""
    frame = job.logs()
    held = 0
    for rank in (0, 1):
        got = frame.loc[frame["rank"] == rank, "line"].tolist()
        first = lines - len(got)
        if got != [f"rank {rank} line {i}" for i in range(first, lines)]:
            sys.exit(f"rank {rank}: job.logs() lost or reordered lines")
        held += len(got)
    return held


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=500_000, help="lines per rank")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="a Python with mpi4py")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cb-logs-"))
    printer = work / "printer.py"
    printer.write_text(PRINTER)
    mpirun = str(Path(args.python).parent / "mpirun")
    env = {**os.environ, **OPENMPI_TUNING}
    if os.geteuid() == 0:
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    bare = [mpirun, "-n", "2", "--oversubscribe", "--output", "tag", args.python]
    bare += [str(printer), str(args.lines)]
    first = work / "first.py"
    first.write_text(FIRST)
    firsts: dict[str, list[float]] = {"clusterbook": [], "bare": []}
    times: dict[str, list[float]] = {"clusterbook": [], "bare to a file": [], "bare to null": []}
    cpu_per_line: list[float] = []
    memory: list[float] = []
    counted = ""
    try:
        with cb.Cluster.local(1, 2, python=args.python, run_dir=work / "run") as cluster:
            import pandas  # noqa: F401 - job.logs() needs it: not a job's memory

            gc.collect()
            base = rss_mib()
            for _ in range(args.repeat):
                firsts["bare"].append(first_line_bare([*bare[:-3], args.python, str(first)], env))
                firsts["clusterbook"].append(first_line_clusterbook(cluster, first))
                for target in ("bare to a file", "bare to null"):
                    out = work / "bare.out" if target == "bare to a file" else Path(os.devnull)
                    with open(out, "wb") as f:
                        started = time.perf_counter()
                        subprocess.run(bare, stdout=f, env=env, check=True, timeout=600)
                        times[target].append(time.perf_counter() - started)
                cpu, started = cpu_seconds(), time.perf_counter()
                job = cluster.mpirun(["python", str(printer), str(args.lines)], np=2)
                result = job.wait(timeout=600)
                times["clusterbook"].append(time.perf_counter() - started)
                cpu_per_line.append((cpu_seconds() - cpu) / (2 * args.lines) * 1e6)
                if not result.ok:
                    sys.exit(f"clusterbook job failed: {result.summary()}")
                counted = (
                    f"{check_files(job, args.lines):,} lines in the files, "
                    f"{check_buffer(job, args.lines):,} in job.logs()"
                )
                gc.collect()
                memory.append(rss_mib() - base)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = 2 * args.lines
    print(
        f"2 ranks x {args.lines:,} lines, median of {args.repeat} (this machine: "
        f"{os.cpu_count()} cores)"
    )
    print(f"{'':<16}{'seconds':>9}{'lines/s':>12}")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"{label:<16}{median:>9.2f}{lines / median:>12,.0f}")
    ratio = statistics.median(times["clusterbook"]) / statistics.median(times["bare to a file"])
    cpu = statistics.median(cpu_per_line)
    print(f"clusterbook / bare to a file: {ratio:.2f} (goal <= {GOAL_RATIO})")
    print(f"head CPU per line: {cpu:.2f} us (goal <= {GOAL_CPU_US})")
    print(f"last job: {counted}")
    first_cb, first_bare = (statistics.median(firsts[k]) * 1e3 for k in ("clusterbook", "bare"))
    print(
        f"first line, from the start of the job: clusterbook {first_cb:.0f} ms, bare mpirun "
        f"{first_bare:.0f} ms ({first_cb - first_bare:+.0f} ms)"
    )
    print(
        "head memory after each job (MiB above the start): " + ", ".join(f"{m:.1f}" for m in memory)
    )
    return 0 if ratio <= GOAL_RATIO and cpu <= GOAL_CPU_US else 1


if __name__ == "__main__":
    sys.exit(main())
