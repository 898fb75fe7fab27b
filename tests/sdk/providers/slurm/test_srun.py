"""Jobs as steps of a Slurm allocation: srun's command line, its labelled output, and the
provider's start check and node tasks, against a fake srun (the real one: the integration
tests on the Slurm test bed)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.launch.command import LaunchCommand
from clusterbook.launch.flavour import Launcher
from clusterbook.launch.parse import LabelParser
from clusterbook.launch.rankwrap import WRAPPER
from clusterbook.launch.remote import RemoteLaunch, SrunStep
from clusterbook.launch.srun import inherited_slurm, launch_command
from clusterbook.providers.base import StartContext
from clusterbook.providers.slurm.srun import SrunProvider, read_probe
from clusterbook.spec import NodeSpec
from tests.sdk.launch.test_command import MPICH, OMPI, PROGRAM, plan

NODES = (NodeSpec("snode1", "snode1", 2), NodeSpec("snode2", "snode2", 2))
JOB = "c-1"  # the job's tag: the step's name
STEP = RemoteLaunch((), "", "", srun=SrunStep("/usr/bin/srun", "42"))


# -- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize(("launcher", "plugin"), [(OMPI, "pmix"), (MPICH, "pmi2")])
def test_srun_runs_the_plan_as_a_step_with_the_mpis_plugin(launcher: Launcher, plugin: str):
    inherited = {"SLURM_NTASKS_PER_NODE": "2", "SLURM_CONF": "/etc/slurm.conf", "HOME": "/h"}
    cmd = launch_command(
        plan(launcher, nodes=NODES, np=3, remote=STEP, inherited_env=inherited, job_token=JOB)
    )
    assert cmd.argv[:10] == [
        "/usr/bin/srun",
        "--jobid=42",
        "--job-name=c-1",
        f"--mpi={plugin}",
        "--ntasks=3",
        "--distribution=arbitrary",
        "--overlap",
        "--label",
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    assert cmd.argv[10:] == ["/bin/sh", "-c", WRAPPER, "cb-rank", *PROGRAM]
    # Each rank where mpirun would put it: snode1's two slots, then snode2.
    assert cmd.hostfile_text == "snode1\nsnode1\nsnode2\n"
    assert cmd.env["SLURM_HOSTFILE"] == "/tmp/cb/job-1/hostfile"
    assert cmd.env["CLUSTERBOOK_RANK_NODES"] == "0 0 1"
    # What the surrounding job set would be read as options of this step; not its config.
    assert cmd.unset == ("SLURM_NTASKS_PER_NODE",)
    env = cmd.environment(inherited)
    assert "SLURM_NTASKS_PER_NODE" not in env
    assert env["SLURM_CONF"] == "/etc/slurm.conf"


def test_open_mpi_ranks_under_srun_get_mpiruns_settings() -> None:
    ompi = launch_command(plan(OMPI, nodes=NODES, np=4, remote=STEP, as_root=True))
    assert ompi.env["OMPI_MCA_btl"] == "^ofi"
    assert ompi.env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert ompi.env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    mpich = launch_command(plan(MPICH, nodes=NODES, np=4, remote=STEP, as_root=True))
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in mpich.env
    more = launch_command(plan(OMPI, nodes=NODES, np=6, remote=STEP, oversubscribe=True))
    assert "--overcommit" in more.argv
    assert more.hostfile_text == "snode1\nsnode1\nsnode2\nsnode2\nsnode1\nsnode1\n"
    assert "--overcommit" not in ompi.argv


def test_inherited_slurm_keeps_only_where_slurms_config_is() -> None:
    environ = {
        "SLURM_JOB_ID": "7",
        "SLURM_CONF": "/c",
        "SRUN_DEBUG": "3",
        "PMIX_RANK": "0",
        "PMI_FD": "5",
        "PATH": "/bin",
        "MY_SLURM_THING": "x",
    }
    assert inherited_slurm(environ) == ("SLURM_JOB_ID", "SRUN_DEBUG", "PMIX_RANK", "PMI_FD")
    cmd = LaunchCommand(["x"], {"A": "1"}, "", unset=("B",))
    assert cmd.environment({"B": "2", "C": "3"}) == {"C": "3", "A": "1"}


# -- the output ------------------------------------------------------------------------------


def feed(parser: LabelParser, *chunks: bytes) -> list[tuple[int | None, list[str], list[int]]]:
    out = []
    for chunk in chunks:
        out += parser.feed_batches(chunk)
    out += parser.flush_batches()
    return [(b.rank, b.lines.texts, sorted(b.lines.partial)) for b in out]


def test_label_parser_gives_each_rank_its_lines() -> None:
    parser = LabelParser("stdout")
    got = feed(
        parser,
        b" 0: one\n 0: two\n10: ten\nsrun: error: snode2: task 1: Exited with exit code 1\n 1: ",
        b"cut across reads\n 2: no newline at the end",
    )
    assert got == [
        (0, ["one", "two"], []),
        (10, ["ten"], []),
        (None, ["srun: error: snode2: task 1: Exited with exit code 1"], []),
        (1, ["cut across reads"], []),
        (2, ["no newline at the end"], []),
    ]


def test_label_parser_gives_a_read_of_interleaved_ranks_a_batch_a_rank() -> None:
    # Ranks that print line by line alternate: one read is one batch per rank (one write
    # to its file), each rank's lines in order, a line cut across reads whole.
    data = b"".join(b"%d: line %d\n" % (rank, i) for i in range(50) for rank in (0, 1, 0))
    got = feed(LabelParser("stdout"), data[:333], data[333:])
    per_rank: dict[int | None, list[str]] = {}
    for rank, texts, _ in got:
        per_rank.setdefault(rank, []).extend(texts)
    assert len(got) == 4  # two reads, two ranks
    assert per_rank == {
        0: [f"line {i}" for i in range(50) for _ in (0, 1)],
        1: [f"line {i}" for i in range(50)],
    }


def test_label_parser_keeps_the_pieces_of_a_long_line_with_its_rank() -> None:
    parser = LabelParser("stderr", max_line=8)
    # 23 bytes: pieces of at most 8, only the first with the label; "2: " in the middle of
    # the line is not one.
    got = feed(parser, b"3: abcdefgh2: ijklmnop\n0: x\n")
    assert got == [(3, ["abcde", "fgh2: ij", "klmnop"], [0, 1]), (0, ["x"], [])]
    assert parser.feed_batches(b"1: a: b\n")[0].lines.texts == ["a: b"]


# -- the provider ----------------------------------------------------------------------------


class FakeSrun:
    """Answers srun command lines: the start check reports each node, node tasks reply."""

    def __init__(self, size: int | None = None, code: int = 0) -> None:
        self.size = size
        self.code = code
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        if argv[:3] == ["scontrol", "show", "node"]:
            return subprocess.CompletedProcess(
                argv, 0, f"NodeName={argv[-1]} NodeAddr=127.0.0.1\n", ""
            )
        hosts = next(a for a in argv if a.startswith("--nodelist=")).split("=")[1].split(",")
        if any(a.startswith("--mpi=") for a in argv):  # the start check
            out = "".join(
                f"{i}: "
                + json.dumps({"host": h, "cores": 8, "rank": i, "size": self.size or len(hosts)})
                + "\n"
                for i, h in enumerate(hosts)
            )
            return subprocess.CompletedProcess(argv, self.code, out, "")
        task = argv[-2]
        reply = {"port": 31000} if task == "free_port" else {"killed": []}
        return subprocess.CompletedProcess(argv, 0, f"0: {json.dumps(reply)}\n", "")


def context(tmp_path: Path, launcher: Launcher = OMPI) -> StartContext:
    return StartContext("c1", "/venv/bin/python", launcher, {}, run_dir=tmp_path)


def provider(fake: FakeSrun) -> SrunProvider:
    return SrunProvider(["snode1:2", "snode2:2"], job_id=42, srun="sh", runner=fake)


def test_start_checks_mpi_through_the_plugin_and_learns_the_nodes(tmp_path: Path) -> None:
    fake = FakeSrun()
    p = provider(fake)
    p.start(context(tmp_path, MPICH))
    check = fake.calls[0]
    assert check[1:] == [
        "--jobid=42",
        "--nodelist=snode1,snode2",
        "--nodes=2",
        "--ntasks=2",
        "--overlap",
        "--label",
        "--kill-on-bad-exit=1",
        "--mpi=pmi2",
        "/venv/bin/python",
        "-c",
        check[-1],
    ]
    assert "MPI.COMM_WORLD" in check[-1]
    assert [(n.host, n.slots, n.cores) for n in p.nodes] == [("snode1", 2, 8), ("snode2", 2, 8)]
    remote = p.reach.remote()
    assert remote is not None
    assert remote.srun == SrunStep(check[0], "42")
    # Where processes on the nodes reach this machine: on the way to snode1's NodeAddr.
    assert remote.head_addr == "127.0.0.1"
    assert ["scontrol", "show", "node", "-o", "snode1"] in fake.calls
    # A job's clean-up and port go to each node as a one-task step there.
    p.reach.stop_job("c1-abc")
    kills = [c for c in fake.calls[1:] if c[-2] == "kill"]
    assert sorted(c[2] for c in kills) == ["--nodelist=snode1", "--nodelist=snode2"]
    assert all(json.loads(c[-1]) == {"token": "c1-abc"} for c in kills)
    assert p.reach.free_port(p.nodes[1]) == 31000
    p.stop()
    assert p.reach.remote() is None


def test_a_world_of_one_on_every_node_is_a_plugin_that_does_not_fit(tmp_path: Path) -> None:
    with pytest.raises(cb.ConfigError, match=r"srun --mpi=pmix started every rank alone \(a wo"):
        provider(FakeSrun(size=1)).start(context(tmp_path))


def test_a_start_check_that_fails_names_the_nodes(tmp_path: Path) -> None:
    with pytest.raises(cb.BootstrapError, match="exit code 1"):
        provider(FakeSrun(code=1)).start(context(tmp_path))


def test_bad_allocations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(cb.ConfigError, match=r"The Slurm job id None is not a job's number"):
        SrunProvider(["snode1:2"])
    with pytest.raises(cb.ConfigError, match="has slots 'gpus'; give a number"):
        SrunProvider(["snode1:gpus"], job_id=1)
    missing = SrunProvider(["snode1:2"], job_id=1, srun="/nowhere/srun", runner=FakeSrun())
    with pytest.raises(cb.ConfigError, match="Slurm's '/nowhere/srun' is not on PATH here"):
        missing.start(context(tmp_path))


def test_read_probe_takes_each_nodes_report() -> None:
    # By the node each task names; a task that names none ran on the node of its number.
    out = (
        '0: {"node": "n2", "size": 2}\nnoise\n1: not json\n 1: {"node": "n1", "size": 2}\n'
        '2: {"host": "c", "size": 3}\n3: {"node": "elsewhere"}\n'
    )
    assert read_probe(out, ["n1", "n2", "n3"]) == {
        "n1": {"node": "n1", "size": 2},
        "n2": {"node": "n2", "size": 2},
        "n3": {"host": "c", "size": 3},
    }
    assert read_probe("5: {}\n", ["n1"]) == {}
    assert replace(STEP, srun=None).srun is None
