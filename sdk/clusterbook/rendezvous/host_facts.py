"""This machine's IPv4 addresses and memory, as an agent reports them.

On Linux they are read from the kernel itself: the addresses with one netlink request (what
``getifaddrs(3)`` does), the memory from ``/proc/meminfo``. That costs well under a millisecond,
where importing psutil costs about 20 ms of CPU, and every node's agent reports them at every
bootstrap. Elsewhere psutil answers.
"""

from __future__ import annotations

import socket
import struct

__all__ = ["ipv4_addresses", "memory"]

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
