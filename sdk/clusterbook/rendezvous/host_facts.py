"""This machine's IPv4 addresses, memory and use, as an agent reports them.

On Linux they are read from the kernel itself: the addresses with one netlink request (what
``getifaddrs(3)`` does), the memory from ``/proc/meminfo``, the CPU time from ``/proc/stat``.
That costs well under a millisecond, where importing psutil costs about 20 ms of CPU, and every
node's agent reports them at every bootstrap. Elsewhere psutil answers. A :class:`UsageMeter`
says how busy the CPU and the GPUs were since its last reading: what an agent's heartbeat
carries (the GPUs' through ``nvidia-smi``, only on a node that has some).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable

from clusterbook.gpus import NO_GPUS, UTILIZATION_QUERY, GPUInfo, parse_utilization

__all__ = ["UsageMeter", "cpu_times", "ipv4_addresses", "memory"]

# netlink(7), rtnetlink(7)
_NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
_RTATTR = struct.Struct("=HH")  # length, type
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_RTM_NEWADDR, _RTM_GETADDR = 20, 22
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_MEMINFO = "/proc/meminfo"


def ipv4_addresses() -> tuple[str, ...]:
    """Every IPv4 address of this machine's interfaces, loopback included, in the kernel's
    order."""
    if not hasattr(socket, "AF_NETLINK"):
        return _psutil_addresses()
    try:
        return _netlink_addresses()
    except OSError:
        return _psutil_addresses()


def _netlink_addresses() -> tuple[str, ...]:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:  # NETLINK_ROUTE
        sock.bind((0, 0))
        body = _IFADDRMSG.pack(socket.AF_INET, 0, 0, 0, 0)
        header = _NLMSG.pack(
            _NLMSG.size + len(body), _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
        )
        sock.sendall(header + body)
        found: list[str] = []
        while True:
            data = sock.recv(65536)
            if not data:
                raise OSError("netlink: the kernel closed the socket")
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
                if length < _NLMSG.size:
                    raise OSError(f"netlink: a message of {length} bytes")
                if kind == _NLMSG_DONE:
                    return tuple(found)
                if kind == _NLMSG_ERROR:
                    raise OSError("netlink: the kernel refused the address dump")
                if kind == _RTM_NEWADDR:
                    address = _address(data[offset + _NLMSG.size : offset + length])
                    if address is not None:
                        found.append(address)
                offset += (length + 3) & ~3


def _address(message: bytes) -> str | None:
    """The local address an RTM_NEWADDR message carries: IFA_LOCAL, else IFA_ADDRESS (on a
    point-to-point link IFA_ADDRESS is the peer's), as ``getifaddrs`` reads them."""
    family = message[0]
    if family != socket.AF_INET:
        return None
    attrs: dict[int, bytes] = {}
    offset = _IFADDRMSG.size
    while offset + _RTATTR.size <= len(message):
        length, kind = _RTATTR.unpack_from(message, offset)
        if length < _RTATTR.size:
            break
        attrs[kind] = message[offset + _RTATTR.size : offset + length]
        offset += (length + 3) & ~3
    raw = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
    return socket.inet_ntoa(raw) if raw is not None and len(raw) == 4 else None


def _psutil_addresses() -> tuple[str, ...]:
    import psutil

    return tuple(
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET
    )


def memory(meminfo: str = _MEMINFO) -> tuple[int, float]:
    """Total memory in bytes, and the percent in use (what is not available), as psutil's
    ``virtual_memory()`` gives ``total`` and ``percent``: read from ``meminfo``, or from psutil
    where that cannot be read."""
    try:
        with open(meminfo, "rb") as f:
            text = f.read()
    except OSError:
        text = b""
    fields: dict[bytes, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(b":")
        if name in (b"MemTotal", b"MemAvailable"):
            fields[name] = int(rest.split()[0]) * 1024
    total, available = fields.get(b"MemTotal"), fields.get(b"MemAvailable")
    if total is None or available is None or total <= 0:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.total), float(vm.percent)
    return total, round((total - available) / total * 100, 1)


_STAT = "/proc/stat"
_GPU_EVERY = 2.0  # seconds between two runs of nvidia-smi at least: each costs the node some CPU
_GPU_LIMIT = 10.0  # seconds a run may take before it is killed (and the use is unknown)


def cpu_times(stat: str = _STAT) -> tuple[float, float] | None:
    """This machine's CPU time so far, busy and in all (in the kernel's ticks), from the
    ``cpu`` line of ``stat``; None where that cannot be read."""
    try:
        with open(stat, "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 5 or fields[0] != b"cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    total = float(sum(ticks))
    return total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total


class UsageMeter:
    """How busy this machine's CPU and ``gpus`` are: :meth:`cpu` the percent of all cores
    busy since its last call (None the first time), :meth:`gpu` the mean use of the GPUs
    (percent) as ``nvidia-smi`` said last. ``nvidia-smi`` runs in the background, one run
    at a time and every 2 s at most, so that a reading never waits on it: each call
    takes the answer of the run before and starts the next. Without GPUs, or without
    ``nvidia-smi``, nothing runs and :meth:`gpu` is None."""

    def __init__(
        self,
        gpus: GPUInfo = NO_GPUS,
        *,
        stat: str = _STAT,
        nvidia_smi: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gpus = gpus
        self._stat = stat
        self._clock = clock
        self._last_cpu = cpu_times(stat)
        self._smi = (nvidia_smi or shutil.which("nvidia-smi")) if gpus.count else None
        self._run: subprocess.Popen[str] | None = None
        self._started = -_GPU_EVERY
        self._gpu: float | None = None

    def cpu(self) -> float | None:
        now, before = cpu_times(self._stat), self._last_cpu
        self._last_cpu = now
        if now is None or before is None or now[1] <= before[1]:
            return None
        busy = (now[0] - before[0]) / (now[1] - before[1]) * 100
        return min(100.0, max(0.0, busy))

    def gpu(self) -> float | None:
        if self._smi is None:
            return None
        now, run = self._clock(), self._run
        if run is not None and run.poll() is not None:
            out, _ = run.communicate()
            self._gpu = parse_utilization(out, self._gpus) if run.returncode == 0 else None
            self._run = run = None
        elif run is not None and now - self._started > _GPU_LIMIT:
            self.close()
            self._gpu = None
        if self._run is None and now - self._started >= _GPU_EVERY:
            self._started = now
            try:
                self._run = subprocess.Popen(
                    [self._smi, *UTILIZATION_QUERY],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            except OSError:
                self._smi = None  # gone, or not runnable: no GPU use to tell
        return self._gpu

    def close(self) -> None:
        """Stop a run of ``nvidia-smi`` still going."""
        run, self._run = self._run, None
        if run is not None:
            with contextlib.suppress(OSError):
                run.kill()
            run.wait()
            if run.stdout is not None:
                run.stdout.close()
