"""What clusterbook adds to the start of every Python rank, against the same Python started bare.

Every rank of a job runs under the rank wrapper (``sh -c WRAPPER cb-rank PROGRAM``: the
torch variables, the start and exit markers) and, for Python programs, loads the rank hook
(``sitecustomize`` on ``PYTHONPATH``: stack dumps on SIGUSR1, abort on an uncaught error), which
then runs the Python's own ``sitecustomize`` if it has one (Ubuntu's has). This starts
``python -c pass`` each way, in turns, and prints medians; then the imports of the slowest
modules with and without the hook (``-X importtime``, medians), to say where a difference is.

    python benchmarks/rank_start.py [--repeat 30] [--python PYTHON]

Unset ``PYTHONDONTWRITEBYTECODE`` first: with it, every start compiles the hook again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from clusterbook.launch.rankwrap import HOOK_DIR, wrap_argv

HIDDEN = ("PYTHONPATH", "CLUSTERBOOK_RANK_HOOK")


def cases(python: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    base = {k: v for k, v in os.environ.items() if k not in HIDDEN}
    hook = {**base, "PYTHONPATH": HOOK_DIR, "CLUSTERBOOK_RANK_HOOK": "1"}
    argv = [python, "-c", "pass"]
    return {
        "bare": (argv, base),
        "rank hook": (argv, hook),
        "wrapper": (wrap_argv(argv), base),
        "wrapper + hook": (wrap_argv(argv), hook),
    }


def importtime(argv: list[str], env: dict[str, str], repeat: int) -> dict[str, list[int]]:
    """Cumulative microseconds of each module ``argv`` imports, over ``repeat`` starts."""
    seen: dict[str, list[int]] = {}
    for _ in range(repeat):
        err = subprocess.run(
            [argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True
        ).stderr
        for line in err.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[1].strip().isdigit():
                seen.setdefault(parts[2].strip(), []).append(int(parts[1]))
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30, help="starts each way (default 30)")
    parser.add_argument("--python", default=sys.executable, help="the ranks' Python")
    args = parser.parse_args()
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set: the hook is compiled at every start")
    ways = cases(args.python)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.repeat + 3):
        for name, (argv, env) in ways.items():
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, check=True, stderr=subprocess.DEVNULL)
            if round_ >= 3:  # the first starts warm the caches
                times[name].append(time.perf_counter() - t0)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; {args.python}")
    print(f"python -c pass, median of {args.repeat} (ms):")
    bare = statistics.median(times["bare"])
    for name, each in times.items():
        median = statistics.median(each)
        print(f"  {name:16} {median * 1e3:7.2f}  (+{(median - bare) * 1e3:.2f})")
    for name in ("bare", "rank hook"):
        argv, env = ways[name]
        seen = importtime(argv, env, min(args.repeat, 10))
        slowest = sorted(seen.items(), key=lambda kv: -statistics.median(kv[1]))[:6]
        listed = ", ".join(f"{m} {statistics.median(us) / 1e3:.2f}" for m, us in slowest)
        print(f"  imports, {name} (cumulative ms): {listed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
