"""Validated, immutable descriptions of what a cluster is made of, and the checks on user input.

Every check raises :class:`~clusterbook.errors.ConfigError` with a message that names the value,
the rule and the fix, so that bad input never surfaces as a traceback from deep inside.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from clusterbook.durations import duration, optional_duration
from clusterbook.errors import ConfigError
from clusterbook.gpus import GPUS, NO_GPUS, GPUInfo, Slots
from clusterbook.nodes.tasks.cpus import parse_place
from clusterbook.wording import spell

__all__ = [
    "CLUSTER_OPTIONS",
    "NodeSpec",
    "parse_host_slots",
    "parse_hostfile",
    "read_hostfile",
    "validate_channel_port",
    "validate_env",
    "validate_forward_env",
    "validate_host",
    "validate_np",
    "validate_port",
    "validate_positive_int",
    "validate_seconds",
    "validate_slots",
    "validate_timeout",
]

# A DNS name or an IPv4 address: what mpirun hostfiles and ssh accept without quoting. The
# first character is never "-", so a host can never be read as an option by ssh or mpirun.
_HOST_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: The options every cluster takes, whatever its kind (``Cluster.local(..., name=...)``: see
#: :class:`clusterbook.cluster.options.ClusterOptions`): what a cluster spec holds besides its
#: kind's own arguments. Here, below the providers, so that a reader of the system around this
#: process tells the two apart without knowing the cluster.
CLUSTER_OPTIONS = frozenset(
    {
        "name",
        "run_dir",
        "python",
        "launcher",
        "mpi",
        "env",
        "forward_env",
        "life_span",
        "idle_timeout",
        "retention",
        "detached",
        "ephemeral",
        "work_dir",
        "work_dir_options",
        "set_aside",
    }
)


def validate_host(host: object) -> str:
    """Return ``host`` if it is a plain host name or IPv4 address, else raise ConfigError."""
    if not isinstance(host, str) or not host:
        raise ConfigError(f"Host {host!r} is empty or not a string; give a host name like 'node1'.")
    if host.startswith("-"):
        raise ConfigError(
            f"Host {host!r} starts with '-', which ssh and mpirun would read as an option; "
            "give a host name like 'node1'."
        )
    if len(host) > 253:
        raise ConfigError(
            f"Host {host[:40]!r}... is {len(host)} characters long; host names have at most 253."
        )
    if not _HOST_RE.fullmatch(host):
        bad = sorted({c for c in host if not re.fullmatch(r"[A-Za-z0-9._-]", c)})
        raise ConfigError(
            f"Host {host!r} contains characters {''.join(bad)!r} that are not allowed in a host "
            "name; use letters, digits, '.', '-' and '_' only (like 'node1' or '10.0.0.5')."
        )
    return host


def validate_positive_int(value: object, name: str) -> int:
    """Return ``value`` as an int if it is an integer >= 1, else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a whole number >= 1, got {value!r}.")
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}.")
    return value


def validate_slots(value: object, name: str = "slots") -> Slots:
    """``value`` as the slots of a node: a whole number >= 1, or ``"gpus"`` (one slot per
    GPU of the node, counted once its GPUs are known: :mod:`clusterbook.gpus`)."""
    if value == GPUS:
        return GPUS
    if isinstance(value, str):
        raise ConfigError(
            f"{name} must be a whole number >= 1 or {GPUS!r} (one slot per GPU), got {value!r}."
        )
    return validate_positive_int(value, name)


def parse_host_slots(text: object, default_slots: Slots = 1) -> tuple[str, Slots]:
    """Parse ``"node1:4"`` into ``("node1", 4)`` and ``"node1:gpus"`` into ``("node1",
    "gpus")`` (one slot per GPU); ``"node1"`` gets ``default_slots``."""
    if not isinstance(text, str):
        raise ConfigError(f"Host entry {text!r} must be a string like 'node1:4'.")
    host, sep, slots_text = text.partition(":")
    if not host:
        raise ConfigError(f"Host entry {text!r} has no host name; write it like 'node1:4'.")
    validate_host(host)
    if not sep:
        return host, default_slots
    if slots_text == GPUS:
        return host, GPUS
    if not re.fullmatch(r"-?[0-9]+", slots_text):
        raise ConfigError(
            f"Slots {slots_text!r} in host entry {text!r} is not a number; write it like "
            f"'{host}:4' (or '{host}:{GPUS}', one slot per GPU)."
        )
    slots = int(slots_text)
    if slots < 1:
        raise ConfigError(
            f"Slots in host entry {text!r} must be >= 1, got {slots}; write it like '{host}:4'."
        )
    return host, slots


