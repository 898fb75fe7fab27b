"""``cluster.map`` over many tiny items: clusterbook's pool against ipyparallel and against one
MPI start per item, side by side in one run on the same local cluster of 4 slots.

Three ways to run ``tiny(x) = x + 1`` over ``--items`` items (200):

1. ``cluster.map(tiny, items)``, its pool of 4 ranks already up (the first sweep, which starts
   the pool, is timed apart, for information).
2. ipyparallel: ``client.load_balanced_view().map_sync(tiny, items)`` on 4 engines of the same
   cluster (``cluster.engines(4)``, controller on this machine, engines as an MPI job).
3. One MPI start per item: ``mpirun -n 1 python -c CODE`` (bare, with the tuning clusterbook
   gives its own jobs: libfabric off), timed over ``--sample`` items (20) and scaled to
   ``--items``: the floor of "one job per item", without even clusterbook's job bookkeeping.

Goals: map at most 1.5x ipyparallel's median, and at least 20x faster than one mpirun per item.

    python benchmarks/sweeps.py [--repeat 7] [--items 200] [--sample 20]

Variants alternate within every round (the order rotates); medians over ``--repeat`` rounds
after one warm-up round. The exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
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

GOAL_IPYPARALLEL = 1.5  # map's time over ipyparallel's, at most
GOAL_MPIRUN = 20.0  # one mpirun per item's time over map's, at least
TIMEOUT = 120.0
TINY = "x = 1\nx + 1\n"

os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def tiny(x: int) -> int:
    return x + 1


def rotate(items: list[str], by: int) -> list[str]:
    by %= len(items)
    return items[by:] + items[:by]


class Sweeps:
    """The three variants on one started local cluster of 4 slots; each returns seconds."""

    def __init__(self, tmp: Path, items: int, sample: int) -> None:
        self.items, self.sample = list(range(items)), sample
        self.cluster = cb.Cluster.local(1, 4, run_dir=tmp / "run").start()
        started = time.perf_counter()
        self.check(self.cluster.map(tiny, self.items, progress=False))
        self.first = time.perf_counter() - started  # the pool's start included
        self.client = self.cluster.engines(4, progress=False)
        self.view = self.client.load_balanced_view()
        launcher = self.cluster.launcher
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        self.bare_argv = [launcher.path, *root, "-n", "1", sys.executable, "-c", TINY]
        self.bare_env = {**OPENMPI_TUNING, **os.environ}

    def close(self) -> None:
        self.client.close()
        self.cluster.stop()

    def check(self, values: object) -> None:
        if list(values) != [x + 1 for x in self.items]:  # type: ignore[call-overload]
            sys.exit(f"wrong values: {values!r}")

    def variants(self) -> dict[str, Callable[[], float]]:
        return {
            "cluster.map": self.map,
            "ipyparallel map_sync": self.ipyparallel,
            "mpirun per item": self.mpirun_each,
        }

    def map(self) -> float:
        t0 = time.perf_counter()
        values = self.cluster.map(tiny, self.items, progress=False)
        elapsed = time.perf_counter() - t0
        self.check(values)
        return elapsed

    def ipyparallel(self) -> float:
        t0 = time.perf_counter()
        values = self.view.map_sync(tiny, self.items)
        elapsed = time.perf_counter() - t0
        self.check(values)
        return elapsed

    def mpirun_each(self) -> float:
        t0 = time.perf_counter()
        for _ in range(self.sample):
            done = subprocess.run(
                self.bare_argv, env=self.bare_env, capture_output=True, timeout=TIMEOUT
            )
            if done.returncode != 0:
                sys.exit(f"mpirun failed ({done.returncode}):\n{done.stderr.decode()}")
        return (time.perf_counter() - t0) * len(self.items) / self.sample


def report(times: dict[str, list[float]], first: float, items: int, sample: int) -> bool:
    med = {label: statistics.median(values) for label, values in times.items()}
    print(f"\n{items} tiny items on 4 slots, {len(times['cluster.map'])} rounds (median s):")
    for label, value in med.items():
        note = f"  (scaled from {sample} items)" if label == "mpirun per item" else ""
        print(f"  {label:22} {value:9.3f} s  {value / items * 1e3:7.2f} ms/item{note}")
    print(f"  {'first cluster.map':22} {first:9.3f} s  (pool start included; information)")
    over_ipp = med["cluster.map"] / med["ipyparallel map_sync"]
    faster = med["mpirun per item"] / med["cluster.map"]
    ok_ipp, ok_mpirun = over_ipp <= GOAL_IPYPARALLEL, faster >= GOAL_MPIRUN
    print(
        f"  map / ipyparallel: {over_ipp:.2f}x (goal <= {GOAL_IPYPARALLEL}x) "
        f"{'met' if ok_ipp else 'MISSED'}"
    )
    print(
        f"  mpirun per item / map: {faster:.1f}x faster (goal >= {GOAL_MPIRUN:g}x) "
        f"{'met' if ok_mpirun else 'MISSED'}"
    )
    return ok_ipp and ok_mpirun


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="counted rounds (7)")
    parser.add_argument("--items", type=int, default=200, help="items per sweep (200)")
    parser.add_argument("--sample", type=int, default=20, help="mpirun starts per round (20)")
    args = parser.parse_args()
    if min(args.repeat, args.items, args.sample) < 1:
        parser.error("--repeat, --items and --sample must be >= 1")
    return 0 if run(args.repeat, args.items, args.sample) else 1


def run(repeat: int, items: int, sample: int) -> bool:
    """The three variants side by side (see the module docstring); whether the goals are met
    (also ``benchmarks/functions.py --part map``)."""
    import ipyparallel

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cb-sweeps-") as tmp:
        bench = Sweeps(Path(tmp), items, sample)
        launcher = bench.cluster.launcher
        print(
            f"clusterbook {cb.__version__}, ipyparallel {ipyparallel.__version__}, "
            f"{launcher.flavour.value} {launcher.version}, Python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        times: dict[str, list[float]] = {label: [] for label in bench.variants()}
        try:
            runs = bench.variants()
            for round_ in range(1 + repeat):
                for label in rotate(list(runs), round_):
                    elapsed = runs[label]()
                    if round_ >= 1:
                        times[label].append(elapsed)
        finally:
            bench.close()
        ok = report(times, bench.first, items, sample)
    print(f"\ntotal {time.perf_counter() - started:.1f} s, load {os.getloadavg()[0]:.1f}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
