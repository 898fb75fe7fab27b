"""What an agent reports of its machine, read from the kernel without psutil, agrees with
psutil; and a node's agent reports without importing it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import psutil
import pytest

from clusterbook.gpus import GPU, NO_GPUS, GPUInfo
from clusterbook.nodes.tasks.cpus import place_here
from clusterbook.providers.elastic.far import round_nodes
from clusterbook.rendezvous import host_facts
from clusterbook.rendezvous.report import NodeReport
from clusterbook.testing import fake_nvidia_smi


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
        "from clusterbook.rendezvous.host_facts import UsageMeter\n"
        "meter = UsageMeter()\n"
        "r = NodeReport.here(1).with_load(meter)\n"
        "assert r.memory and r.memory_used is not None and r.addresses, r\n"
        "import time; time.sleep(0.05)  # a few of the kernel's ticks\n"
        "r = NodeReport.here(1).with_load(meter)\n"
        "assert r.cpu is not None and r.gpu_used is None, r\n"
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


STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def test_the_cpu_use_is_the_busy_share_of_the_ticks_since_the_reading_before(tmp_path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT.format(user=100, system=50, idle=800, iowait=50))
    assert host_facts.cpu_times(str(stat)) == (150.0, 1000.0)
    meter = host_facts.UsageMeter(stat=str(stat))
    assert meter.cpu() is None  # nothing passed since the meter was made
    stat.write_text(STAT.format(user=160, system=70, idle=860, iowait=60))  # 80 of 150 busy
    assert meter.cpu() == pytest.approx(80 / 150 * 100)
    stat.write_text("intr 1 2 3\n")
    assert meter.cpu() is None
    assert host_facts.cpu_times(str(tmp_path / "none")) is None


def test_the_cpu_use_here_is_what_psutil_sees() -> None:
    meter = host_facts.UsageMeter()
    psutil.cpu_percent(None)
    sum(range(3_000_000))  # something to measure
    ours, theirs = meter.cpu(), psutil.cpu_percent(None)
    assert ours is not None
    assert abs(ours - theirs) < 25  # the two reads are moments apart, on a shared machine


def gpus_of(count: int) -> GPUInfo:
    return GPUInfo(tuple(GPU(i, "NVIDIA A100-SXM4-40GB") for i in range(count)))


def test_the_gpu_use_comes_from_nvidia_smi_in_the_background_once_a_second(tmp_path) -> None:
    where = fake_nvidia_smi(tmp_path / "smi", 4, utilization=[10, 20, 30, 70])
    clock = [100.0]
    mine = GPUInfo(gpus_of(4).devices[2:])  # GPUs 2 and 3 of the machine
    meter = host_facts.UsageMeter(
        mine, nvidia_smi=str(where / "nvidia-smi"), clock=lambda: clock[0]
    )
    assert meter.gpu() is None  # the first run started: nothing said yet
    deadline = time.monotonic() + 10
    while meter.gpu() is None:  # the same run, read once it ended; no second one starts
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert meter.gpu() == 50.0  # the mean of its own two
    meter.close()


def test_without_gpus_or_without_nvidia_smi_nothing_runs(tmp_path) -> None:
    ran = tmp_path / "ran"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho run >> {ran}\necho '0, 50'\n")
    smi.chmod(0o755)
    meter = host_facts.UsageMeter(NO_GPUS, nvidia_smi=str(smi))
    assert [meter.gpu() for _ in range(3)] == [None] * 3
    missing = host_facts.UsageMeter(gpus_of(1), nvidia_smi=str(tmp_path / "absent"))
    assert [missing.gpu() for _ in range(3)] == [None] * 3
    time.sleep(0.2)
    assert not ran.exists()


def test_a_report_carries_its_use_and_reads_it_back() -> None:
    report = NodeReport(memory=8 * 2**30, memory_used=25.0, cpu=12.5, gpu_used=40.0)
    back = NodeReport.from_json(report.to_json())
    assert (back.cpu, back.gpu_used) == (12.5, 40.0)
    assert back.usage() == {"cpu": 12.5, "memory_used_gib": 2.0, "memory_gib": 8.0, "gpu": 40.0}
    old = NodeReport.from_json({"hostname": "h", "cpu": "busy"})  # an older agent, or tampered
    assert (old.cpu, old.gpu_used) == (None, None)
    assert old.usage() == {"cpu": None, "memory_used_gib": None, "memory_gib": None, "gpu": None}


def test_a_report_says_where_its_cores_are_and_keeps_only_a_place_it_can_read() -> None:
    report = NodeReport.here(2)
    assert report.place == place_here() is not None
    assert NodeReport.from_json(report.to_json()).place == report.place
    for bad in ("b00t/3-1", "no place", 7):
        assert NodeReport.from_json({**report.to_json(), "place": bad}).place is None
    # A node with it counts its ranks with the other hosts of its machine.
    (node,) = round_nodes([("node1", report)], "another-host", ["10.0.0.0/8"])
    assert node.place == report.place