_HOSTFILE_FORMS = "'HOST', 'HOST slots=N' (Open MPI) or 'HOST:N' (MPICH), like 'node1 slots=4'"


def parse_hostfile(text: str, source: str = "hostfile") -> list[str]:
    """The hosts of an Open MPI (``node1 slots=4``, ``max_slots=N`` too) or MPICH
    (``node1:4``) hostfile as ``["node1:4", ...]``, one entry per distinct host in the order
    they first appear, with the slots of its lines added up (a PBS nodefile lists a host once
    per slot). Comments (``#``) and blank lines are skipped; a host without slots gets none
    (the default of whoever reads them). Anything else is a :class:`ConfigError` naming
    ``source``, the line's number, the line and the forms a line may take."""
    slots_of: dict[str, list[Slots | None]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {number}: {raw.strip()!r}"
        try:
            host, slots = _hostfile_line(line)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc} Write each line as {_HOSTFILE_FORMS}.") from None
        if host is None:
            raise ConfigError(f"{where} is not {_HOSTFILE_FORMS}.")
        slots_of.setdefault(host, []).append(slots)
    if not slots_of:
        raise ConfigError(f"{source} lists no host; write one per line, like 'node1 slots=4'.")
    return [_summed(host, given, source) for host, given in slots_of.items()]


def _hostfile_line(line: str) -> tuple[str | None, Slots | None]:
    """``(host, slots)`` of one hostfile line (None for slots not given); ``(None, None)``
    when the line has a word of neither format."""
    host, *rest = line.split()
    slots: Slots | None = None
    if ":" in host:  # MPICH's HOST:N
        if rest:
            return None, None
        return parse_host_slots(host)
    validate_host(host)
    for word in rest:
        key, sep, value = word.partition("=")
        if key == "slots" and value == GPUS:
            slots = GPUS
        elif key in ("slots", "max_slots", "max-slots") and sep and value.isdigit():
            if int(value) < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}.")
            slots = int(value) if key == "slots" or slots is None else slots
        else:
            return None, None
    return host, slots


def _summed(host: str, given: list[Slots | None], source: str) -> str:
    if len(given) == 1:
        return host if given[0] is None else f"{host}:{given[0]}"
    if GPUS in given:
        raise ConfigError(
            f"{source} lists host {host!r} {len(given)} times, once with slots={GPUS}: list it "
            f"once, with slots={GPUS} or a number."
        )
    return f"{host}:{sum(1 if s is None else int(s) for s in given)}"


def read_hostfile(path: str | os.PathLike[str]) -> list[str]:
    """:func:`parse_hostfile` of the file at ``path``."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(
            f"Cannot read the hostfile {os.fspath(path)!r}: {exc.strerror}; give the path of "
            "a readable hostfile."
        ) from None
    return parse_hostfile(text, f"hostfile {os.fspath(path)!r}")


#: The host of a node that is this machine.
HERE = "localhost"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of a cluster: where ranks run and how many of them fit.

    Parameters
    ----------
    name
        Name shown in status tables (``local-0``, ``node1``).
    host
        Host name or address the MPI launcher uses to reach the node.
    slots
        Number of ranks the node takes before it counts as oversubscribed.
    cores
        Cores of its host this node may use when known (its CPU affinity capped by its
        cgroup CPU quota; nodes on one host share them); a job with more ranks on the host
        runs without core binding, and warns unless it says ``oversubscribe=True``.
    gpus
        The node's GPUs (none until known): each rank there gets one of them in
        ``CUDA_VISIBLE_DEVICES``.
    place
        Where its cores are, when known: its machine (the kernel's boot id) and the CPUs its
        affinity allows there, as ``MACHINE/CPUS`` (``9178a1e2-.../0-3``). Hosts of one
        machine (containers, network namespaces, several sshds) whose CPUs overlap share
        them: a job's ranks there are counted together against them.
    """

    name: str
    host: str
    slots: int
    cores: int | None = None
    gpus: GPUInfo = NO_GPUS
    place: str | None = None

    @property
    def here(self) -> bool:
        """Whether the node is this machine (its host ``localhost``), where the launcher
        starts its ranks without a remote shell."""
        return self.host == HERE

    def __post_init__(self) -> None:
        validate_host(self.host)
        validate_positive_int(self.slots, f"Slots of node {self.name!r}")
        if not isinstance(self.gpus, GPUInfo):
            raise ConfigError(
                f"gpus of node {self.name!r} must be a GPUInfo, got {type(self.gpus).__name__}."
            )
        if self.place is not None and parse_place(self.place) is None:
            raise ConfigError(
                f"place of node {self.name!r} must be MACHINE/CPUS (like 'b00t-1d/0-3'), "
                f"got {self.place!r}."
            )


