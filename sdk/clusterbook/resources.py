"""A bounded history of each node's CPU, memory and GPU use, and its table form.

The head keeps one :class:`ResourceHistory` of the reports its nodes' agents already send
with every heartbeat (:class:`~clusterbook.rendezvous.report.NodeReport`): no process of its
own on any node. It holds the last :data:`HISTORY_SPAN` seconds, a sample per node per report
interval at most, so its size is bounded by the nodes reporting now, whatever the cluster's
age. Its answer (:meth:`ResourceHistory.answer`) is JSON-ready, the same from a cluster of
this process and through the control channel of an attached handle::

    {"interval": 1.0,                       # seconds between two samples of the answer
     "nodes": {"node1": {"t": [unix seconds, ...],
                         "cpu": [percent, ...],                # of the node's cores
                         "memory_used_gib": [GiB, ...],
                         "memory_gib": GiB or None,            # the node's memory
                         "gpu": [percent or None, ...]}},      # mean of its GPUs; None: none
     "cluster": {"t": [...], "cpu": [...], "memory_used_gib": [...], "memory_gib": GiB,
                 "gpu": [...]}}                # mean CPU and GPU, memory summed

An answer holds at most :data:`ANSWER_SAMPLES` samples, all nodes together: a longer one is
downsampled (:func:`downsample`: consecutive samples averaged), and its ``interval`` says so.
Everything here is pure but for the lock: the clock is injected.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from clusterbook.durations import Duration, optional_duration
from clusterbook.errors import ConfigError
from clusterbook.sample_ring import Columns, Ring, Sample, columns_of

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ANSWER_SAMPLES",
    "HISTORY_SPAN",
    "RESOURCE_DTYPES",
    "SILENT_AFTER",
    "Only",
    "ResourceFrames",
    "ResourceHistory",
    "Sample",
    "downsample",
    "empty_answer",
    "resources_frame",
]

#: Seconds of history the head keeps: the last 10 minutes.
HISTORY_SPAN = 600.0
#: Samples one answer holds at most, all nodes together (1,024 nodes: ~146 each, ~4 MB JSON).
ANSWER_SAMPLES = 150_000
_MIN_POINTS = 30  # a node's series is never downsampled below this many points
_PRUNE_EVERY = 30.0  # seconds between sweeps for nodes that stopped reporting
#: Report intervals after which a silent node no longer counts in the cluster's sum.
SILENT_AFTER = 3


def _mean(values: Iterable[float | None]) -> float | None:
    return _average(list(values))


def _average(values: list[float | None]) -> float | None:
    """The mean of the known ``values`` (None when none is): C loops where none is missing,
    the common case, since this runs for every point of every plot."""
    missing = values.count(None)
    if not missing:
        return sum(values) / len(values)  # type: ignore[arg-type]
    if missing == len(values):
        return None
    known = [v for v in values if v is not None]
    return sum(known) / len(known)


def _mean_of(values: Sequence[float]) -> float | None:
    """The mean of ``values`` that are not NaN (None when all are): one C loop where none is,
    the common case, since this runs for every point of every answer."""
    total = sum(values)
    if total == total:  # not NaN: every value known
        return total / len(values)
    known = [v for v in values if v == v]
    return sum(known) / len(known) if known else None


def _runs(columns: Columns, every: int) -> tuple[list[float], list[list[float | None]]]:
    """The times and the values of ``columns`` with each run of ``every`` samples made one
    (see :func:`downsample`)."""
    times, *values = columns
    if every <= 1:
        return list(times), [[None if v != v else v for v in c] for c in values]
    cuts = list(range(len(times) % every, len(times) + 1, every))
    if cuts[0]:
        cuts.insert(0, 0)  # the oldest run is the short one
    pairs = list(itertools.pairwise(cuts))
    return [times[end - 1] for _, end in pairs], [
        [_mean_of(c[start:end]) for start, end in pairs] for c in values
    ]


def downsample(samples: Sequence[Sample], every: int) -> list[Sample]:
    """``samples`` (oldest first) with each run of ``every`` consecutive ones made one: the
    mean of its known values (None where none is known), at the time of its last. The runs
    end at the newest sample, so the newest value is always in a run of its own size."""
    times, (cpu, used, gpu) = _runs(columns_of(samples), every)
    return [Sample(*row) for row in zip(times, cpu, used, gpu, strict=True)]


def empty_answer(interval: float) -> dict[str, Any]:
    """The answer of a cluster whose nodes report nothing (no agents, or not started)."""
    return {"interval": interval, "nodes": {}, "cluster": _series(columns_of(()), 1, None)}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _rounded(values: list[float | None], digits: int) -> list[float | None]:
    return [None if v is None else round(v, digits) for v in values]


def _series(columns: Columns, every: int, memory: float | None) -> dict[str, Any]:
    """A series as the answer's JSON has it, downsampled by runs of ``every``: a list per
    value, rounded to what is read."""
    times, (cpu, used, gpu) = _runs(columns, every)
    return {
        "t": [round(t, 3) for t in times],
        "cpu": _rounded(cpu, 1),
        "memory_used_gib": _rounded(used, 3),
        "memory_gib": _round(memory, 3),
        "gpu": _rounded(gpu, 1),
    }


class ResourceHistory:
    """The last ``span`` seconds of every node's reports, a sample per ``interval`` seconds
    at most (the agents' report interval): a node reporting more often has its newer report
    replace the sample of the same interval. Beside them, the cluster's: once an interval,
    the mean CPU and GPU use and the sum of the memory of the nodes that reported within the
    last :data:`SILENT_AFTER` intervals. ``clock``: wall time (unix seconds), what the
    reports' times are measured against; ``budget``: the samples an answer holds at most.
    Safe to use from any thread."""

    def __init__(
        self,
        interval: float,
        span: float = HISTORY_SPAN,
        *,
        clock: Callable[[], float] = time.time,
        budget: int = ANSWER_SAMPLES,
    ) -> None:
        if not interval > 0 or not span >= interval:
            raise ValueError(f"interval {interval!r} and span {span!r}: 0 < interval <= span")
        self.interval = interval
        self.span = span
        self._clock = clock
        self._budget = budget
        self._keep = math.ceil(span / interval) + 1
        self._lock = threading.Lock()
        self._series: dict[str, Ring] = {}
        self._memory: dict[str, float | None] = {}
        self._heard: dict[str, float] = {}  # node -> when its last report came (clock)
        self._cluster = Ring(self._keep)
        self._cluster_memory: float | None = None
        self._tick = -math.inf  # when the cluster's next sample is due
        self._pruned = clock()
        self.version = 0  # counts changes: an unchanged version, an unchanged history

    def add(
        self,
        node: str,
        t: float,
        *,
        cpu: float | None,
        memory_used_gib: float | None,
        memory_gib: float | None,
        gpu: float | None,
    ) -> None:
        """Node ``node`` reported at ``t``: its CPU (percent), memory in use and in all (GiB)
        and GPU (percent)."""
        sample = Sample(t, cpu, memory_used_gib, gpu)
        now = self._clock()
        with self._lock:
            series = self._series.get(node)
            if series is None:
                series = self._series[node] = Ring(self._keep)
            last = series.last().t if len(series) else -math.inf
            if t <= last:
                return  # the same report seen again (or an older one): nothing new
            # Reports closer than the interval: the newer one replaces the older.
            series.append(sample, replace=t - last < self.interval / 2)
            self._memory[node] = memory_gib
            self._heard[node] = now
            self.version += 1
            if now >= self._tick:
                self._sum(now)
            if now - self._pruned >= _PRUNE_EVERY:
                self._prune(now)

    def _sum(self, now: float) -> None:
        """The cluster's sample at ``now`` (held lock), of the nodes heard from lately."""
        self._tick = now + self.interval
        recent = now - SILENT_AFTER * self.interval
        latest = [(n, self._series[n].last()) for n, at in self._heard.items() if at >= recent]
        total = [m for n, _ in latest if (m := self._memory.get(n)) is not None]
        used = [s.memory_used_gib for _, s in latest if s.memory_used_gib is not None]
        sample = Sample(
            now,
            _mean(s.cpu for _, s in latest),
            sum(used) if used else None,
            _mean(s.gpu for _, s in latest),
        )
        self._cluster_memory = sum(total) if total else None
        cluster = self._cluster
        cluster.append(
            sample, replace=len(cluster) > 0 and now - cluster.last().t < self.interval / 2
        )

    def _prune(self, now: float) -> None:
        """Drop what is older than the span (held lock); a node left with nothing goes."""
        self._pruned = now
        oldest = now - self.span
        for series in (*self._series.values(), self._cluster):
            series.drop_before(oldest)
        for node in [n for n, series in self._series.items() if not len(series)]:
            del self._series[node]
            self._memory.pop(node, None)
            self._heard.pop(node, None)

    def nodes(self) -> list[str]:
        """The nodes with samples, in the order they first reported."""
        with self._lock:
            return list(self._series)

    def answer(
        self,
        window: object = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        """The samples of the last ``window`` seconds (a duration; None or more than the span:
        the span), JSON-ready (see the module's docstring), of the nodes named (None: all),
        and the cluster's; at most ``points`` a series (None: as the budget allows). A
        ``window`` that is no duration, or ``points`` no positive number, is a
        :class:`~clusterbook.ConfigError` naming it."""
        seconds = optional_duration(window, "window")
        seconds = self.span if seconds is None else min(seconds, self.span)
        if points is not None and (isinstance(points, bool) or not isinstance(points, int)
                                   or points < 1):  # fmt: skip
            raise ConfigError(f"points must be a positive whole number, not {points!r}.")
        now = self._clock()
        with self._lock:
            self._prune(now)
            since = now - seconds
            names = self._series if nodes is None else [n for n in nodes if n in self._series]
            picked = {n: self._series[n].columns(since) for n in names}
            cluster = self._cluster.columns(since)
            memory, cluster_memory = dict(self._memory), self._cluster_memory
        picked = {node: columns for node, columns in picked.items() if len(columns[0])}
        longest = max((len(c[0]) for c in (*picked.values(), cluster)), default=0)
        most = max(_MIN_POINTS, self._budget // max(1, len(picked)))
        every = max(1, math.ceil(longest / min(most, points or most)))
        return {
            "interval": self.interval * every,
            "nodes": {n: _series(c, every, memory.get(n)) for n, c in picked.items()},
            "cluster": _series(cluster, every, cluster_memory),
        }


#: The dtype of every column of :func:`resources_frame`, whatever the rows (none too).
RESOURCE_DTYPES = {
    "time": "datetime64[us, UTC]",
    "node": "string",
    "cpu_percent": "Float64",  # of the node's cores
    "memory_used_gib": "Float64",  # GiB in use (2**30 bytes)
    "memory_gib": "Float64",  # the node's memory, GiB
    "gpu_percent": "Float64",  # the mean of the node's GPUs (<NA>: none, or not known)
}


def resources_frame(answer: Mapping[str, Any]) -> pd.DataFrame:
    """One row per node and sample of a history's ``answer``, oldest first within each node:
    time (UTC), node, cpu_percent, memory_used_gib, memory_gib and gpu_percent; dtypes
    :data:`RESOURCE_DTYPES` (``<NA>`` where a value is not known)."""
    import pandas as pd

    rows = []
    for node, series in dict(answer.get("nodes") or {}).items():
        total = series.get("memory_gib")
        for t, cpu, used, gpu in zip(
            series["t"], series["cpu"], series["memory_used_gib"], series["gpu"], strict=True
        ):
            rows.append((t, node, cpu, used, total, gpu))
    frame = pd.DataFrame(rows, columns=list(RESOURCE_DTYPES))
    frame["time"] = pd.to_datetime(frame["time"].astype("float64"), unit="s", utc=True)
    for column in ("cpu_percent", "memory_used_gib", "memory_gib", "gpu_percent"):
        frame[column] = frame[column].astype("float64")
    typed: pd.DataFrame = frame.astype(RESOURCE_DTYPES)
    return typed


class Only(TypedDict, total=False):
    """Which part of a history to answer: the ``nodes`` named, at most ``points`` a series."""

    nodes: Collection[str] | None
    points: int | None


class ResourceFrames:
    """:meth:`resources`, for a cluster that answers :meth:`resource_history`."""

    def resource_history(
        self,
        window: Duration | None = None,
        *,
        nodes: Collection[str] | None = None,
        points: int | None = None,
    ) -> dict[str, Any]:
        """Each node's CPU, memory and GPU use over the last ``window`` (a duration; None: all
        that is kept, the last 10 minutes), JSON-ready (see :mod:`clusterbook.resources`).

        Parameters
        ----------
        window
            How far back (a duration: ``60``, ``"5m"``, a timedelta).
        nodes
            The nodes whose series to answer (None: every node); the cluster's sum is of all.
        points
            At most this many samples a series (runs of samples averaged; None: as many as
            an answer's budget allows).
        """
        raise NotImplementedError

    def resources(self, window: Duration | None = None) -> pd.DataFrame:
        """Each node's CPU, memory and GPU use over the last ``window`` (a duration; None:
        all that is kept, the last 10 minutes), a row per node and report: time (UTC), node,
        cpu_percent, memory_used_gib, memory_gib, gpu_percent (``<NA>`` without GPUs)
        (:func:`resources_frame`)."""
        return resources_frame(self.resource_history(window))
