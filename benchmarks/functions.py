"""Functions as jobs against the bare MPI launcher, side by side on the same local cluster.

Part ``submit``: ``cluster.submit(fn, np=2).result()`` of a trivial function against
``mpirun -n 2 python -c pass`` (the same mpirun and python, the same environment tuning),
taking turns; medians over the repeats, and where clusterbook's time goes (one job's phases:
the call pickled and written, the launch, the wait, the values gathered and read). Goal:
clusterbook/bare (median) <= 1.2.

Part ``map``: ``cluster.map`` over 200 tiny items on 4 slots against ipyparallel's
``load_balanced_view().map_sync`` on 4 engines of the same cluster, and against one ``mpirun``
per item (``benchmarks/sweeps.py``). Goals: <= 1.5x ipyparallel, >= 20x faster than an mpirun
an item.

    python benchmarks/functions.py [--part submit|map] [--repeat 20] [--warmup 3] [--map-repeat 7]

The exit status is 1 when a part misses its goal. Each part is one function (``PARTS``).
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import clusterbook as cb
from clusterbook.launch.command import OPENMPI_TUNING

SUBMIT_GOAL = 1.2
TIMEOUT = 60.0


def trivial() -> int:
    return 0


def cpu_now() -> float:
    """CPU seconds of this process and of its children that ended (mpirun, the ranks)."""
    me, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def stats(times: list[float]) -> tuple[float, float, float]:
    """Median, min and 90th percentile, in ms."""
    ms = [t * 1000 for t in times]
    p90 = statistics.quantiles(ms, n=10, method="inclusive")[-1] if len(ms) > 1 else ms[0]
    return statistics.median(ms), min(ms), p90


def bare_command(cluster: cb.Cluster) -> tuple[list[str], dict[str, str]]:
    """``mpirun -n 2 python -c pass`` as a user types it, with clusterbook's tuning."""
    launcher = cluster.launcher
    if launcher.flavour is cb.MPIFlavour.MPICH:
        return [launcher.path, "-n", "2", cluster.python, "-c", "pass"], dict(os.environ)
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    argv = [launcher.path, *root, "-n", "2", cluster.python, "-c", "pass"]
    return argv, {**OPENMPI_TUNING, **os.environ}  # the tuning unless the variable is set


def part_submit(args: argparse.Namespace, tmp: Path) -> bool:
    """``cluster.submit`` of a trivial function on 2 ranks against bare ``mpirun``."""
    with cb.Cluster.local(1, 2, run_dir=tmp / "submit", python=args.python) as cluster:
        argv, env = bare_command(cluster)

        def bare() -> None:
            run = subprocess.run(argv, env=env, capture_output=True, timeout=TIMEOUT, check=False)
            if run.returncode != 0:
                sys.exit(f"{shlex.join(argv)} failed ({run.returncode}): {run.stderr!r}")

        def submit() -> None:
            values = cluster.submit(trivial, np=2).result(timeout=TIMEOUT)
            if values != [0, 0]:
                sys.exit(f"cluster.submit returned {values!r}")

        def mpirun() -> None:
            result = cluster.mpirun(["python", "-c", "pass"], np=2).wait(TIMEOUT)
            if not result.ok:
                sys.exit(result.summary())

        sides: dict[str, Callable[[], None]] = {
            "cluster.submit": submit,
            "bare mpirun": bare,
            "cluster.mpirun": mpirun,  # the launch alone, for where the time goes
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        cpu: dict[str, list[float]] = {name: [] for name in sides}
        for round_ in range(args.warmup + args.repeat):
            for name, side in sides.items():  # in turns: a drift of the machine hits both
                c0, t0 = cpu_now(), time.perf_counter()
                side()
                if round_ >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(cpu_now() - c0)
    print(f"\nPart submit: a trivial function on 2 ranks, {args.repeat} runs each")
    print(f"  {'':16} {'median':>8} {'min':>8} {'p90':>8} {'CPU':>8}  (ms; CPU: median of")
    print(f"  {'':16} {'':>35}  this process and mpirun's)")
    for name, each in times.items():
        median, low, p90 = stats(each)
        print(f"  {name:16} {median:8.1f} {low:8.1f} {p90:8.1f} {stats(cpu[name])[0]:8.1f}")
    print("  (cluster.mpirun: the same 'python -c pass' through clusterbook, for information)")
    ratio = stats(times["cluster.submit"])[0] / stats(times["bare mpirun"])[0]
    by_cpu = stats(cpu["cluster.submit"])[0] / stats(cpu["bare mpirun"])[0]
    print(f"  CPU submit/bare (median): {by_cpu:.3f}")
    verdict = "PASS" if ratio <= SUBMIT_GOAL else "MISS"
    print(f"  ratio submit/bare (median): {ratio:.3f}   goal <= {SUBMIT_GOAL:.1f}: {verdict}")
    tuning = [f"{k}={env[k]}" for k in OPENMPI_TUNING if k in env]
    print(f"  bare ran: {shlex.join([*tuning, *argv])}")
    return ratio <= SUBMIT_GOAL


def part_map(args: argparse.Namespace, tmp: Path) -> bool:
    """(b) ``cluster.map`` over many tiny items on 4 slots against ipyparallel's
    ``load_balanced_view().map_sync`` on 4 engines of the same cluster, and against one
    ``mpirun`` per item (``benchmarks/sweeps.py``, which also runs alone)."""
    print(f"\nPart map: {args.items} tiny items, {args.map_repeat} rounds", flush=True)
    # Run as a script of its own, so that its function is __main__'s and travels by value
    # (to clusterbook's pool and to ipyparallel's engines alike).
    script = Path(__file__).with_name("sweeps.py")
    argv = [sys.executable, str(script), "--repeat", str(args.map_repeat)]
    argv += ["--items", str(args.items), "--sample", str(args.sample)]
    return subprocess.run(argv, check=False).returncode == 0


PARTS: dict[str, Callable[[argparse.Namespace, Path], bool]] = {
    "submit": part_submit,
    "map": part_map,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=sorted(PARTS), action="append")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="the ranks' interpreter")
    parser.add_argument("--map-repeat", type=int, default=7, help="rounds of part map (7)")
    parser.add_argument("--items", type=int, default=200, help="items a sweep, part map (200)")
    parser.add_argument("--sample", type=int, default=20, help="mpirun starts a round, part map")
    args = parser.parse_args()
    print(f"clusterbook {cb.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    ok = True
    with tempfile.TemporaryDirectory(prefix="cb-functions-") as tmp:
        for part in args.part or sorted(PARTS):
            ok = PARTS[part](args, Path(tmp)) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
