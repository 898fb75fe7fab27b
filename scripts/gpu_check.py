"""What only a machine with real NVIDIA GPUs shows, in one run (the tests fake ``nvidia-smi``).

    python scripts/gpu_check.py [--bench] [--sizes 8,64] [--repeat 5]

Needs clusterbook with Open MPI and mpi4py, and torch with CUDA, in this interpreter. It checks:

1. ``nvidia-smi -L`` as clusterbook parses it (index, model, UUID), against what
   ``nvidia-smi --query-gpu`` and torch say (with each GPU's memory, for the record);
2. ``Cluster.local(slots="gpus")``: one slot per GPU, the ``gpus`` / ``gpu_model`` columns of
   ``status()`` and the GPUs column of the cluster's HTML view (what the widget shows);
3. ``CUDA_VISIBLE_DEVICES`` per local rank: each rank of a job sees its own GPU (torch counts one
   device and names its model), and a job's own ``CUDA_VISIBLE_DEVICES`` stays;
4. a torch DDP training step with the NCCL backend through ``cluster.mpirun`` (``env://`` from
   the variables clusterbook gives every rank), its gradient all-reduced on the GPU;

and with ``--bench``, the rendezvous benchmark's parts 1 and 2 (``benchmarks/rendezvous.py``)
on this machine's cores, torch's c10d side by side. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clusterbook as cb
from clusterbook.gpus import parse_nvidia_smi, probe_gpus
from clusterbook.launch.saved import SavedJob
from clusterbook.views.html import render_nodes

REPO = Path(__file__).resolve().parents[1]

SEE = """\
import os, torch
from mpi4py import MPI
print(MPI.COMM_WORLD.rank, os.environ["LOCAL_RANK"], os.environ.get("CUDA_VISIBLE_DEVICES"),
      torch.cuda.device_count(), torch.cuda.get_device_name(0), flush=True)
"""

DDP = """\
import os, torch
import torch.distributed as dist
dist.init_process_group("nccl")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", 0)  # CUDA_VISIBLE_DEVICES holds this rank's GPU alone
torch.manual_seed(0)
model = torch.nn.Linear(64, 1).to(device)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
x = torch.randn(256, 64, device=device) * (rank + 1)
y = x.sum(dim=1, keepdim=True)
losses = []
for _ in range(3):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
mine = model.weight.grad.clone()
everyone = mine.clone()
dist.all_reduce(everyone)
print(f"rank {rank}/{world} {torch.cuda.get_device_name(device)} backend "
      f"{dist.get_backend()} losses {' '.join(f'{v:.4f}' for v in losses)} "
      f"grad-synced {torch.allclose(everyone / world, mine, atol=1e-5)}", flush=True)
dist.destroy_process_group()
"""

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}", flush=True)
    if not ok:
        failures.append(what)


def lines(job: cb.Job | SavedJob, timeout: float = 180) -> list[list[str]]:
    result = job.wait(timeout)
    if not result.ok:
        print(job.logs().to_string(), flush=True)
    check(result.ok, f"job {' '.join(job.argv)[:60]!r}: {result.summary()}")
    return sorted(line.split() for line in job.logs()["line"])


def parsing() -> int:
    print("1. nvidia-smi parsing", flush=True)
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    print(listed.stdout.rstrip())
    query = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    print(query.stdout.rstrip())
    rows = [[c.strip() for c in line.split(",")] for line in query.stdout.splitlines()]
    gpus = parse_nvidia_smi(listed.stdout)
    check(len(gpus) == len(rows) > 0, f"{len(gpus)} GPU(s) parsed, {len(rows)} queried")
    for gpu, row in zip(gpus, rows, strict=False):
        same = [str(gpu.index), gpu.model, gpu.uuid] == row[:3]
        check(same, f"GPU {gpu.index}: {gpu.model} {gpu.uuid} ({row[3]}) as queried")
    probed = probe_gpus()
    check(probed.devices == gpus and probed.problem is None, f"probe_gpus(): {probed.model}")
    import torch

    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    check(names == [g.model for g in gpus], f"torch names the same models: {names}")
    return len(gpus)


def on_a_cluster(count: int, workdir: Path) -> None:
    print("2-4. a local cluster with slots='gpus'", flush=True)
    with cb.Cluster.local(1, "gpus", python=sys.executable, run_dir=workdir / "c") as cluster:
        status = cluster.status()
        print(status[["node", "slots", "gpus", "gpu_model", "state"]].to_string())
        check(status["slots"].tolist() == [count], f"slots = GPUs = {count}")
        check(status["gpus"].tolist() == [count], "the gpus column")
        model = probe_gpus().model or ""
        check(status["gpu_model"].tolist() == [model], f"the gpu_model column: {model}")
        html = render_nodes(cluster.snapshot())
        check(">GPUs<" in html and f'title="{model}"' in html, "the HTML view's GPUs column")

        rows = lines(cluster.mpirun(["python", "-c", SEE], np=count))
        for r, row in enumerate(rows):
            print("   ", " ".join(row))
            check(row[:4] == [str(r), str(r), str(r), "1"], f"rank {r} sees GPU {r} alone")
        pinned = lines(
            cluster.mpirun(["python", "-c", SEE], np=1, env={"CUDA_VISIBLE_DEVICES": "0"})
        )
        check(pinned[0][2] == "0", "a job's own CUDA_VISIBLE_DEVICES stays")

        started = time.monotonic()
        rows = lines(cluster.mpirun(["python", "-c", DDP], np=count))
        print(f"    DDP step job: {time.monotonic() - started:.1f} s")
        for row in rows:
            print("   ", " ".join(row))
        check(len(rows) == count, f"{count} rank(s) ran a DDP step")
        check(all("nccl" in row and row[-1] == "True" for row in rows), "NCCL, gradients in sync")
        losses = [float(v) for v in rows[0][rows[0].index("losses") + 1 : -2]]
        check(losses[-1] < losses[0], f"the loss falls: {losses}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", action="store_true", help="run the rendezvous benchmark too")
    parser.add_argument("--sizes", default="8,64")
    parser.add_argument("--repeat", default="5")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}, python {sys.version.split()[0]}", flush=True)
    count = parsing()
    with tempfile.TemporaryDirectory(prefix="cb-gpu-") as tmp:
        on_a_cluster(count, Path(tmp))
    code = 0
    if args.bench:
        print("5. benchmarks/rendezvous.py, parts 1 and 2", flush=True)
        bench = [sys.executable, str(REPO / "benchmarks" / "rendezvous.py"), "--parts", "1,2",
                 "--sizes", args.sizes, "--repeat", args.repeat]  # fmt: skip
        code = subprocess.run(bench, check=False).returncode
    print(f"failed checks: {failures}" if failures else "every check passed", flush=True)
    return 1 if failures else code


if __name__ == "__main__":
    sys.exit(main())
