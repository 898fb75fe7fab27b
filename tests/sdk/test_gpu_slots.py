"""``slots="gpus"`` (one slot per GPU, counted when the node's GPUs are known) and the GPUs
of nodes in status and in the widget, with a stand-in ``nvidia-smi`` first on PATH."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.cli.main import main as cli_main
from clusterbook.cluster.options import ClusterOptions
from clusterbook.gpus import GPU, NO_GPUS, GPUInfo
from clusterbook.nodes.tasks.cpus import usable_cores_here
from clusterbook.providers.local import local_nodes
from clusterbook.providers.ssh.hosts import parse_host_list, parse_hosts
from clusterbook.providers.ssh.provider import SSHProvider
from clusterbook.rendezvous.api import RendezvousSettings
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.rendezvous.report import NodeReport
from clusterbook.spec import NodeSpec, parse_host_slots, parse_hostfile, validate_slots
from clusterbook.ssh.preflight import NodeFacts, resolve_slots
from clusterbook.status import nodes_frame
from clusterbook.testing import FakeProvider, fake_nvidia_smi
from clusterbook.views.html import render_nodes
from clusterbook.wording import speaking

A100 = "NVIDIA A100-SXM4-40GB"


def gpus(count: int, model: str = A100) -> GPUInfo:
    return GPUInfo(tuple(GPU(i, model, f"GPU-{i}") for i in range(count)))


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``smi(n)``: a stand-in nvidia-smi listing n GPUs first on PATH; ``smi(None)``: none
    on PATH; ``smi(n, exit_code=9)``: one that fails."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def put(count: int | None, **how: int) -> None:
        path = "/usr/bin:/bin"
        if count is not None:
            where = fake_nvidia_smi(tmp_path / f"smi{len(list(tmp_path.iterdir()))}", count, **how)
            path = f"{where}{os.pathsep}{path}"
        monkeypatch.setenv("PATH", path)

    return put


# -- the value ------------------------------------------------------------------------------


def test_slots_are_a_number_or_gpus() -> None:
    assert validate_slots(4) == 4
    assert validate_slots("gpus") == "gpus"
    for bad, said in [
        ("gpu", "or 'gpus' (one slot per GPU), got 'gpu'"),
        (0, ">= 1"),
        (2.0, "whole number"),
    ]:
        with pytest.raises(cb.ConfigError, match=re.escape(said)):
            validate_slots(bad)


def test_host_entries_and_hostfiles_take_gpus() -> None:
    assert parse_host_slots("node1:gpus") == ("node1", "gpus")
    assert parse_host_slots("node1", default_slots="gpus") == ("node1", "gpus")
    with pytest.raises(cb.ConfigError, match=r"'node1:4' \(or 'node1:gpus', one slot per GPU\)"):
        parse_host_slots("node1:GPUs")
    assert parse_hostfile("node1 slots=gpus\nnode2:gpus\nnode3 slots=2\n") == [
        "node1:gpus",
        "node2:gpus",
        "node3:2",
    ]
    assert parse_host_list(["a:gpus", "b:3", "c"]) == (("a", "gpus"), ("b", 3), ("c", 1))
    # Nodes before their GPUs are counted: one slot until start().
    assert [n.slots for n in parse_hosts(["a:gpus", "b:3"])] == [1, 3]


# -- local: this machine --------------------------------------------------------------------


def test_local_nodes_share_the_machines_gpus_and_take_a_slot_each(smi) -> None:
    smi(4)
    nodes = local_nodes(2, "gpus")
    assert [(n.name, n.slots, n.gpus.ids) for n in nodes] == [
        ("local-0", 2, ("0", "1")),
        ("local-1", 2, ("2", "3")),
    ]
    # A number of slots keeps its number; the GPUs are the nodes' all the same.
    assert [(n.slots, n.gpus.count) for n in local_nodes(2, 3)] == [(3, 2), (3, 2)]


def test_local_status_shows_each_nodes_gpus_before_start(smi, tmp_path) -> None:
    smi(3)
    cluster = cb.Cluster.local(2, slots="gpus", run_dir=tmp_path / "c")
    frame = cluster.status()
    assert frame["slots"].tolist() == [2, 1]
    assert frame["gpus"].tolist() == [2, 1]
    assert frame["gpu_model"].tolist() == [A100, A100]


def test_gpus_on_a_machine_without_any_is_refused_with_the_fix(smi) -> None:
    smi(None)
    with pytest.raises(cb.ConfigError) as info:
        cb.Cluster.local(1, slots="gpus")
    said = str(info.value)
    assert "Node local-0 (this machine) has no GPU (nvidia-smi is not on PATH)" in said
    assert "slots='gpus', one slot per GPU, would give it none" in said
    cores = usable_cores_here()
    assert f"give slots as a number (slots={cores}), or run on a machine with GPUs" in said


def test_a_failing_nvidia_smi_is_named_in_the_refusal(smi) -> None:
    smi(2, exit_code=9)
    with pytest.raises(cb.ConfigError, match="exited with 9: NVIDIA-SMI has failed"):
        cb.Cluster.local(1, slots="gpus")


def test_more_workers_than_gpus_names_the_node_left_without_one(smi) -> None:
    smi(2)
    with pytest.raises(cb.ConfigError) as info:
        cb.Cluster.local(3, slots="gpus")
    said = str(info.value)
    assert "Node local-2 (this machine) has no GPU" in said
    assert "ask for at most 2 workers (workers=2), or give slots as a number" in said


def test_the_command_line_says_the_fix_with_its_own_options(smi, capsys) -> None:
    smi(None)
    assert cli_main(["run", "-n", "1", "--slots", "gpus", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "--slots gpus, one slot per GPU, would give it none" in err
    assert f"(--slots {usable_cores_here()})" in err
    assert "slots=" not in err
    code = cli_main(
        ["worker", "join", "tcp://127.0.0.1:9/x", "--token-file", "/nonexistent", "--slots", "gpus"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "has no GPU (nvidia-smi is not on PATH), so --slots gpus" in err
    assert "pass a number (--slots" in err
    with pytest.raises(SystemExit):
        cli_main(["run", "-n", "1", "--slots", "many", "--", "true"])
    assert "--slots must be a whole number >= 1 or 'gpus'" in capsys.readouterr().err


# -- SSH: counted from the probe at start() ---------------------------------------------------


def facts(count: int, cores: int = 16, problem: str | None = None) -> NodeFacts:
    info = gpus(count) if count else GPUInfo(problem=problem)
    return NodeFacts("n", "/home/me", "python", "3.11.7", cores, "4", "mpi", "0.1", True, gpus=info)


def test_ssh_nodes_slots_are_their_probed_gpus() -> None:
    asked: dict[str, int | str] = {"node1": "gpus", "node2": 3}
    found = {"node1": facts(8), "node2": facts(0)}
    assert resolve_slots(asked, found) == {"node1": 8, "node2": 3}  # type: ignore[arg-type]


def test_ssh_nodes_without_gpus_are_all_named_with_the_fix() -> None:
    asked: dict[str, int | str] = {"node1": "gpus", "node2": "gpus", "node3": "gpus"}
    found = {
        "node1": facts(0, cores=4, problem="nvidia-smi is not on PATH"),
        "node2": facts(2),
        "node3": facts(0, cores=8, problem="nvidia-smi -L exited with 9"),
    }
    with speaking("cli"), pytest.raises(cb.ConfigError) as info:
        resolve_slots(asked, found)  # type: ignore[arg-type]
    said = str(info.value)
    assert "Node node1 has no GPU (nvidia-smi is not on PATH), so 'node1:gpus'" in said
    assert "give its slots as a number ('node1:4'), or list only hosts with GPUs" in said
    assert "Node node3 has no GPU (nvidia-smi -L exited with 9)" in said
    assert "('node3:8')" in said
    assert "node2" not in said


def test_an_ssh_cluster_takes_gpu_slots_without_connecting() -> None:
    provider = SSHProvider(["node1:gpus", "node2:2"], known_hosts=os.devnull)
    assert [(n.host, n.slots) for n in provider.nodes] == [("node1", 1), ("node2", 2)]


# -- status and the widget ------------------------------------------------------------------


def test_status_has_a_gpus_column_and_the_model(tmp_path) -> None:
    nodes = [NodeSpec("g", "localhost", 4, gpus=gpus(4)), NodeSpec("c", "localhost", 2)]
    frame = cb.Cluster(FakeProvider(nodes), ClusterOptions.make("fake", run_dir=tmp_path)).status()
    assert frame["gpus"].tolist() == [4, 0]
    assert frame["gpu_model"].isna().tolist() == [False, True]
    assert frame["gpu_model"][0] == A100
    assert list(frame.columns[:6]) == ["node", "host", "slots", "gpus", "gpu_model", "state"]


def test_agents_reports_give_the_gpus_of_their_nodes() -> None:
    head = RendezvousHead(RendezvousSettings("r", 1, 2))
    head.set_report("n1", NodeReport(hostname="n1", slots=2, gpus=gpus(2, "Tesla T4")))
    head.set_report("n2", NodeReport(hostname="n2", slots=2))
    by_name = {s.name: s for s in head.node_statuses()}
    assert (by_name["n1"].gpus, by_name["n1"].gpu_model) == (2, "Tesla T4")
    assert (by_name["n2"].gpus, by_name["n2"].gpu_model) == (0, None)


def test_the_widget_table_shows_gpus_where_there_are_some(tmp_path) -> None:
    evil = "<b>A100</b>"
    options = ClusterOptions.make("fake", run_dir=tmp_path)
    cpus = FakeProvider([NodeSpec("c", "localhost", 2)])
    assert "GPUs" not in render_nodes(cb.Cluster(cpus, options).snapshot())  # no GPU column
    nodes = [NodeSpec("g", "localhost", 2, gpus=gpus(2, evil)), NodeSpec("c", "h", 1)]
    with_gpus = cb.Cluster(FakeProvider(nodes), options).snapshot()
    html = render_nodes(with_gpus)
    assert "<th" in html
    assert ">GPUs</th>" in html
    assert '<span class="cb-gpus" title="&lt;b&gt;A100&lt;/b&gt;">2</span>' in html
    assert evil not in html
    assert html.count("—") >= 1  # the node without GPUs
    assert nodes_frame(with_gpus)["gpus"].tolist() == [2, 0]


def test_a_node_spec_refuses_gpus_that_are_not_a_record() -> None:
    assert NodeSpec("n", "h", 1).gpus == NO_GPUS
    with pytest.raises(cb.ConfigError, match="must be a GPUInfo, got int"):
        NodeSpec("n", "h", 1, gpus=2)  # type: ignore[arg-type]
