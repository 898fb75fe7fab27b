"""The cluster widget at 64, 256 and 1,024 simulated nodes with 16 running jobs, in the kernel.

Each size is a cluster of the shipped :class:`~clusterbook.testing.FakeProvider` (nodes in
memory, a stand-in launcher whose 16 jobs sleep until cancelled), its resource history filled
with ten minutes of reports (a sample a second a node), and a live
:class:`~clusterbook_widgets.cluster_widget.ClusterWidget` of it (real threads, the default
throttles and the 1 s poll). Printed for each size, beside the goals:

- render: one full update, snapshot to HTML, as the widget makes it: ``cluster.snapshot()``,
  the header, the progress bar, a page of the nodes table, a page of the jobs table, the
  resource history of the page's nodes and the cluster's sum (the last minute, a point a
  report) and its plots; every time after all the nodes reported anew (nothing cached), p50
  and p95 of ``--renders`` updates;
- rate: the widget's updates a second (its nodes table rendered anew) while every node
  reports ``--hz`` times a second for ``--seconds`` seconds (each report changes its row);
- idle: this process's CPU (user + system) over ``--seconds`` seconds while nothing changes,
  the widget alive and polling;
- the HTML the widget holds (what the browser lays out: a page of rows, not all of them);
- beside them, for comparison, what the widget did before it paged its tables: every row of
  both tables, no plots (p50, p95 and its HTML), timed in turn with the paged update.

    python benchmarks/widget_scale.py [--sizes 64,256,1024] [--seconds 5] [--renders 40]

Goals: render p95 <= 250 ms, rate >= 5 Hz, idle CPU <= 5 %. The exit status is 1 when a goal
is missed. The machine is shared: run ``uptime`` beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.testing import FakeProvider
from clusterbook.views.html import PAGE, render_header, render_jobs, render_nodes, render_progress
from clusterbook.views.plots import render_usage
from clusterbook_widgets.cluster_widget import ClusterWidget

GOAL_RENDER_MS, GOAL_RATE_HZ, GOAL_IDLE_CPU = 250.0, 5.0, 5.0
JOBS = 16
STAND_IN = "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'mpirun (Open MPI) 5.0.11'; exit 0; }\n"
STAND_IN += "exec sleep 3600\n"


def usage(n: int, step: int) -> dict[str, float]:
    """A node's made-up report: its use wanders with the step (so every report is new)."""
    return {
        "cpu": float((n * 7 + step * 13) % 100),
        "memory_used_gib": 4.0 + (n + step) % 16,
        "memory_gib": 64.0,
        "gpu": float((n * 3 + step * 5) % 100),
    }


class Reports:
    """Every node reports, as agents do: the reports' clock moves a second a round."""

    def __init__(self, size: int, start: float) -> None:
        self.names = [f"fake-{i}" for i in range(size)]
        self.now, self.step = start, 0
        self.provider = FakeProvider(nodes=size, clock=self.clock)

    def clock(self) -> float:
        return self.now

    def round(self) -> None:
        self.step += 1
        self.now += 1.0
        reports = {name: usage(i, self.step) for i, name in enumerate(self.names)}
        self.provider.report_usage(reports)


def full_update(cluster: cb.Cluster) -> int:
    """What the widget makes of a change, from the snapshot to the HTML; its size."""
    snapshot = cluster.snapshot()
    page = [n.name for n in snapshot.nodes[:PAGE]]
    parts = [
        render_header(snapshot),
        render_progress(snapshot, snapshot.min_nodes, snapshot.max_nodes),
        render_nodes(snapshot, 0, PAGE),
        render_jobs(snapshot, 0, PAGE),
        render_usage(cluster.resource_history(60.0, nodes=page, points=120), page),
    ]
    return sum(len(p) for p in parts)


def unpaged_update(cluster: cb.Cluster) -> int:
    """What the widget made of a change before it paged its tables (every row, no plots)."""
    snapshot = cluster.snapshot()
    parts = [
        render_header(snapshot),
        render_progress(snapshot, snapshot.min_nodes, snapshot.max_nodes),
        render_nodes(snapshot),
        render_jobs(snapshot),
    ]
    return sum(len(p) for p in parts)


