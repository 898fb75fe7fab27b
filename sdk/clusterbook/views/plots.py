"""Small plots of the nodes' resource history (pure): inline SVG sparklines of CPU, memory and
GPU use, per node and for the cluster's sum, from what ``resource_history()`` answers
(:mod:`clusterbook.resources`).

No chart library: a plot is one SVG ``path`` of at most as many points as the answer holds
(the widget asks for a few dozen), drawn in the theme's colours, so a page of 50 nodes costs
a few milliseconds to render and a few kilobytes to send. A gap in the reports (a value not
known) is a gap in the line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clusterbook.views.style import MUTED, MUTED_COLOUR, empty, escaped, table

__all__ = ["render_usage", "sparkline"]

CPU_COLOUR = "#2b6cb0"
MEMORY_COLOUR = "#805ad5"
GPU_COLOUR = "#2f855a"
_WIDTH, _HEIGHT = 120, 22  # a node's plot, in pixels


def sparkline(
    values: Sequence[float | None],
    top: float | None,
    *,
    colour: str,
    label: str,
    width: int = _WIDTH,
    height: int = _HEIGHT,
) -> str:
    """``values`` (oldest first) as a line from 0 (bottom) to ``top`` (the largest value when
    None), ``label`` its tooltip; an empty plot of the same size when none is known."""
    scale = top if top else max((v for v in values if v is not None), default=0.0) or 1.0
    step, rise = width / max(1, len(values) - 1), (height - 2) / scale
    bottom = height - 1
    # One pass of C-level formatting: a point a value, a move ("M") where a line starts (the
    # points after it are lines to them: SVG's implicit "L", two bytes a point fewer).
    path = [
        f"{'M' if i == 0 or values[i - 1] is None else ''}{i * step:.0f} "
        f"{bottom - (v * rise if v < scale else height - 2):.1f}"
        for i, v in enumerate(values)
        if v is not None
    ]
    line = (
        f'<path d="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        if path
        else ""
    )
    return (
        f'<svg class="cb-spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        f' style="vertical-align:middle"><title>{escaped(label)}</title>'
        f'<line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}" '
        f'stroke="{MUTED_COLOUR}" stroke-opacity="0.4"/>{line}</svg>'
    )


def _last(values: Sequence[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def _cell(values: Sequence[float | None], top: float | None, colour: str, unit: str) -> str:
    """A plot and the newest value beside it (``"—"`` when none is known)."""
    last = _last(values)
    said = "—" if last is None else (f"{last:.0f}%" if unit == "%" else f"{last:.1f} {unit}")
    of = f" of {top:.1f} {unit}" if top and unit != "%" else ""
    plot = sparkline(values, top, colour=colour, label=f"now {said}{of}")
    return f'{plot} <small class="cb-now" {MUTED}>{escaped(said)}</small>'


def _row(name: str, series: Mapping[str, Any]) -> list[str]:
    memory = series.get("memory_gib")
    gpu = series.get("gpu") or []
    return [
        name,
        _cell(series.get("cpu") or [], 100.0, CPU_COLOUR, "%"),
        _cell(series.get("memory_used_gib") or [], memory, MEMORY_COLOUR, "GiB"),
        _cell(gpu, 100.0, GPU_COLOUR, "%") if any(v is not None for v in gpu) else "—",
    ]


def render_usage(answer: Mapping[str, Any], names: Sequence[str] | None = None) -> str:
    """The cluster's sum (mean CPU and GPU, memory in use of all) and each node of ``names``
    (None: every node the answer has), a row of plots each, over the answer's window; what
    the nodes do not report is said so."""
    nodes: Mapping[str, Any] = answer.get("nodes") or {}
    cluster: Mapping[str, Any] = answer.get("cluster") or {}
    if not nodes and not cluster.get("t"):
        return empty("cb-usage", "No resource reports (nodes report with their agents).")
    seconds = float(answer.get("interval") or 0) * max(0, len(cluster.get("t") or []) - 1)
    rows = [[f"<b>cluster</b> <small {MUTED}>{escaped(f'last {seconds:.0f} s')}</small>"]]
    rows[0] += _row("", cluster)[1:]
    for name in nodes if names is None else [n for n in names if n in nodes]:
        rows.append(_row(escaped(name), nodes[name]))
    return table(["Use", "CPU", "Memory", "GPU"], rows, "cb-usage")
