"""What an agent reports of its machine, read from the kernel without psutil, agrees with
psutil; and a node's agent reports without importing it."""

from __future__ import annotations

import socket
import subprocess
import sys

import psutil
import pytest

from clusterbook.rendezvous import host_facts
from clusterbook.rendezvous.report import NodeReport


@pytest.mark.skipif(not hasattr(socket, "AF_NETLINK"), reason="Linux's netlink")
def test_the_addresses_are_those_psutil_finds() -> None:
    ours = host_facts.ipv4_addresses()
    theirs = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET
    ]
    assert sorted(ours) == sorted(theirs)
    assert "127.0.0.1" in ours


def test_an_address_message_of_a_point_to_point_link_gives_the_local_address() -> None:
    # IFA_ADDRESS is the peer's there; IFA_LOCAL, when present, is ours (as getifaddrs reads).
    def attr(kind: int, value: bytes) -> bytes:
        return host_facts._RTATTR.pack(4 + len(value), kind) + value

    head = host_facts._IFADDRMSG.pack(socket.AF_INET, 32, 0, 0, 7)
    peer, local = socket.inet_aton("10.0.0.2"), socket.inet_aton("10.0.0.1")
    both = head + attr(host_facts._IFA_ADDRESS, peer) + attr(host_facts._IFA_LOCAL, local)
    assert host_facts._address(both) == "10.0.0.1"
    assert host_facts._address(head + attr(host_facts._IFA_ADDRESS, peer)) == "10.0.0.2"
    assert host_facts._address(head) is None
    v6 = host_facts._IFADDRMSG.pack(socket.AF_INET6, 64, 0, 0, 7)
    assert host_facts._address(v6 + attr(host_facts._IFA_ADDRESS, b"\0" * 16)) is None


def test_the_memory_is_what_psutil_says() -> None:
    total, used = host_facts.memory()
    vm = psutil.virtual_memory()
    assert total == vm.total
    assert abs(used - vm.percent) < 5  # the two reads are moments apart


def test_without_proc_meminfo_psutil_answers(tmp_path) -> None:
    assert host_facts.memory(str(tmp_path / "none"))[0] == psutil.virtual_memory().total


def test_a_report_and_its_heartbeats_do_not_import_psutil() -> None:
    # psutil costs ~20 ms of CPU to import, on every node at every bootstrap.
    code = (
        "import sys\n"
        "from clusterbook.rendezvous.report import NodeReport\n"
        "r = NodeReport.here(1).with_load()\n"
        "assert r.memory and r.memory_used is not None and r.addresses, r\n"
        "print('psutil' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"


def test_a_report_names_the_mpi_installed_beside_its_python() -> None:
    from clusterbook.nodes.tasks.probe import installed_mpi

    found = installed_mpi()
    if found is None:
        pytest.skip("no MPI distribution in this environment")
    assert NodeReport.here(1).mpi == found
