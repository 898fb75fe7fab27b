"""Failing nodes set aside: the policy and its decisions (pure, the clock injected).

A node whose ranks fail ``failures`` times within ``window`` seconds (or whose node is lost
that often: its agent or its connection keeps dropping, while it runs ranks or while it is
idle) is set aside: the later attempts of
the cluster's jobs (retries and restarts) leave it out until its cool-down ends, or until
``cluster.reinstate(node)``; a new job is not refused its nodes. Each time the same node is
set aside again its cool-down doubles, up to ``limit``, as Horovod's elastic mode does with
the hosts it blacklists.
:func:`failed_nodes` says which nodes an attempt's ending counts against, :func:`idle_drops`
which nodes were lost with no attempt on them; :class:`Bench` keeps the counts and says which
nodes are aside now.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from clusterbook.durations import optional_duration
from clusterbook.errors import ClusterError, ConfigError, NodeLostError
from clusterbook.launch.command import placement
from clusterbook.launch.result import JobResult
from clusterbook.spec import NodeSpec
from clusterbook.status import NodeStatus

__all__ = ["Aside", "Bench", "SetAsidePolicy", "failed_nodes", "idle_drops", "with_aside"]

#: Why an idle node's loss counts against it (the reason a set-aside shows ends with it).
IDLE_DROP = "agent dropped while idle"


@dataclass(frozen=True, slots=True)
class SetAsidePolicy:
    """When a node is set aside, and for how long: ``failures`` failures of its ranks (or
    losses of the node) within ``window`` seconds set it aside for ``cooldown`` seconds, twice
    that the next time, and so on up to ``limit``; ``failures=0`` never sets a node aside."""

    failures: int = 3
    window: float = 600.0
    cooldown: float = 60.0
    limit: float = 3600.0

    @classmethod
    def make(cls, value: object) -> SetAsidePolicy:
        """``value`` as a policy: None or True (the defaults), False (never), a policy, or a
        mapping of some of ``failures``, ``window``, ``cooldown``, ``limit`` (durations as
        seconds or text like ``"10m"``)."""
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(failures=0)
        if isinstance(value, SetAsidePolicy):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"set_aside={value!r} is not a set-aside policy: give True (the default: "
                "3 failures in 10 minutes set a node aside for 1 minute, doubling), False "
                "(never), or a dict like {'failures': 3, 'window': '10m', 'cooldown': '1m'}."
            )
        unknown = sorted(set(value) - {"failures", "window", "cooldown", "limit"})
        if unknown:
            raise ConfigError(
                f"set_aside has unknown key(s) {', '.join(map(repr, unknown))}; the keys are "
                "'failures', 'window', 'cooldown' and 'limit'."
            )
        default = cls()
        failures = value.get("failures", default.failures)
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
            raise ConfigError(
                f"set_aside's failures {failures!r} must be a whole number >= 0 (0: never set "
                "a node aside), like 3."
            )
        times = {}
        for key in ("window", "cooldown", "limit"):
            seconds = optional_duration(value.get(key), f"set_aside's {key}")
            times[key] = getattr(default, key) if seconds is None else seconds
        limit = max(times["limit"], times["cooldown"])
        return cls(failures, times["window"], times["cooldown"], limit)

    def cooldown_for(self, times: int) -> float:
        """The cool-down of a node's ``times``-th setting aside (1: the first)."""
        return min(self.limit, self.cooldown * 2.0 ** (times - 1))


def failed_nodes(
    nodes: tuple[NodeSpec, ...], np: int, result: JobResult, error: ClusterError | None
) -> dict[str, str]:
    """The nodes an attempt's ending counts against, each with why: the node of every rank
    that failed on its own (``np`` ranks placed on ``nodes``), and a node that was lost.
    Ranks stopped because another failed, a timeout or a cancel count against none."""
    if not nodes:
        return {}
    where = placement(nodes, np)
    named: dict[str, str] = {}
    for failure in result.failed:
        if 0 <= failure.rank < len(where):
            node = nodes[where[failure.rank]].name
            named.setdefault(node, f"rank {failure.rank} exited {failure.exit_code}")
    if isinstance(error, NodeLostError):
        named.setdefault(error.node, "node lost")
    return named


