"""What handling a notebook's clicks costs a cell that waits, in a real ipykernel, in one run.

A kernel of this venv waits in :func:`clusterbook.waiting.wait_until` on an event, with the
Jupyter layer's pump (what ``job.wait()`` does in a notebook) and without it (``pump=None``:
the plain wait of before), taking turns:

- end: from the moment a timer sets the event to the moment the wait returns (what a job's
  end costs the cell that waits for it; the pump must add nothing to it);
- click: from the moment this process sends a button's click (a comm message, as JupyterLab
  sends it) to the moment its handler runs in the kernel, while a cell waits (without the
  pump the click waits for the cell: the wait's end, at ``--hold`` seconds);
- CPU: the kernel's main thread's CPU time over a wait of ``--hold`` seconds with nothing to
  handle, per second of wait;
- items: the time per item of :func:`clusterbook.waiting.each` (how ``%%mpirun`` reads its
  job's lines) over 100,000 items that are all there already, its worst case: with the pump,
  a thread takes them and hands them over.

    python benchmarks/busy_wait.py [--repeat 20] [--hold 3]

Goals: the end no later with the pump than without (median within 1 ms); a click handled
within the pump's step (50 ms) at the 95th percentile; the pump's CPU <= 1 % of a core. The
exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import start_new_kernel

SETUP = """\
import threading, time
import ipywidgets as w
from clusterbook.waiting import each, wait_until
button = w.Button()
clicked = []
button.on_click(lambda _: clicked.append(time.monotonic()))
def end_after(delay, pump):
    done, marks = threading.Event(), {}
    def fire():
        marks["set"] = time.monotonic()
        done.set()
    threading.Timer(delay, fire).start()
    wait_until(done.wait, None, **({} if pump else {"pump": None}))
    return time.monotonic() - marks["set"]
def per_item(pump, n=100_000):
    t = time.perf_counter()
    assert sum(1 for _ in each(iter(range(n)), **({} if pump else {"pump": None}))) == n
    return (time.perf_counter() - t) / n
def hold(seconds, pump):
    cpu = time.thread_time()
    wait_until(threading.Event().wait, seconds, **({} if pump else {"pump": None}))
    return time.thread_time() - cpu
"""


def _value(client: BlockingKernelClient, code: str, expression: str) -> Any:
    msg_id = client.execute(code, user_expressions={"v": expression})
    while True:
        reply = client.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["status"] == "ok", reply["content"]
    shown = reply["content"]["user_expressions"]["v"]
    assert shown["status"] == "ok", shown
    return ast.literal_eval(shown["data"]["text/plain"])


def _click_latency(client: BlockingKernelClient, comm_id: str, hold: float, pump: bool) -> float:
    before = _value(client, "", "len(clicked)")
    msg_id = client.execute(f"hold({hold}, {pump})")
    time.sleep(0.5)  # the cell waits by now
    sent = time.monotonic()  # CLOCK_MONOTONIC: the kernel's clock too, on this machine
    data = {"method": "custom", "content": {"event": "click"}}
    client.shell_channel.send(client.session.msg("comm_msg", {"comm_id": comm_id, "data": data}))
    while client.get_shell_msg(timeout=120)["parent_header"].get("msg_id") != msg_id:
        pass
    clicks = _value(client, "", "clicked")
    assert len(clicks) == before + 1, clicks
    return float(clicks[-1]) - sent


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--hold", type=float, default=3.0)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="busy-wait-"))
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(home))
    try:
        _value(client, SETUP, "1")
        comm_id = _value(client, "", "button.comm.comm_id")
        ends: dict[bool, list[float]] = {True: [], False: []}
        clicks: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        items: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeat):
            for pump in (True, False):
                ends[pump].append(_value(client, "", f"end_after(0.2, {pump})"))
                items[pump].append(_value(client, "", f"per_item({pump})"))
        for _ in range(max(3, args.repeat // 4)):
            for pump in (True, False):
                clicks[pump].append(_click_latency(client, comm_id, args.hold, pump))
                cpu[pump].append(_value(client, "", f"hold({args.hold}, {pump})") / args.hold)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    ok = True
    print(f"repeat={args.repeat} hold={args.hold}s")
    for name, table, unit, scale in (
        ("end after the event", ends, "ms", 1e3),
        ("click to handler", clicks, "ms", 1e3),
        ("main thread CPU", cpu, "% of a core", 1e2),
        ("each(), per item", items, "us", 1e6),
    ):
        for pump in (True, False):
            values = [v * scale for v in table[pump]]
            side = "pump" if pump else "plain"
            print(
                f"{name:20} {side:5}: median {statistics.median(values):8.2f}"
                f"  p95 {_pct(values, 0.95):8.2f}  max {max(values):8.2f} {unit}"
                f"  (n={len(values)})"
            )
    end_gap = statistics.median(ends[True]) - statistics.median(ends[False])
    if end_gap > 1e-3:
        print(f"MISSED: the pump delays the end by {end_gap * 1e3:.2f} ms (median)")
        ok = False
    if _pct(clicks[True], 0.95) > 0.05:
        print("MISSED: a click waits longer than the pump's step (p95)")
        ok = False
    if statistics.median(cpu[True]) > 0.01:
        print("MISSED: the pump costs more than 1 % of a core")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
