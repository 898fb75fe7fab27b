"""ipyparallel MPI engines and ``%%mpirun`` cells: clusterbook against its peers, in one run.

Two parts:

1. Engines to first result. clusterbook: ``cluster.engines(2)`` on a started local cluster
   (1 node, 2 slots), then a first ``%px``-style round trip: ``view.execute(code, block=True)``
   of an mpi4py allreduce on both engines. ipyparallel 9: ``ipyparallel.Cluster(n=2,
   engines="mpi").start_and_connect_sync()`` with the same round trip, as a user would write
   it (only ``mpiexec``'s path is given). Goal: clusterbook's median at most half of
   ipyparallel's. For information: clusterbook including ``Cluster.local().start()``, and
   ipyparallel tuned (controller heartbeat 500 ms, libfabric off: the tuning clusterbook
   applies to its own jobs).
2. ``%%mpirun -n 2`` in an IPython shell (``IPython.testing.globalipapp``): from running the
   cell to its first output line and to its end, against the bare launcher running the same
   code (``mpirun -n 2 python -c CODE``, same tuning). For information.

    python benchmarks/engines.py [--repeat 5] [--mpirun-repeat 10]

Variants alternate within every round (the order rotates); medians over ``--repeat`` rounds
after one warm-up round. The exit status is 1 when the goal is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import clusterbook as cb
from clusterbook.launch.command import OPENMPI_TUNING

GOAL = 0.5
TIMEOUT = 120.0
ALLREDUCE = """\
from mpi4py import MPI
total = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.Get_rank() + 1)
"""
HELLO = """\
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"hello from rank {comm.Get_rank()} of {comm.Get_size()}", flush=True)
comm.Barrier()
"""

os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def first_round_trip(client) -> None:  # type: ignore[no-untyped-def]
    """What ``%%px`` does with the allreduce cell, then a check of its result."""
    view = client[:]
    view.execute(ALLREDUCE, block=True)
    got = view["total"]
    if got != [3, 3]:
        sys.exit(f"allreduce on the engines gave {got}, not [3, 3]")


# -- part 1: engines --------------------------------------------------------------------------


class Engines:
    """The variants of part 1; each runs once per round, timed from start to first result."""

    def __init__(self, tmp: Path, launcher: cb.Launcher) -> None:
        self.tmp = tmp
        self.launcher = launcher
        self.cluster = cb.Cluster.local(1, 2, run_dir=tmp / "cluster").start()
        self.rounds = 0

    def close(self) -> None:
        self.cluster.stop()

    def variants(self) -> dict[str, Callable[[], float]]:
        return {
            "clusterbook engines(2)": self.clusterbook,
            "ipyparallel Cluster(engines='mpi')": lambda: self.ipyparallel(tuned=False),
            "clusterbook incl. Cluster.start() (info)": self.clusterbook_cold,
            "ipyparallel, tuned (info)": lambda: self.ipyparallel(tuned=True),
        }

    def clusterbook(self) -> float:
        t0 = time.perf_counter()
        client = self.cluster.engines(2, timeout=TIMEOUT)
        first_round_trip(client)
        elapsed = time.perf_counter() - t0
        self.cluster.stop_engines()
        return elapsed

    def clusterbook_cold(self) -> float:
        self.rounds += 1
        t0 = time.perf_counter()
        cluster = cb.Cluster.local(1, 2, run_dir=self.tmp / f"cold-{self.rounds}").start()
        try:
            first_round_trip(cluster.engines(2, timeout=TIMEOUT))
            return time.perf_counter() - t0
        finally:
            cluster.stop()

    def ipyparallel(self, *, tuned: bool) -> float:
        import ipyparallel as ipp
        from traitlets.config import Config

        config = Config()
        config.MPILauncher.mpi_cmd = [self.launcher.path]
        extra = {}
        if tuned:
            extra = {k: v for k, v in OPENMPI_TUNING.items() if k not in os.environ}
        os.environ.update(extra)  # what the engines inherit
        try:
            t0 = time.perf_counter()
            cluster = ipp.Cluster(
                n=2,
                engines="mpi",
                profile_dir=str(self.tmp / "ipython"),  # not the user's ~/.ipython
                config=config,
                controller_args=["--ping=500"] if tuned else [],
                log_level=40,
            )
            client = cluster.start_and_connect_sync()
            first_round_trip(client)
            elapsed = time.perf_counter() - t0
            client.close()
            cluster.stop_cluster_sync()
            return elapsed
        finally:
            for name in extra:
                os.environ.pop(name, None)


# -- part 2: %%mpirun -------------------------------------------------------------------------


class Stamped(io.StringIO):
    """A stream that notes when its first non-blank text arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.first: float | None = None

    def write(self, s: str) -> int:
        if self.first is None and s.strip():
            self.first = time.perf_counter()
        return super().write(s)