def idle_drops(
    losses: Mapping[str, int], counted: Mapping[str, int], busy: Collection[str]
) -> tuple[dict[str, str], dict[str, int]]:
    """The nodes lost since the last look that ran no attempt (``busy``: the nodes of the
    attempts running), each with why, and what the next look starts from. ``losses``: how
    many times each node was lost so far (the watch's count, which a node that joined again
    since keeps: a look that comes late misses no drop); ``counted``: those counts at the
    last look. A node lost while it runs ranks is counted by its attempt's end
    (:func:`failed_nodes`), not here; one that left is not lost."""
    dropped = sorted(n for n, times in losses.items() if times > counted.get(n, 0))
    return dict.fromkeys((n for n in dropped if n not in busy), IDLE_DROP), dict(losses)


@dataclass(frozen=True, slots=True)
class Aside:
    """A node set aside: ``reason`` (its last failures, in a few words) and ``until`` (epoch
    seconds, as the clock tells them) its cool-down ends."""

    reason: str
    until: float


@dataclass
class _Record:
    failures: list[float] = field(default_factory=list)  # times, within the window
    times: int = 0  # how often it was set aside
    aside: Aside | None = None


class Bench:
    """The failures of a cluster's nodes, and the nodes set aside for them, under ``policy``;
    ``clock`` gives the time in epoch seconds (``time.time``). Thread-safe: jobs' threads
    note failures while snapshots read it."""

    def __init__(self, policy: SetAsidePolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        self._nodes: dict[str, _Record] = {}
        self._lock = threading.Lock()

    def note(self, failed: Mapping[str, str], nodes: Collection[str] = ()) -> list[str]:
        """Count a failure against each of ``failed`` (node: why); returns the nodes this set
        aside now. Of the cluster's ``nodes``, the last one not aside is never set aside:
        failures on every node are the program's more likely than the nodes', and the job's
        retries go on where they always did."""
        policy, now = self.policy, self._clock()
        if not policy.failures:
            return []
        newly = []
        with self._lock:
            for node, why in failed.items():
                record = self._nodes.setdefault(node, _Record())
                if record.aside is not None and record.aside.until > now:
                    continue  # already aside: a straggler's failure changes nothing
                record.failures = [t for t in record.failures if now - t < policy.window]
                record.failures.append(now)
                if len(record.failures) < policy.failures or self._last(node, nodes, now):
                    continue
                record.times += 1
                cooldown = policy.cooldown_for(record.times)
                count = len(record.failures)
                window = _seconds(policy.window)
                reason = f"{count} failures in {window} (last: {why})"
                record.aside = Aside(reason, now + cooldown)
                record.failures = []
                newly.append(node)
        return newly

    def _last(self, node: str, nodes: Collection[str], now: float) -> bool:
        """Whether ``node`` is the last of ``nodes`` not aside (under the lock)."""
        if not nodes:
            return False
        return all(self._is_aside(other, now) for other in nodes if other != node)

    def _is_aside(self, node: str, now: float) -> bool:
        record = self._nodes.get(node)
        return record is not None and record.aside is not None and record.aside.until > now

    def aside(self) -> dict[str, Aside]:
        """The nodes set aside now, by name (a cool-down that ended lets its node back)."""
        now = self._clock()
        with self._lock:
            return {
                node: r.aside
                for node, r in self._nodes.items()
                if r.aside is not None and r.aside.until > now
            }

    def reinstate(self, node: str) -> bool:
        """Bring ``node`` back now, its failures forgotten (its next cool-down still doubles);
        returns whether it was aside."""
        now = self._clock()
        with self._lock:
            record = self._nodes.get(node)
            if record is None:
                return False
            was = record.aside is not None and record.aside.until > now
            record.aside, record.failures = None, []
            return was


def _seconds(value: float) -> str:
    if value >= 60 and math.isclose(value % 60, 0):
        return f"{value / 60:g} min"
    return f"{value:g} s"


def with_aside(statuses: Sequence[NodeStatus], aside: Mapping[str, Aside]) -> list[NodeStatus]:
    """``statuses`` with the nodes set aside shown so (``state="set-aside"``, the reason in
    ``last_reason``, the end of the cool-down in ``until``); a node lost or gone stays so."""
    return [
        replace(s, state="set-aside", last_reason=a.reason, until=a.until)
        if (a := aside.get(s.name)) is not None and s.state in ("ready", "joined")
        else s
        for s in statuses
    ]
