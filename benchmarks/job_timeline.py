"""Where a short job's time goes in the head: before its launcher starts, the launcher's own run,
after it exits until the result is in the caller's hands; for ``cluster.submit`` of a trivial
function and ``cluster.mpirun`` of ``python -c pass`` on 2 ranks of a local cluster, beside bare
``mpirun -n 2 python -c pass`` (started and waited for from this process).

A profiling aid for ``functions.py --part submit``: it takes its timestamps by wrapping two of
the launcher's internals in this process (the launcher's start and its wait), so its figures are
a breakdown, not a comparison with a peer. Medians over ``--repeat`` jobs after a warm-up.

    python benchmarks/job_timeline.py [--repeat 30]

Unset ``PYTHONDONTWRITEBYTECODE`` first: with it, every rank compiles the rank hook again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import clusterbook as cb
from clusterbook.launch import attempt
from clusterbook.launch.direct import prterun_start
from clusterbook.launch.flavour import find_launcher
from clusterbook.launch.rankwrap import HOOK_DIR
from clusterbook.nodes.tasks.procs import tagged

STAMPS: dict[str, float] = {}


def _stamping_spawn() -> None:
    """Have the launcher's start and the moment its process is reaped leave timestamps."""
    spawn = attempt.procs.spawn

    def stamped(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        STAMPS["start"] = time.perf_counter()
        proc = spawn(*args, **kwargs)
        STAMPS["started"] = time.perf_counter()
        wait = proc.wait

        def waited(*a: Any, **k: Any) -> int:
            code = wait(*a, **k)
            STAMPS.setdefault("exited", time.perf_counter())
            return code

        proc.wait = waited  # type: ignore[method-assign]
        return proc

    attempt.procs.spawn = stamped  # type: ignore[assignment]


def _prterun(env: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """The prterun that this Python's mpirun execs and the environment it would give it (as
    clusterbook's jobs start it: :mod:`clusterbook.launch.direct`), or None."""
    launcher = find_launcher(sys.executable)
    start = prterun_start(launcher.path, launcher.prterun_sets, {})
    return None if start is None else (start[0], {**env, **start[1]})


def taken_apart(argv: list[str], env: dict[str, str], repeat: int, warmup: int) -> dict[str, float]:
    """Medians (ms) of the cluster's launcher command ``argv`` as it is, and less the rank
    wrapper, the rank hook, core binding or tagged output (``env``: the benchmark's)."""
    at = argv.index("/bin/sh")
    wrapper = argv[at : at + 4]
    assert wrapper[1:4:2] == ["-c", "cb-rank"]
    named = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    hooked = {
        **env,
        **{n: "0" for n in named},
        "PYTHONPATH": HOOK_DIR,
        "CLUSTERBOOK_RANK_HOOK": "1",
    }
    if argv[0].endswith("prterun"):
        learned = find_launcher(sys.executable).prterun_sets or ()
        hooked |= dict(learned)
    plain = [*argv[:at], *argv[at + 4 :]]
    unhooked = {k: v for k, v in hooked.items() if k not in ("PYTHONPATH", "CLUSTERBOOK_RANK_HOOK")}
    no_x = []
    for a in plain:
        if no_x and no_x[-1] == "-x" and a in ("PYTHONPATH", "CLUSTERBOOK_RANK_HOOK"):
            no_x.pop()
            continue
        no_x.append(a)
    bind = argv.index("--bind-to")
    output = argv.index("--output")
    cases = {
        "as the cluster runs it": (argv, hooked),
        "without the rank wrapper": (plain, hooked),
        "without the rank wrapper and the rank hook": (no_x, unhooked),
        "--bind-to none": ([*argv[: bind + 1], "none", *argv[bind + 2 :]], hooked),
        "without --output tag": ([*argv[:output], *argv[output + 2 :]], hooked),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for i in range(warmup + repeat):
        for what, (line, variables) in cases.items():
            t0 = time.perf_counter()
            subprocess.run(line, env=variables, check=True, capture_output=True)
            if i >= warmup:
                times[what].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def trivial() -> int:
    return 1


def timeline(run: Callable[[], None], repeat: int, warmup: int) -> dict[str, float]:
    rows = []
    for i in range(warmup + repeat):
        STAMPS.clear()
        t0 = time.perf_counter()
        run()
        t1 = time.perf_counter()
        if i >= warmup:
            rows.append(
                {
                    "before the launcher": STAMPS["start"] - t0,
                    "starting it": STAMPS["started"] - STAMPS["start"],
                    "its run": STAMPS["exited"] - STAMPS["started"],
                    "after it exits": t1 - STAMPS["exited"],
                    "total": t1 - t0,
                }
            )
    return {k: statistics.median(r[k] for r in rows) * 1000 for k in rows[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set: every rank compiles the rank hook again")
    _stamping_spawn()
    load = os.getloadavg()[0]
    print(f"clusterbook {cb.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"load {load:.2f}; medians of {args.repeat} (ms)\n")
    jobs: list[cb.Job] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        cb.Cluster.local(1, 2, run_dir=Path(tmp) / "c") as cluster,
    ):
        figures = {
            "cluster.submit": timeline(
                lambda: cluster.submit(trivial, np=2).result(timeout=60),
                args.repeat,
                args.warmup,
            ),
            "cluster.mpirun": timeline(
                lambda: (
                    jobs.append(cluster.mpirun(["python", "-c", "pass"], np=2)) or jobs[-1].wait(60)
                ),
                args.repeat,
                args.warmup,
            ),
        }
        saved = json.loads((jobs[-1].directory / "job.json").read_text())["launcher_argv"]
        hosts = (jobs[-1].directory / "hostfile").read_text()
    env = {**os.environ, "OMPI_MCA_btl": "^ofi", "OMPI_MCA_mtl": "^ofi"}
    mpirun = str(Path(sys.executable).parent / "mpirun")
    argv = [mpirun, "--allow-run-as-root", "-n", "2", sys.executable, "-c", "pass"]
    bare = []
    for i in range(args.warmup + args.repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True)
        if i >= args.warmup:
            bare.append(time.perf_counter() - t0)
    direct = _prterun(env)
    if direct is not None:
        bare_direct = []
        for i in range(args.warmup + args.repeat):
            t0 = time.perf_counter()
            subprocess.run([direct[0], *argv[1:]], env=direct[1], check=True)
            if i >= args.warmup:
                bare_direct.append(time.perf_counter() - t0)
    names = list(figures["cluster.submit"])
    print(f"  {'':22}" + "".join(f"{k:>16}" for k in figures) + f"{'bare mpirun':>16}")
    for name in names:
        cells = "".join(f"{figures[k][name]:16.2f}" for k in figures)
        extra = f"{statistics.median(bare) * 1000:16.2f}" if name in ("its run", "total") else ""
        print(f"  {name:22}{cells}{extra}")
    print("\n  bare mpirun: its run and total are the same (started and reaped by this process)")
    if direct is not None:
        print(
            f"  the prterun that mpirun execs, started directly with the variables mpirun sets: "
            f"{statistics.median(bare_direct) * 1000:.2f} ms"
        )
    print("\n  its run, taken apart: the cluster's own launcher command, less one thing each")
    with tempfile.TemporaryDirectory() as tmp:
        hostfile = Path(tmp) / "hostfile"
        hostfile.write_text(hosts)
        saved[saved.index("--hostfile") + 1] = str(hostfile)
        for what, ms in taken_apart(saved, env, args.repeat, args.warmup).items():
            print(f"  {what:50}{ms:8.2f}")
    sweeps = []
    for _ in range(20):
        t0 = time.perf_counter()
        tagged(["no-such-job"])
        sweeps.append(time.perf_counter() - t0)
    count = sum(1 for name in os.listdir("/proc") if name.isdigit())
    print(
        f"  after it exits includes one sweep of /proc for the job's leftovers: "
        f"{statistics.median(sweeps) * 1000:.2f} ms over the {count} processes here"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
