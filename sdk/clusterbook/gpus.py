"""A node's GPUs, as ``nvidia-smi -L`` lists them, and ``slots="gpus"``.

Each node runs ``nvidia-smi -L`` itself (the SSH probe, an elastic node's agent; a local
cluster's is this machine): no CUDA, torch or driver library is ever loaded, so the head
needs no GPU. A node without ``nvidia-smi``, or where it fails or hangs (it is given
:data:`~clusterbook.nodes.tasks.probe.NVIDIA_SMI_TIMEOUT` seconds), has no GPU, and
:attr:`GPUInfo.problem` says why. A ``CUDA_VISIBLE_DEVICES`` already set where the node is
probed (a container's, a batch job's) restricts its GPUs to those it names, as CUDA would.

``slots="gpus"`` (``"node1:gpus"`` in host lists, ``--slots gpus`` on the command line)
gives a node one slot per GPU, counted when its GPUs are known: when a local cluster is made,
at an SSH cluster's ``start()``, when an elastic node joins. A node with none is a
:class:`~clusterbook.ConfigError` naming it (:func:`slots_from_gpus`).

MIG instances are not counted apart: a GPU split into MIG instances is one GPU here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from clusterbook.errors import ConfigError
from clusterbook.nodes.tasks import probe

__all__ = [
    "GPU",
    "GPUS",
    "NO_GPUS",
    "UTILIZATION_QUERY",
    "GPUInfo",
    "Slots",
    "gpu_info",
    "parse_nvidia_smi",
    "parse_utilization",
    "probe_gpus",
    "slots_from_gpus",
    "visible_gpus",
]

#: The slots value that means "one slot per GPU of the node".
GPUS: Final = "gpus"

#: What ``slots`` may be: a number of ranks, or :data:`GPUS`.
Slots: TypeAlias = int | Literal["gpus"]

# "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-6e9c...)"; MIG devices are indented "MIG ..." lines.
_LINE_RE = re.compile(r"GPU (\d+): (.*?)(?: \(UUID: ([^)\s]+)\))?\s*")


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU: its index as ``nvidia-smi`` numbers it (PCI bus order), its model and UUID
    (``""`` when not listed)."""

    index: int
    model: str
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class GPUInfo:
    """The GPUs a node has.

    Attributes
    ----------
    devices
        The GPUs, in ``nvidia-smi`` order (as ``CUDA_VISIBLE_DEVICES`` there orders them).
    problem
        Why there is none, when ``nvidia-smi`` could not tell (``"nvidia-smi is not on
        PATH"``); None when it answered.
    """

    devices: tuple[GPU, ...] = ()
    problem: str | None = None

    @property
    def count(self) -> int:
        """How many GPUs."""
        return len(self.devices)

    @property
    def models(self) -> tuple[str, ...]:
        """The model of each GPU."""
        return tuple(d.model for d in self.devices)

    @property
    def uuids(self) -> tuple[str, ...]:
        """The UUID of each GPU (``""`` where unknown)."""
        return tuple(d.uuid for d in self.devices)

    @property
    def ids(self) -> tuple[str, ...]:
        """What ``CUDA_VISIBLE_DEVICES`` names each GPU by: its index, with
        ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (nvidia-smi's order)."""
        return tuple(str(d.index) for d in self.devices)

    @property
    def model(self) -> str | None:
        """The model, or the models with their counts (``"NVIDIA A100 (2), Tesla T4 (1)"``);
        None without GPUs."""
        if not self.devices:  # most nodes: asked of each for every snapshot
            return None
        counts = Counter(self.models)
        if len(counts) <= 1:
            return next(iter(counts), None)
        return ", ".join(f"{name} ({n})" for name, n in counts.items())

    def share(self, part: int, parts: int) -> GPUInfo:
        """Share ``part`` of ``parts`` near-equal shares, in order (the first get one more
        when they do not divide evenly): what each of a machine's local workers gets."""
        base, extra = divmod(self.count, parts)
        start = part * base + min(part, extra)
        devices = self.devices[start : start + base + (part < extra)]
        problem = self.problem
        if not devices and self.devices:
            problem = f"this machine's {self.count} GPU(s) all went to the workers before it"
        return GPUInfo(devices, problem)

    def to_json(self) -> dict[str, Any]:
        return {
            "devices": [[d.index, d.model, d.uuid] for d in self.devices],
            "problem": self.problem,
        }

    @classmethod
    def from_json(cls, data: object) -> GPUInfo:
        """Read :meth:`to_json` back; whatever is malformed reads as no GPU."""
        if not isinstance(data, Mapping):
            return cls()
        devices = []
        for item in data.get("devices") or ():
            if (
                isinstance(item, list)
                and len(item) == 3
                and type(item[0]) is int
                and isinstance(item[1], str)
                and isinstance(item[2], str)
            ):
                devices.append(GPU(item[0], item[1], item[2]))
        problem = data.get("problem")
        problem = problem if isinstance(problem, str) else None
        if devices or cls is not GPUInfo:
            return cls(tuple(devices), problem)
        # Most nodes have none, for one of a few reasons: one value each, shared by every
        # report a head reads (100,000 nodes' reports are as many objects fewer).
        found = _NONE.get(problem)
        if found is None:
            if len(_NONE) >= 64:
                _NONE.clear()
            found = _NONE[problem] = cls((), problem)
        return found