def percentiles(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return times[len(times) // 2], times[min(len(times) - 1, round(0.95 * len(times)) - 1)]


def cpu() -> float:
    times = os.times()
    return times.user + times.system


def measure(size: int, seconds: float, renders: int, hz: float, scratch: Path) -> dict[str, float]:
    launcher = scratch / f"mpirun-{size}"
    launcher.write_text(STAND_IN)
    launcher.chmod(0o755)
    reports = Reports(size, time.time() - 600)
    where = scratch / str(size)
    options = ClusterOptions.make(f"scale{size}", launcher=str(launcher), run_dir=where)
    cluster = cb.Cluster(reports.provider, options).start()
    try:
        for _ in range(600):  # ten minutes of history, a report a second a node
            reports.round()
        for _ in range(JOBS):
            cluster.mpirun(["true"], np=max(1, size // JOBS))
        widget = ClusterWidget(cluster)
        times, old_times = [], []
        for _ in range(renders):  # the two sides in turn
            reports.round()
            start = time.perf_counter()
            full_update(cluster)
            times.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            unpaged = unpaged_update(cluster)
            old_times.append((time.perf_counter() - start) * 1000)
        shown = widget.renders["nodes"]
        stop = threading.Event()

        def drive() -> None:
            while not stop.wait(1 / hz):
                reports.round()

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        time.sleep(seconds)
        stop.set()
        driver.join()
        rate = (widget.renders["nodes"] - shown) / seconds
        time.sleep(1.5)  # the last updates out
        before, drawn = cpu(), sum(widget.renders.values()) + widget.usage.draws
        time.sleep(seconds)
        idle = (cpu() - before) / seconds * 100
        redrawn = sum(widget.renders.values()) + widget.usage.draws - drawn
        html = sum(len(w.value) for w in (widget.nodes_html, widget.jobs_html, widget.usage.html))
        widget.close()
        (p50, p95), (b50, b95) = percentiles(times), percentiles(old_times)
        return {
            "p50": p50,
            "p95": p95,
            "b50": b50,
            "b95": b95,
            "b_kb": unpaged / 1024,
            "rate": rate,
            "idle": idle,
            "redrawn": redrawn,
            "html_kb": html / 1024,
        }
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--renders", type=int, default=40)
    parser.add_argument("--hz", type=float, default=10.0, help="node report rounds a second")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load: {load[0]:.2f} {load[1]:.2f} (1, 5 min), {os.cpu_count()} cores")
    print(
        f"{'nodes':>6} {'render p50':>11} {'p95':>8} {'rate':>8} {'idle CPU':>9} "
        f"{'redrawn idle':>13} {'HTML':>8}   | unpaged: {'p50':>8} {'p95':>8} {'HTML':>8}"
    )
    missed = False
    with tempfile.TemporaryDirectory(prefix="cb-widget-scale-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            r = measure(size, args.seconds, args.renders, args.hz, Path(tmp))
            print(
                f"{size:>6} {r['p50']:>8.1f} ms {r['p95']:>5.1f} ms {r['rate']:>5.1f} Hz "
                f"{r['idle']:>7.1f} % {r['redrawn']:>13.0f} {r['html_kb']:>5.0f} KB   | "
                f"{'':>9}{r['b50']:>6.1f} ms {r['b95']:>5.1f} ms {r['b_kb']:>5.0f} KB",
                flush=True,
            )
            missed |= r["p95"] > GOAL_RENDER_MS or r["rate"] < GOAL_RATE_HZ
            missed |= r["idle"] > GOAL_IDLE_CPU
    print(
        f"goals: render p95 <= {GOAL_RENDER_MS:g} ms, rate >= {GOAL_RATE_HZ:g} Hz, "
        f"idle CPU <= {GOAL_IDLE_CPU:g} %"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
