"""Pure functions that render a cluster (its header, how many nodes are up, its nodes), its
jobs and a job's result to HTML. A job's output lines are rendered by
:mod:`clusterbook.views.lines`; the look the views share is :mod:`clusterbook.views.style`.

The live widgets assign what these return, and the core shows the same as static HTML next
to them (``Cluster``, ``Job`` and ``JobResult`` in a saved notebook, on GitHub or nbviewer).

Nothing here imports ipywidgets or touches a live cluster: each function takes immutable values
(:class:`~clusterbook.status.ClusterSnapshot`, :class:`~clusterbook.launch.logs.LogRecord`)
and returns a string, so the widgets only assign it and tests need no frontend. Node names,
hosts, argv and log lines are user data and always pass through
:func:`~clusterbook.views.style.escaped`. Only the fields of a snapshot are rendered; nothing
from job environments or token files ever is.
"""

from __future__ import annotations

import shlex
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from clusterbook.errors import ConfigError
from clusterbook.launch.logs import LogRecord
from clusterbook.lifetime import format_duration
from clusterbook.status import ClusterSnapshot, JobStatus, NodeStatus
from clusterbook.views.lines import render_lines
from clusterbook.views.style import (
    FAILED,
    MUTED,
    MUTED_COLOUR,
    STATE_COLOURS,
    badge,
    empty,
    escaped,
    seconds,
    table,
)

__all__ = [
    "PAGE",
    "page_of",
    "render_cluster",
    "render_header",
    "render_job",
    "render_jobs",
    "render_nodes",
    "render_progress",
    "render_result",
    "render_timeline",
]

_UP = frozenset({"ready", "joined", "running"})
_GONE = frozenset({"lost", "left"})
_ARGV_CHARS = 160


def _bytes(value: float) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _memory(node: NodeStatus) -> str:
    """``8.8 GiB of 23.5 GiB (37%)``, as ``status()`` has it in ``memory_used_gib`` and
    ``memory_gib``; or what is known of it."""
    if node.memory_used is None and node.memory is None:
        return "—"
    if node.memory is None:
        return escaped(f"{node.memory_used:.0f}%")
    if node.memory_used is None:
        return escaped(f"? of {_bytes(node.memory)}")
    used = _bytes(node.memory_used / 100 * node.memory)
    return escaped(f"{used} of {_bytes(node.memory)} ({node.memory_used:.0f}%)")


# -- cluster ---------------------------------------------------------------------------------


def render_header(snapshot: ClusterSnapshot) -> str:
    """One line about the cluster: name, kind, state, rendezvous round, world size, uptime,
    the time left before it stops by itself (if it will); then what is wrong with the cluster
    itself, if anything (``snapshot.problem``).

    The round is the newest round any node is in ("—" when no node reports one); the world
    size counts the slots of nodes that have not been lost or left.
    """
    rounds = [n.round for n in snapshot.nodes if n.round is not None]
    active = [n for n in snapshot.nodes if n.state not in _GONE]
    slots = sum(n.slots for n in active)
    parts = [
        f"<b>{escaped(snapshot.name)}</b>",
        escaped(snapshot.kind),
        badge(snapshot.state),
        f"round {max(rounds) if rounds else '—'}",
        f"world size {slots} ({len(active)} node{'' if len(active) == 1 else 's'})",
        f"up {seconds(snapshot.uptime)}",
    ]
    if snapshot.time_left is not None:
        left, bound = snapshot.time_left
        parts.append(f'<span class="cb-time-left">stops in {escaped(format_duration(left))} '
                     f"({escaped(bound)})</span>")  # fmt: skip
    header = '<div class="cb-header">' + " · ".join(parts) + "</div>"
    if snapshot.problem:  # the cluster's own trouble (a stale status, say) comes first
        header += f'<div class="cb-problem" {FAILED}>{escaped(snapshot.problem)}</div>'
    return header


def render_progress(
    snapshot: ClusterSnapshot,
    min_nodes: int | None = None,
    max_nodes: int | None = None,
    last_call_left: float | None = None,
) -> str:
    """A bar of how many nodes are up, against ``min_nodes``/``max_nodes`` for an elastic
    cluster (else against every node that has not been lost or left), with the nodes still
    waiting and, when given, the seconds left before the rendezvous' last call closes."""
    if min_nodes is not None and max_nodes is not None and min_nodes > max_nodes:
        raise ConfigError(
            f"min_nodes ({min_nodes}) must be less than or equal to max_nodes ({max_nodes})."
        )
    up = sum(1 for n in snapshot.nodes if n.state in _UP)
    waiting = sum(1 for n in snapshot.nodes if n.state == "pending")
    if min_nodes is None and max_nodes is None:
        need = target = sum(1 for n in snapshot.nodes if n.state not in _GONE)
        gone = Counter(n.state for n in snapshot.nodes if n.state in _GONE)
        if target:
            text = f"{up} of {target} nodes ready"
        elif gone:  # a stopped cluster, or one whose every node went: say how, not "yet"
            text = "no node up: " + ", ".join(f"{gone[s]} {s}" for s in sorted(gone))
        else:
            text = "no nodes yet"
    else:
        low = min_nodes if min_nodes is not None else 1
        high = max_nodes if max_nodes is not None else low
        need, target = low, high
        text = f"{up} nodes joined (min {low}, max {high})"
        if up < low:
            text += f", {low - up} more needed"
    if waiting:
        text += f", {waiting} waiting"
    if last_call_left is not None:
        text += f"; last call closes in {max(0.0, last_call_left):.1f} s"
    pct = 100.0 if target == 0 and up else (min(100.0, 100.0 * up / target) if target else 0.0)
    colour = STATE_COLOURS["ready"] if up >= need and up else STATE_COLOURS["pending"]
    return (
        '<div class="cb-progress" style="display:flex;align-items:center;gap:8px">'
        '<div style="width:200px;height:10px;background:var(--jp-layout-color3, #edf2f7);'
        'border-radius:5px;overflow:hidden">'
        f'<div class="cb-progress-bar" style="width:{pct:.0f}%;height:100%;background:{colour}">'
        f'</div></div><span class="cb-progress-text">{escaped(text)}</span></div>'
    )