#: A node with no GPU, or whose GPUs are not known yet.
NO_GPUS: Final = GPUInfo()
_NONE: dict[str | None, GPUInfo] = {None: NO_GPUS}  # GPUInfo.from_json's values without GPUs


def parse_nvidia_smi(text: str) -> tuple[GPU, ...]:
    """The GPUs ``nvidia-smi -L`` lists in ``text``; lines that are not a GPU's (MIG
    instances, notices) are skipped."""
    found = []
    for line in text.splitlines():
        match = _LINE_RE.fullmatch(line.strip())
        if match is not None:
            index, model, uuid = match.groups()
            found.append(GPU(int(index), model.strip(), uuid or ""))
    return tuple(found)


#: The arguments that make ``nvidia-smi`` print each GPU's index and use now (percent).
UTILIZATION_QUERY: Final = ("--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits")


def parse_utilization(text: str, gpus: GPUInfo) -> float | None:
    """The mean use (percent) of ``gpus`` in what ``nvidia-smi`` printed for
    :data:`UTILIZATION_QUERY` (``"0, 37"`` a line); None when it names none of them or
    cannot tell (``[N/A]``)."""
    wanted = {d.index for d in gpus.devices}
    found = []
    for line in text.splitlines():
        index, _, value = line.partition(",")
        try:
            gpu, used = int(index), float(value)
        except ValueError:
            continue
        if gpu in wanted and 0 <= used <= 100:
            found.append(used)
    return sum(found) / len(found) if found else None


def visible_gpus(devices: tuple[GPU, ...], cuda_visible_devices: str | None) -> tuple[GPU, ...]:
    """Of ``devices``, those ``CUDA_VISIBLE_DEVICES`` names (all of them when it is not
    set), in its order. Like CUDA, it reads indices and ``GPU-`` UUID prefixes up to the
    first entry that names no GPU; an empty value hides every GPU."""
    if cuda_visible_devices is None:
        return devices
    by_index = {str(d.index): d for d in devices}
    chosen: list[GPU] = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        gpu = by_index.get(entry)
        if gpu is None and entry.startswith("GPU-"):
            matches = [d for d in devices if d.uuid.startswith(entry)]
            gpu = matches[0] if len(matches) == 1 else None
        if gpu is None:
            break
        if gpu not in chosen:
            chosen.append(gpu)
    return tuple(chosen)


def gpu_info(reply: Mapping[str, Any]) -> GPUInfo:
    """A node's GPUs from what :func:`clusterbook.nodes.tasks.probe.nvidia_smi` answered there."""
    error = reply.get("error")
    if isinstance(error, str):
        return GPUInfo(problem=error)
    stdout = reply.get("stdout")
    listed = parse_nvidia_smi(stdout if isinstance(stdout, str) else "")
    if not listed:
        return GPUInfo(problem="nvidia-smi -L lists no GPU")
    cvd = reply.get("cuda_visible_devices")
    cvd = cvd if isinstance(cvd, str) else None
    devices = visible_gpus(listed, cvd)
    if not devices:
        hidden = f"CUDA_VISIBLE_DEVICES={cvd!r} where it was probed hides all {len(listed)}"
        return GPUInfo(problem=f"{hidden} of its GPUs")
    return GPUInfo(devices)


def probe_gpus(timeout: float = probe.NVIDIA_SMI_TIMEOUT) -> GPUInfo:
    """This machine's GPUs: ``nvidia-smi -L`` (found on ``PATH``) run here, given
    ``timeout`` seconds; no GPU, with the reason, when it is missing, fails or hangs."""
    return gpu_info(probe.nvidia_smi(timeout))


def slots_from_gpus(gpus: GPUInfo, *, node: str, asked: str, fix: str) -> int:
    """The slots of ``node`` asked as ``asked`` (``"slots='gpus'"``, ``"'node1:gpus'"``): its
    GPU count; a :class:`~clusterbook.ConfigError` saying ``fix`` when it has none."""
    if gpus.count:
        return gpus.count
    why = gpus.problem or "nvidia-smi lists none"
    raise ConfigError(
        f"Node {node} has no GPU ({why}), so {asked}, one slot per GPU, would give it none; {fix}."
    )
