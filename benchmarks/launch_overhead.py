"""Launch overhead of ``cluster.mpirun(...).wait()`` against the bare MPI launcher.

A 2-rank mpi4py hello program is launched, alternately, by clusterbook and by the launcher
as a user would type it with the same environment tuning (for Open MPI also without it, for
information), and wall times are compared. The goal is clusterbook/bare (median) <= 1.10.

    python benchmarks/launch_overhead.py [--repeat 20] [--mpich-python /path/to/python]

The exit status is 1 when a flavour misses the goal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import clusterbook as cb
from clusterbook.launch.command import OPENMPI_TUNING
from clusterbook.launch.rankwrap import WRAPPER

GOAL = 1.10
TIMEOUT = 60.0
HELLO = """\
from mpi4py import MPI

comm = MPI.COMM_WORLD
print(f"hello from rank {comm.Get_rank()} of {comm.Get_size()}", flush=True)
comm.Barrier()
"""


@dataclass
class Flavour:
    """One MPI flavour: its cluster, and the bare commands to compare it with."""

    title: str
    cluster: cb.Cluster
    bare: dict[str, tuple[list[str], dict[str, str]]]  # label -> (argv, environment)
    times: dict[str, list[float]] = field(default_factory=dict)
    launcher_argv: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.times = {label: [] for label in ["clusterbook", *self.bare]}

    def run(self, label: str, hello: Path) -> None:
        if label == "clusterbook":
            run_clusterbook(self, hello)
        else:
            argv, env = self.bare[label]
            run_bare(argv, env, hello.parent)


def run_clusterbook(flavour: Flavour, hello: Path) -> None:
    job = flavour.cluster.mpirun(["python", str(hello)], np=2, cwd=hello.parent)
    result = job.wait(timeout=TIMEOUT)
    if not result.ok:
        sys.exit(f"clusterbook job failed: {result.summary()}")
    if not flavour.launcher_argv:
        flavour.launcher_argv = json.loads((job.directory / "job.json").read_text())[
            "launcher_argv"
        ]


def run_bare(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    proc = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    if proc.returncode != 0 or "rank 1 of 2" not in proc.stdout:
        sys.exit(f"{shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


def make_flavour(cluster: cb.Cluster, hello: Path) -> Flavour:
    launcher = cluster.launcher
    mpich = launcher.flavour is cb.MPIFlavour.MPICH
    title = f"{'MPICH' if mpich else 'Open MPI'} {launcher.version} ({launcher.path})"
    program = [cluster.python, str(hello)]
    if mpich:
        mpiexec = Path(launcher.path).with_name("mpiexec")  # Hydra's mpirun is the same program
        path = str(mpiexec) if os.access(mpiexec, os.X_OK) else launcher.path
        bare = {"bare mpiexec": ([path, "-n", "2", *program], dict(os.environ))}
        return Flavour(title, cluster, bare)
    # Same rule as clusterbook: the tuning applies unless the variable is already set.
    tuned = {**OPENMPI_TUNING, **os.environ}
    untuned = {k: v for k, v in os.environ.items() if k not in OPENMPI_TUNING}
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    argv = [launcher.path, *root, "-n", "2", *program]
    bare = {"bare, same tuning": (argv, tuned), "bare, no tuning (info)": (argv, untuned)}
    return Flavour(title, cluster, bare)


def stats(times: list[float]) -> tuple[float, float, float]:
    """Median, min and 90th percentile, in ms."""
    ms = [t * 1000 for t in times]
    p90 = statistics.quantiles(ms, n=10, method="inclusive")[-1] if len(ms) > 1 else ms[0]
    return statistics.median(ms), min(ms), p90


def shown_argv(argv: list[str]) -> str:
    """The launcher command line, with the rank wrapper's sh script elided."""
    lines = WRAPPER.count("\n")
    return shlex.join(argv).replace(shlex.quote(WRAPPER), f"'<rank wrapper, {lines} lines>'")


def shown_bare(argv: list[str], env: dict[str, str]) -> str:
    """A bare command as typed in a shell, with the tuning variables it sets."""
    tuning = [f"{k}={env[k]}" for k in OPENMPI_TUNING if k in env]
    return shlex.join([*tuning, *argv])


def report(flavour: Flavour, repeat: int, warmup: int) -> bool:
    print(f"\n{flavour.title}: {repeat} runs each, after {warmup} warm-up rounds")
    print(f"  {'':26} {'median':>8} {'min':>8} {'p90':>8}  (ms)")
    for label, times in flavour.times.items():
        median, low, p90 = stats(times)
        print(f"  {label:26} {median:8.1f} {low:8.1f} {p90:8.1f}")
    cb_median = stats(flavour.times["clusterbook"])[0]
    bare_median = stats(flavour.times[next(iter(flavour.bare))])[0]
    ratio = cb_median / bare_median
    verdict = "PASS" if ratio <= GOAL else "MISS"
    print(f"  ratio clusterbook/bare (median): {ratio:.3f}   goal <= {GOAL:.2f}: {verdict}")
    print(f"  clusterbook ran: {shown_argv(flavour.launcher_argv)}")
    for label, (argv, env) in flavour.bare.items():
        print(f"  {label} ran: {shown_bare(argv, env)}")
    return ratio <= GOAL


def measure(repeat: int, warmup: int, mpich_python: str | None) -> bool:
    """Run every flavour's variants in turn, print the tables; True if every goal is met."""
    started = time.perf_counter()
    print(f"clusterbook {cb.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="cb-launch-") as tmp, contextlib.ExitStack() as stack:
        hello = Path(tmp, "hello.py")
        hello.write_text(HELLO)
        wanted = [(sys.executable, "openmpi")]
        if mpich_python:
            wanted.append((mpich_python, "mpich"))
        flavours = []
        for python, mpi in wanted:
            cluster = cb.Cluster.local(1, 2, run_dir=Path(tmp, mpi), python=python, mpi=mpi)
            flavours.append(make_flavour(stack.enter_context(cluster), hello))

        for round_ in range(warmup + repeat):
            for flavour in flavours:
                # Rotate the order every round so that no variant always runs right after
                # the same other one (caches, CPU frequency).
                labels = list(flavour.times)
                shift = round_ % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    t0 = time.perf_counter()
                    flavour.run(label, hello)
                    elapsed = time.perf_counter() - t0
                    if round_ >= warmup:
                        flavour.times[label].append(elapsed)

        results = [report(f, repeat, warmup) for f in flavours]
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    return all(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="counted runs (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="uncounted rounds (default 2)")
    parser.add_argument(
        "--mpich-python",
        default=os.environ.get("CLUSTERBOOK_MPICH_PYTHON"),
        help="python of an environment with MPICH and mpi4py "
        "(default: $CLUSTERBOOK_MPICH_PYTHON; MPICH is skipped when unset)",
    )
    args = parser.parse_args()
    if args.repeat < 1 or args.warmup < 0:
        parser.error("--repeat must be >= 1 and --warmup >= 0")

    try:
        ok = measure(args.repeat, args.warmup, args.mpich_python)
    except cb.ClusterError as exc:
        sys.exit(f"error: {exc}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
