"""Jobs relaunched when a node is lost (``restarts=``), on fake hosts with real sshd and real
Open MPI / MPICH: the agent of one of three nodes is SIGKILLed mid-job, the job starts again on
the two nodes left with the new world size, and resumes from the checkpoint it wrote."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from importlib.util import find_spec
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from tests.conftest import ranks_started, require
from tests.testbed import FakeHost, is_agent
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

# Attempt 1 writes a checkpoint and waits to be cut short; a restart resumes from it.
RESUMES = """\
import os, socket, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
restart, checkpoint = os.environ["CLUSTERBOOK_RESTART"], sys.argv[1]
print(f"rank {comm.rank} of {comm.size} restart {restart} "
      f"torch {os.environ['TORCHELASTIC_RESTART_COUNT']} on {socket.gethostname()}", flush=True)
if restart == "0":
    if comm.rank == 0:
        with open(checkpoint, "w") as f:
            f.write("7")
    comm.Barrier()
    print("started", flush=True)
    time.sleep(600)  # until a node is lost
step = int(open(checkpoint).read())
print(f"resumed at step {step} with {comm.allreduce(1)} ranks", flush=True)
"""


def kill_agent(host: FakeHost) -> None:
    """SIGKILL the clusterbook agent running on ``host`` (its node is then lost)."""
    killed = 0
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            if is_agent(psutil.Process(pid)):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    assert killed, f"no agent found on {host.name}"


def test_a_job_is_relaunched_on_the_nodes_left_when_one_is_lost(
    testbed, mpi_python, tmp_path: Path
):
    script = tmp_path / "resumes.py"
    script.write_text(RESUMES)
    checkpoint = tmp_path / "checkpoint"
    node3 = testbed.hosts[2]
    with testbed.cluster(mpi_python, tmp_path / "run", hosts=3) as cluster:
        job = cluster.mpirun(["python", str(script), str(checkpoint)], restarts=1, timeout=300)
        ranks_started(job, 3)
        kill_agent(node3)
        result = job.wait(timeout=120)
        assert result.ok, result.summary()
        assert result.restarts == 1
        assert [(a.outcome, a.reason) for a in result.attempts] == [
            ("node-lost", f"node {node3.addr} lost"),
            ("ok", "succeeded"),
        ]
        assert job.np == 2  # the new world size
        logs = job.logs()
        second = sorted(logs[(logs.attempt == 2) & (logs["rank"] >= 0)].line)
        hosts = {h.name for h in testbed.hosts[:2]}
        assert [re.sub(r" on \S+$", "", line) for line in second] == [
            "rank 0 of 2 restart 1 torch 1",
            "rank 1 of 2 restart 1 torch 1",
            "resumed at step 7 with 2 ranks",
            "resumed at step 7 with 2 ranks",
        ]
        assert {line.rsplit(" ", 1)[1] for line in second if " on " in line} == hosts
        first = logs[(logs.attempt == 1) & logs.line.str.startswith("rank ")].line
        assert all(" of 3 restart 0 torch 0 " in line for line in first)
        status = cluster.snapshot().jobs[0]
        assert (status.attempt, status.restarts) == (2, 1)
        assert status.last_reason == f"node {node3.addr} lost"


def test_a_job_whose_node_dies_whole_is_relaunched_not_called_a_success(
    testbed, openmpi_python, tmp_path: Path
):
    # The node's agent, its MPI daemon and its ranks die together: Open MPI's mpirun may then
    # exit 0 with no rank having reported; the job waits for the head to learn of the loss.
    script = tmp_path / "resumes.py"
    script.write_text(RESUMES)
    node3 = testbed.hosts[2]
    with testbed.cluster(openmpi_python, tmp_path / "run", hosts=3) as cluster:
        job = cluster.mpirun(["python", str(script), str(tmp_path / "ckpt")], restarts=1)
        ranks_started(job, 3)
        node3.die()
        result = job.wait(timeout=120)
        assert result.ok, result.summary()
        assert [(a.outcome, a.reason) for a in result.attempts] == [
            ("node-lost", f"node {node3.addr} lost"),
            ("ok", "succeeded"),
        ]
        assert job.np == 2


def test_without_restarts_a_lost_node_fails_the_job(testbed, openmpi_python, tmp_path: Path):
    script = tmp_path / "resumes.py"
    script.write_text(RESUMES)
    with testbed.cluster(openmpi_python, tmp_path / "run", hosts=3) as cluster:
        job = cluster.mpirun(["python", str(script), str(tmp_path / "ckpt")], timeout=300)
        ranks_started(job, 3)
        kill_agent(testbed.hosts[2])
        result = job.wait(timeout=120)
        assert not result.ok
        assert isinstance(job.error, cb.NodeLostError)
        assert [a.outcome for a in result.attempts] == ["node-lost"]


DDP_RESUMES = """\
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restarts, checkpoint = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), os.environ["CKPT"]
model = torch.nn.Linear(1, 1, bias=False)
step = 0
if os.path.exists(checkpoint):
    state = torch.load(checkpoint)
    model.load_state_dict(state["model"])
    step = state["step"]
else:
    with torch.no_grad():
        model.weight.fill_(1.0)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
opt.zero_grad()
ddp(torch.tensor([[float(rank + 1)]])).sum().backward()  # gradients averaged over the world
opt.step()
step += 1
if rank == 0:
    torch.save({"model": model.state_dict(), "step": step}, checkpoint)
dist.barrier()
print(f"rank {rank}/{world} restart {restarts} step {step} weight {model.weight.item():.4f}",
      flush=True)
if restarts == 0:
    print("started", flush=True)
    time.sleep(600)  # until a node is lost
dist.destroy_process_group()
# torch 2.13's gloo aborts about one exit in 20 ("terminate called without an active
# exception": a thread still joinable as the interpreter ends); leave without that teardown.
sys.stdout.flush()
os._exit(0)
"""


def test_torch_ddp_resumes_from_its_checkpoint_after_a_restart(
    testbed, openmpi_python, tmp_path: Path
):
    require(find_spec("torch") is not None, "torch is not installed (scripts/test.sh installs it)")
    script = tmp_path / "ddp.py"
    script.write_text(DDP_RESUMES)
    env = {"GLOO_SOCKET_IFNAME": "eth0", "CKPT": str(tmp_path / "ckpt.pt")}
    with testbed.cluster(openmpi_python, tmp_path / "run", hosts=3) as cluster:
        job = cluster.mpirun(["python", str(script)], env=env, restarts=1, timeout=300)
        ranks_started(job, 3)  # after the checkpoint was written
        kill_agent(testbed.hosts[2])
        result = job.wait(timeout=180)
        lines = sorted(line for line in job.logs().line if line.startswith("rank "))
        assert result.ok, (result.summary(), lines)
    # Step 1 on three ranks: gradient (1 + 2 + 3) / 3 = 2, weight 1 - 0.1 * 2 = 0.8. The
    # restart loads it, and step 2 on two ranks: gradient (1 + 2) / 2 = 1.5, weight
    # 0.8 - 0.15 = 0.65.
    assert lines == sorted(
        [
            *(f"rank {r}/3 restart 0 step 1 weight 0.8000" for r in range(3)),
            *(f"rank {r}/2 restart 1 step 2 weight 0.6500" for r in range(2)),
        ]
    )