def _gpus(node: NodeStatus) -> str:
    """``4 NVIDIA A100-SXM4-40GB``: the count, then the model in smaller type."""
    if not node.gpus:
        return "—"
    model = node.gpu_model or ""
    return f'<span class="cb-gpus" title="{escaped(model)}">{node.gpus}</span>' + (
        f" <small {MUTED}>{escaped(model)}</small>" if model else ""
    )


def _waiting_for(node: NodeStatus) -> str:
    """Why a pending node waits, when its provider says (a queued batch job's reason), or why
    a node is set aside and until when."""
    if node.state == "set-aside" and node.last_reason:
        until = (
            ""
            if node.until is None
            else time.strftime(" until %H:%M:%S", time.localtime(node.until))
        )
        said = escaped(node.last_reason + until)
        return f' <small class="cb-aside-reason" {MUTED}>{said}</small>'
    if node.state != "pending" or not node.last_reason:
        return ""
    return f' <small class="cb-pending-reason" {MUTED}>{escaped(node.last_reason)}</small>'


def page_of(total: int, page: int, per_page: int | None) -> tuple[int, int, int]:
    """The rows ``[start, end)`` shown on ``page`` (counted from 0, brought within the pages
    there are) of ``total`` rows, ``per_page`` a page (None: all on one), and that page."""
    if per_page is None or total <= per_page:
        return 0, total, 0
    last = (total - 1) // per_page
    page = min(max(0, page), last)
    return page * per_page, min(total, (page + 1) * per_page), page


def _summary(what: str, states: Sequence[str], start: int, end: int) -> str:
    """``1024 nodes: 1000 running, 24 lost · showing 51 to 100``: the counts of a paged table."""
    counts = Counter(states)
    said = ", ".join(f"{n} {state}" for state, n in counts.most_common())
    showing = f" · showing {start + 1} to {end}" if end - start < len(states) else ""
    return (
        f'<div class="cb-summary" {MUTED}>{len(states)} {what}'
        f"{': ' + escaped(said) if said else ''}{showing}</div>"
    )


def render_nodes(snapshot: ClusterSnapshot, page: int = 0, per_page: int | None = None) -> str:
    """A table of the nodes: name, host, slots, GPUs (count and model; the column is left
    out when no node has a GPU), state (coloured; a pending node's reason beside it, like a
    queued Slurm job's), ranks of the running job, heartbeat age, load, and memory in use.
    With ``per_page``, only the rows of ``page`` (:func:`page_of`), under a line that counts
    them all by state when there are more."""
    if not snapshot.nodes:
        return empty("cb-nodes", "No nodes yet.")
    start, end, _ = page_of(len(snapshot.nodes), page, per_page)
    gpus = any(n.gpus for n in snapshot.nodes)
    headers = ["Node", "Host", "Slots", *(["GPUs"] if gpus else [])]
    headers += ["State", "Ranks", "Heartbeat", "Load", "Memory"]
    rows = []
    for n in snapshot.nodes[start:end]:
        ranks = ",".join(str(r) for r in n.ranks)
        row = [
            escaped(n.name),
            escaped(n.host),
            escaped(n.slots),
            *([_gpus(n)] if gpus else []),
            badge(n.state) + _waiting_for(n),
            escaped(f"{ranks} ({n.job})" if ranks and n.job else ranks),
            "—" if n.heartbeat_age is None else f"{n.heartbeat_age:.1f} s ago",
            "—" if n.load is None else escaped(f"{n.load:.2f}"),
            _memory(n),
        ]
        rows.append(row)
    shown = table(headers, rows, "cb-nodes")
    if per_page is None or len(snapshot.nodes) <= per_page:
        return shown
    return _summary("nodes", [n.state for n in snapshot.nodes], start, end) + shown


def _job_order(jobs: Sequence[JobStatus]) -> list[JobStatus]:
    running = [j for j in jobs if j.state == "running"]
    finished = [j for j in reversed(jobs) if j.state != "running"]
    return running + finished


