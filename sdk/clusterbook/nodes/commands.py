"""A command on every node of a cluster (``cluster.run_on_nodes``), in parallel: for set-up
such as ``pip install``, or a look around (``hostname``, ``nvidia-smi``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusterbook.errors import ConfigError
from clusterbook.launch.program import check_argv
from clusterbook.nodes.call import Call
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.tasks.commands import run as run_here
from clusterbook.spec import NodeSpec, validate_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COMMAND_COLUMNS", "NodeRun", "chosen_nodes", "run_everywhere", "runs_frame"]

COMMAND_COLUMNS = ("node", "host", "returncode", "stdout", "stderr", "duration")
#: The dtype of every column of :func:`runs_frame`, whatever the rows.
COMMAND_DTYPES = {
    "node": "string",
    "host": "string",
    "returncode": "Int64",
    "stdout": "string",
    "stderr": "string",
    "duration": "timedelta64[ns]",
}


@dataclass(frozen=True, slots=True)
class NodeRun:
    """How a command went on one node: its exit code (None: stopped at its timeout, or the
    node could not be asked), the end of its output, and the seconds it took."""

    node: str
    host: str
    returncode: int | None
    stdout: str
    stderr: str
    duration: float


def run_everywhere(
    nodes: Sequence[NodeSpec],
    callers: Mapping[str, Call],
    argv: Sequence[str],
    timeout: float,
    unreachable: Mapping[str, Exception] | None = None,
    only: Collection[str] | None = None,
) -> list[NodeRun]:
    """Run ``argv`` on every node at once (``only``: on those of these names), through its
    node task caller (``callers``, by node name) if it has one, else here (the node is this
    machine), but not on the nodes ``unreachable`` names. A node that cannot be asked has the
    reason as its stderr."""
    if only is not None:
        nodes = [n for n in nodes if n.name in only]
    cannot = dict(unreachable or {})
    args: dict[str, Any] = {"argv": check_argv(argv), "timeout": validate_seconds(timeout)}

    def one(name: str) -> dict[str, Any]:
        call = callers.get(name)
        if call is None:
            return run_here(args)
        done: dict[str, Any] = call("run", args, float(args["timeout"]) + 30.0)
        return done

    by_name = {n.name: n for n in nodes}
    done, failed = parallel([n for n in by_name if n not in cannot], one)
    failed = {**cannot, **failed}
    out = []
    for name, node in by_name.items():
        if name in done:
            d = done[name]
            out.append(
                NodeRun(name, node.host, d["returncode"], d["stdout"], d["stderr"], d["duration"])
            )
        else:
            out.append(NodeRun(name, node.host, None, "", str(failed[name]), 0.0))
    return out


def chosen_nodes(
    nodes: Sequence[NodeSpec], asked: str | Collection[str] | None, op: str
) -> tuple[str, ...] | None:
    """The names of the nodes ``asked`` (``nodes=`` of ``op``: a node's name, or a list of
    them, as ``cluster.nodes`` and ``status()`` name them), or None for every node; a
    :class:`ConfigError` for a name that is none of ``nodes``, listing theirs."""
    if asked is None:
        return None
    names = [asked] if isinstance(asked, str) else asked
    if not isinstance(names, Collection) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f"{op}(nodes={asked!r}): give node names, like nodes=['{_first(nodes)}'], or "
            "nodes=None for every node."
        )
    known = [n.name for n in nodes]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        said = ", ".join(map(repr, unknown)) or "no node"
        raise ConfigError(
            f"{op}(nodes={asked!r}): {said} is not a node of the cluster; its nodes are "
            f"{', '.join(known) or 'none yet'} (as cluster.nodes and status() name them)."
        )
    return tuple(dict.fromkeys(names))


def _first(nodes: Sequence[NodeSpec]) -> str:
    return nodes[0].name if nodes else "node1"


def runs_frame(runs: Sequence[NodeRun]) -> pd.DataFrame:
    """One row per node: node, host, returncode (nullable Int64), stdout, stderr, duration
    (a timedelta)."""
    import pandas as pd

    rows = [(r.node, r.host, r.returncode, r.stdout, r.stderr, r.duration) for r in runs]
    frame: pd.DataFrame = pd.DataFrame(rows, columns=list(COMMAND_COLUMNS))
    seconds = frame["duration"].astype("float64")
    frame["duration"] = pd.to_timedelta(seconds, unit="s").dt.round("us")  # not the float noise
    typed: pd.DataFrame = frame.astype(COMMAND_DTYPES)
    return typed
