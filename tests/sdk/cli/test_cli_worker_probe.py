"""``clusterbook worker join --probe-mpi FLAVOUR:PREFIX``: the agent checks its node for the
head's MPI launcher itself and reports what it found, so that the head checks a node that
joins without logging in (Slurm clusters' batch scripts ask for it)."""

from __future__ import annotations

import json
import sys

import pytest

from clusterbook.cli.main import main
from clusterbook.cli.worker import _probe_meanwhile
from clusterbook.nodes.tasks.probe import probe
from clusterbook.rendezvous.agent import agent_argv
from clusterbook.rendezvous.report import NodeReport


@pytest.mark.parametrize("value", ["openmpi", "openmpi:relative/path", "lam:/opt/venv", ":/x"])
def test_a_probe_that_names_no_launcher_is_refused_saying_the_form(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["worker", "join", "tcp://127.0.0.1:9/x", "--token-file", "/nonexistent"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--probe-mpi", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{value!r} is not FLAVOUR:PREFIX" in err
    assert "like openmpi:/opt/venv" in err


def test_the_agents_command_line_carries_the_launcher_to_probe_for() -> None:
    argv = agent_argv("/v/bin/python", "tcp://h:1/c", "/t", probe_mpi=("mpich", "/opt/mpich"))
    assert argv[-2:] == ["--probe-mpi", "mpich:/opt/mpich"]
    assert "--probe-mpi" not in agent_argv("/v/bin/python", "tcp://h:1/c", "/t")


def test_the_agents_own_probe_is_the_heads_for_the_same_launcher_and_rides_its_report() -> None:
    probed = _probe_meanwhile(("openmpi", sys.prefix))()
    assert probed is not None
    sent = json.loads(probed)
    assert (sent["flavour"], sent["prefix"]) == ("openmpi", sys.prefix)
    heads = probe({"prefix": sys.prefix, "flavour": "openmpi"})
    assert sent["facts"] == {k: v for k, v in heads.items() if k != "gpus"}  # the report has them
    report = NodeReport.from_json(NodeReport.here(2, probe=probed).with_load().to_json())
    assert report.probe == probed  # with every report: the head reads the last one
    assert NodeReport.from_json({"hostname": "n"}).probe is None  # an agent not asked
    assert _probe_meanwhile(None)() is None