def validate_np(np: object, total_slots: int, *, oversubscribe: bool) -> int:
    """Check the number of ranks of a job against the cluster's slots."""
    if isinstance(np, bool) or not isinstance(np, int):
        raise ConfigError(f"np must be a whole number of ranks >= 1, got {np!r}.")
    if np < 1:
        raise ConfigError(f"np must be >= 1 (the number of MPI ranks), got {np}.")
    if np > total_slots and not oversubscribe:
        raise ConfigError(
            f"{spell('np', np)} is more than the cluster's {total_slots} slots; ask for at "
            f"most {total_slots} ranks, give the cluster more slots, or pass "
            f"{spell('oversubscribe', True)} to run more than one rank per slot."
        )
    return np


def validate_port(value: object, name: str = "port", *, free: str | None = None) -> int:
    """``value`` as a TCP port, 1-65535; 0 too when ``free`` says what it means (like
    ``"any free one"``). The one check of every port clusterbook is given."""
    low = 0 if free is not None else 1
    rule = f"a port must be {low}-65535" + (f" (0: {free})" if free is not None else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a whole number: {rule}, got {value!r}.")
    if value < low:
        raise ConfigError(f"{name} must be >= {low}: {rule}, got {value}.")
    if value > 65535:
        raise ConfigError(f"{name} must be at most 65535: {rule}, got {value}.")
    return value


def validate_channel_port(value: object, store_port: object) -> int | None:
    """``channel_port`` (where the agents dial the head for their nodes' MPI daemons): None
    (no channels), 0 (any free port) or a port that is not the rendezvous store's."""
    if value is None:
        return None
    port = validate_port(value, "channel_port", free="any free one")
    if port and port == store_port:
        raise ConfigError(
            f"channel_port={port} is the rendezvous store's port too: the agents' channel needs "
            "a port of its own; give another (open it to the nodes as the store's), 0 for any "
            "free one, or None for no channels."
        )
    return port


def validate_seconds(
    value: object, name: str = "timeout", *, optional: bool = False, zero: bool = False
) -> float | None:
    """``value`` as float seconds (:mod:`clusterbook.durations`: seconds, a timedelta or text
    like ``"30m"``): > 0 (>= 0 with ``zero``; None too, meaning no limit, with ``optional``)."""
    if optional:
        return optional_duration(value, name, zero=zero)
    return duration(value, name, zero=zero)


def validate_timeout(timeout: object, name: str = "timeout") -> float | None:
    """A time limit: seconds > 0, or None for none (:func:`validate_seconds`)."""
    return validate_seconds(timeout, name, optional=True)


def validate_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Check that env names are valid variable names and values are strings without NUL."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigError(f"env must be a mapping of names to strings, got {type(env).__name__}.")
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
            raise ConfigError(
                f"Environment variable name {name!r} is invalid; names are letters, digits and "
                "'_', not starting with a digit (like 'SEED' or 'OMP_NUM_THREADS')."
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"Environment variable {name} has value {value!r} of type "
                f"{type(value).__name__}; pass a string, like {name}={str(value)!r}."
            )
        if "\0" in value:
            raise ConfigError(
                f"Environment variable {name} contains a NUL character, which no process "
                "environment can carry; remove it."
            )
        out[name] = value
    return out


def validate_forward_env(patterns: object) -> tuple[str, ...]:
    """``forward_env``: variable names, or prefixes ending in ``*`` (``"NCCL_*"``), each once."""
    if patterns is None:
        return ()
    # The option as this interface has it: forward_env, or --forward-env on the command line.
    option = (spell("forward_env", "") or "forward_env=").partition("=")[0].strip()
    example = "NCCL_* or WANDB_API_KEY"
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)):
        raise ConfigError(
            f"{option} must be a list of variable names or prefixes ending in '*' (like "
            f"{example}), got {patterns!r}."
        )
    for pattern in patterns:
        if pattern == "*":
            raise ConfigError(
                f"'*' in {option} would send this machine's whole environment (HOME, PATH, its "
                "ssh agent...) to the ranks on other hosts; list the names or prefixes they "
                f"need, like {example}."
            )
        if not isinstance(pattern, str) or not _ENV_NAME_RE.fullmatch(pattern.removesuffix("*")):
            raise ConfigError(
                f"{option} entry {pattern!r} is not a variable name nor a prefix ending in '*' "
                f"(letters, digits and '_', not starting with a digit); write it like {example}."
            )
    return tuple(dict.fromkeys(patterns))