def render_jobs(snapshot: ClusterSnapshot, page: int = 0, per_page: int | None = None) -> str:
    """A table of the jobs, running ones first, then finished ones newest first: id, np,
    command (under its ``label`` for well-known jobs), state (coloured),
    exit code, duration and failed ranks. With ``per_page``, only the rows of ``page``
    (:func:`page_of`), under a line that counts them all by state when there are more."""
    if not snapshot.jobs:
        return empty("cb-jobs", "No jobs yet.")
    ordered = _job_order(snapshot.jobs)
    start, end, _ = page_of(len(ordered), page, per_page)
    rows = []
    for j in ordered[start:end]:
        command = shlex.join(j.argv)
        shown = command if len(command) <= _ARGV_CHARS else command[: _ARGV_CHARS - 1] + "…"
        failed = ", ".join(str(r) for r in j.failed_ranks)
        code = f'<code title="{escaped(command)}">{escaped(shown)}</code>'
        if j.label is not None:
            code = f'<b class="cb-job-label">{escaped(j.label)}</b> <small {MUTED}>{code}</small>'
        state = badge(j.state)
        if j.attempt > 1:
            state += (
                f' <small class="cb-attempt" {MUTED} title="{escaped(j.last_reason or "")}">'
                f"attempt {j.attempt}{f', restart {j.restarts}' if j.restarts else ''} · "
                f"after {escaped(j.last_reason or '?')}</small>"
            )
        rows.append(
            [
                escaped(j.id),
                escaped(j.np),
                code,
                state,
                "—" if j.returncode is None else escaped(j.returncode),
                seconds(j.duration),
                f'<span class="cb-failed" {FAILED}>{escaped(failed)}</span>' if failed else "—",
            ]
        )
    headers = ["Job", "np", "Command", "State", "Exit code", "Duration", "Failed ranks"]
    shown = table(headers, rows, "cb-jobs")
    if per_page is None or len(ordered) <= per_page:
        return shown
    return _summary("jobs", [j.state for j in ordered], start, end) + shown


# -- static views, for saved notebooks --------------------------------------------------------


#: Rows of a table a page, in the widget and in static views: a browser lays out a page of a
#: 1,024-node table at once; ``status()`` has every row.
PAGE = 50


def render_cluster(snapshot: ClusterSnapshot) -> str:
    """The whole cluster as static HTML: header, progress, nodes and jobs (what the live
    widget shows, frozen; long tables their first :data:`PAGE` rows)."""
    parts = [
        render_header(snapshot),
        render_progress(snapshot, snapshot.min_nodes, snapshot.max_nodes),
        render_nodes(snapshot, per_page=PAGE),
        render_jobs(snapshot, per_page=PAGE),
    ]
    return '<div class="cb-cluster">' + "".join(parts) + "</div>"


def render_job(job: JobStatus, records: Sequence[LogRecord], limit: int = 20) -> str:
    """A job as static HTML: its row of the jobs table and its last ``limit`` lines."""
    table = render_jobs(
        ClusterSnapshot("", "", "", (), (job,), None, "", None)  # the table of one job
    )
    return f'<div class="cb-job">{table}{render_lines(records, limit=limit)}</div>'


def render_result(state: str, summary: str) -> str:
    """A job's result as static HTML: its state badge and its summary."""
    return (
        f'<div class="cb-result">{badge(state)}'
        f'<pre style="margin:4px 0;white-space:pre-wrap">{escaped(summary)}</pre></div>'
    )


def render_timeline(
    times: Mapping[int, tuple[float | None, float | None]],
    codes: Mapping[int, int | None],
    *,
    width: int = 360,
    row: int = 12,
) -> str:
    """A small SVG of when each rank ran: a bar from its start to its end (to the last end
    known, for a rank still running or killed unseen), green when it exited 0, red otherwise,
    grey when its exit is unknown. Empty when no rank reported its start."""
    starts = [s for s, _ in times.values() if s is not None]
    if not starts:
        return ""
    ends = [e for _, e in times.values() if e is not None]
    t0, t1 = min(starts), max([*ends, *starts])
    span = max(t1 - t0, 1e-3)
    label = 44
    bars = []
    for i, rank in enumerate(sorted(codes)):
        start, end = times.get(rank, (None, None))
        if start is None:
            continue
        x = label + (start - t0) / span * (width - label)
        w = max(2.0, ((end if end is not None else t1) - start) / span * (width - label))
        code = codes.get(rank)
        colour = STATE_COLOURS["succeeded" if code == 0 else "failed" if code else "cancelled"]
        y = i * row
        bars.append(
            f'<text x="0" y="{y + row - 3}" font-size="9" fill="{MUTED_COLOUR}">rank {rank}</text>'
            f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{row - 4}" fill="{colour}">'
            f"<title>rank {rank}: {(end or t1) - start:.2f} s, exit {code}</title></rect>"
        )
    height = len(codes) * row
    return (
        f'<svg class="cb-timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">' + "".join(bars) + "</svg>"
    )