class Cells:
    """``%%mpirun -n 2`` against the bare launcher; each returns (first output, end) in s."""

    def __init__(self, launcher: cb.Launcher) -> None:
        from IPython import get_ipython
        from IPython.testing.globalipapp import start_ipython

        from clusterbook_widgets.magics import ClusterMagics

        self.ip = start_ipython() or get_ipython()
        self.magics = ClusterMagics(self.ip)
        self.ip.register_magics(self.magics)
        with contextlib.redirect_stdout(io.StringIO()):
            self.ip.run_line_magic("cluster", "local --workers 1 --slots 2")
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        self.bare_argv = [launcher.path, *root, "-n", "2", sys.executable, "-c", HELLO]
        self.bare_env = {**OPENMPI_TUNING, **os.environ}

    def close(self) -> None:
        self.magics.stop_cluster()

    def variants(self) -> dict[str, Callable[[], tuple[float, float]]]:
        return {"%%mpirun -n 2": self.cell, "bare mpirun -n 2": self.bare}

    def cell(self) -> tuple[float, float]:
        out, err = Stamped(), Stamped()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            self.ip.run_cell_magic("mpirun", "-n 2", HELLO)
        end = time.perf_counter()
        if "rank 1 of 2" not in out.getvalue() or out.first is None:
            sys.exit(f"%%mpirun cell failed:\n{out.getvalue()}{err.getvalue()}")
        return out.first - t0, end - t0

    def bare(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            self.bare_argv, env=self.bare_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None
        proc.stdout.readline()
        first = time.perf_counter()
        _, err = proc.communicate(timeout=TIMEOUT)
        end = time.perf_counter()
        if proc.returncode != 0:
            sys.exit(f"bare mpirun failed ({proc.returncode}):\n{err.decode(errors='replace')}")
        return first - t0, end - t0


# -- running and reporting --------------------------------------------------------------------


def rotate(labels: list[str], round_: int) -> list[str]:
    # No variant always runs right after the same other one (caches, CPU frequency).
    shift = round_ % len(labels)
    return labels[shift:] + labels[:shift]


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def part_engines(tmp: Path, launcher: cb.Launcher, repeat: int) -> bool:
    bench = Engines(tmp, launcher)
    runs = bench.variants()
    times: dict[str, list[float]] = {label: [] for label in runs}
    try:
        for round_ in range(1 + repeat):
            for label in rotate(list(runs), round_):
                elapsed = runs[label]()
                if round_ > 0:  # the first round warms caches up
                    times[label].append(elapsed)
    finally:
        bench.close()
    print(f"\n1. Engines to first result (2 engines, mpi4py allreduce): {repeat} runs each")
    print(f"  {'':42} {'median':>8} {'min':>8} {'max':>8}  (ms)")
    for label, values in times.items():
        print(
            f"  {label:42} {median_ms(values):8.0f} {min(values) * 1000:8.0f} "
            f"{max(values) * 1000:8.0f}"
        )
    ours = median_ms(times["clusterbook engines(2)"])
    theirs = median_ms(times["ipyparallel Cluster(engines='mpi')"])
    tuned = median_ms(times["ipyparallel, tuned (info)"])
    ratio = ours / theirs
    verdict = "PASS" if ratio <= GOAL else "MISS"
    print(f"  ratio clusterbook/ipyparallel (median): {ratio:.3f}   goal <= {GOAL:.2f}: {verdict}")
    print(f"  ratio clusterbook/ipyparallel tuned (info): {ours / tuned:.3f}")
    return ratio <= GOAL


def part_cells(launcher: cb.Launcher, repeat: int) -> None:
    bench = Cells(launcher)
    runs = bench.variants()
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in runs}
    try:
        for round_ in range(2 + repeat):
            for label in rotate(list(runs), round_):
                result = runs[label]()
                if round_ >= 2:
                    times[label].append(result)
    finally:
        bench.close()
    print(f"\n2. %%mpirun -n 2 cell vs bare mpirun (mpi4py hello): {repeat} runs each")
    print(f"  {'':20} {'first output':>13} {'end':>8}  (median ms)")
    for label, values in times.items():
        first = median_ms([f for f, _ in values])
        end = median_ms([e for _, e in values])
        print(f"  {label:20} {first:13.1f} {end:8.1f}")
    cell, bare = times["%%mpirun -n 2"], times["bare mpirun -n 2"]
    ratio_first = median_ms([f for f, _ in cell]) / median_ms([f for f, _ in bare])
    ratio_end = median_ms([e for _, e in cell]) / median_ms([e for _, e in bare])
    print(f"  ratio %%mpirun/bare (info): first output {ratio_first:.3f}, end {ratio_end:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="counted rounds, part 1 (5)")
    parser.add_argument("--mpirun-repeat", type=int, default=10, help="counted rounds, part 2 (10)")
    args = parser.parse_args()
    if args.repeat < 1 or args.mpirun_repeat < 1:
        parser.error("--repeat and --mpirun-repeat must be >= 1")
    import ipyparallel

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cb-engines-") as tmp:
        os.environ["CLUSTERBOOK_RUN_ROOT"] = tmp  # the %cluster magic's run directory
        try:
            launcher = cb.Cluster.local(1, 2).launcher
            print(
                f"clusterbook {cb.__version__}, ipyparallel {ipyparallel.__version__}, "
                f"{launcher.flavour.value} {launcher.version}, Python "
                f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, "
                f"load {os.getloadavg()[0]:.1f}"
            )
            ok = part_engines(Path(tmp), launcher, args.repeat)
            part_cells(launcher, args.mpirun_repeat)
        except cb.ClusterError as exc:
            sys.exit(f"error: {exc}")
    print(f"\ntotal {time.perf_counter() - started:.1f} s, load {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
