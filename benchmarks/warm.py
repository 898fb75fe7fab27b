"""First output and job end of ``cluster.mpirun`` on a local cluster, on an SSH cluster of fake
hosts (warm and cold launches), and of bare ``mpirun --host`` over the same ssh.

An mpi4py hello on 2 ranks a host (the local cluster: as many workers, 2 slots each), every
side once a round, round after round, medians after a warm-up round. First output: from the
call to the first rank record the head has (``job.stream()``; bare: the first
line on mpirun's stdout); job end: until ``wait()`` returns (bare: mpirun's exit).

- **local**: ``Cluster.local(workers=HOSTS, slots=2)``.
- **ssh warm** / **ssh cold**: an SSH cluster of the testbed's hosts, ``launch="warm"``
  (MPI's daemons started by each node's agent, asked over the ssh connection the cluster
  keeps open to each node: no ssh session, no login shell) and ``launch="cold"`` (a new ssh
  login per node per job).
- **elastic warm**: ``Cluster.elastic`` whose agents run inside the fake hosts with an sshd of
  their own (``--start-sshd``): the head keeps an ssh connection to each, and its agent starts
  MPI's daemons (a Slurm cluster's nodes join the same way).
- **bare**: ``mpirun --host H1:2,H2:2 --prefix VENV`` with the testbed's key and known_hosts, the
  same tuning (``OMPI_MCA_btl=^ofi``), a new ssh login per node per job; **bare, ssh
  ControlMaster**: the same with an OpenSSH master connection per host kept between jobs.

The fake hosts are network namespaces of one machine, sharing its cores. clusterbook sees that
from the nodes' places (the kernel's boot id and each host's CPUs): it binds no cores and, where
the machine has fewer cores than ranks, has Open MPI's ranks yield while they wait
(:mod:`clusterbook.launch.machines`). Bare mpirun is given the same by hand (``--bind-to none``,
``OMPI_MCA_mpi_yield_when_idle=1`` when crowded), as one who knew would: each host's daemon
would bind its ranks to the same first cores, and ranks that poll a shared core keep the rank
they wait for off it (a first message between hosts then took 0.1-0.2 s on 2 cores).

Goal: ssh warm <= 1.3x local, first output and job end (medians).

    python benchmarks/warm.py [--repeat 8] [--hosts 2]     (as root: fake hosts)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

import clusterbook as cb
from clusterbook.launch.command import OPENMPI_TUNING, YIELD

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.testbed: the fake hosts
from tests.testbed import FakeHost, Testbed, agent_argv, make_testbed

HELLO = """\
from mpi4py import MPI

comm = MPI.COMM_WORLD
print(f"hello from rank {comm.Get_rank()} of {comm.Get_size()}", flush=True)
comm.Barrier()
"""
TIMEOUT = 60.0
GOAL = 1.3
#: Bare mpirun's ranks unbound, as clusterbook runs them on hosts of one machine: each host's
#: MPI daemon, binding its ranks to "its" first cores, would put every host's ranks on the
#: same few (on 16 cores, 4 hosts' 8 ranks on 2 of them).
UNBOUND = ["--bind-to", "none"]


def cluster_once(cluster: cb.Cluster, hello: Path, np: int) -> tuple[float, ...]:
    """Seconds to the first line the head has, to the job's end, until the first rank started
    (its wrapper's start marker: the launch, MPI's daemons included) and from the last rank's
    end to the job's (what the launch adds at the end)."""
    start, wall = time.perf_counter(), time.time()
    job = cluster.mpirun(["python", str(hello)], np=np, cwd=hello.parent, oversubscribe=True)
    first = None
    for record in job.stream():  # live: the first rank line as soon as the head has it
        if record.line.startswith("hello"):
            first = time.perf_counter() - start
            break
    result = job.wait(timeout=TIMEOUT)
    end, ended = time.perf_counter() - start, time.time()
    if not result.ok:
        sys.exit(f"clusterbook job failed: {result.summary()}")
    starts = [s for s, _ in result.rank_times.values() if s is not None]
    ends = [e for _, e in result.rank_times.values() if e is not None]
    up = min(starts) - wall if starts else math.nan
    after = ended - max(ends) if ends else math.nan
    return (end if first is None else first), end, up, after


def bare_once(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, ...]:
    """Seconds to mpirun's first line on stdout, and to its exit."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    at = time.perf_counter() - start
    rest = proc.stdout.read()
    code = proc.wait(timeout=TIMEOUT)
    end = time.perf_counter() - start
    if code != 0 or "hello" not in first:
        sys.exit(f"bare mpirun failed ({code}): {first}{rest}")
    return at, end, math.nan, math.nan


def far_agent(host: FakeHost, cluster: cb.Cluster, work: Path) -> subprocess.Popen[bytes]:
    """An agent of ``cluster`` inside fake host ``host``, with an sshd of its own."""
    argv = agent_argv(host, cluster, work, "--slots", "2", "--start-sshd", "2222")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def end_agent(proc: subprocess.Popen[bytes]) -> None:
    """Stop an agent and whatever it started (its sshd, say)."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
    proc.kill()
    proc.wait(timeout=10)


def bare_argv(bed: Testbed, hosts: int, program: list[str], control: Path | None) -> list[str]:
    """``mpirun --host`` of ``program`` on 2 slots of each of ``hosts`` testbed hosts, over the
    testbed's ssh (through master connections in ``control``, where given)."""
    venv = Path(sys.executable).parent.parent
    ssh = [o for o in bed.ssh_options() if o not in ("-F", "none")]
    if control is not None:
        ssh += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control}/%C"]
        ssh += ["-o", "ControlPersist=60"]
    host_list = ",".join(f"{h.addr}:2" for h in bed.hosts[:hosts])
    argv = [str(venv / "bin" / "mpirun"), "--allow-run-as-root", "--host", host_list]
    argv += ["-n", str(2 * hosts), "--prefix", str(venv), *UNBOUND]
    argv += ["--prtemca", "plm_ssh_args", " ".join(ssh)]
    return [*argv, *program]


def table(times: dict[str, list[tuple[float, ...]]], load: list[float]) -> None:
    print(f"\n{len(next(iter(times.values())))} runs each; load average at the rounds' starts:")
    print("  " + " ".join(f"{x:.2f}" for x in load))
    print(
        f"  {'':36} {'first output':>12} {'job end':>9}  {'(ms, medians)':24}"
        f"{'ranks up':>9} {'after ranks':>12}"
    )
    local = [statistics.median(t[i] for t in times["local"]) for i in (0, 1)]
    for label, runs in times.items():
        first, end, up, after = (statistics.median(t[i] for t in runs) * 1000 for i in range(4))
        ratio = f"{first / local[0] / 1000:5.2f}x {end / local[1] / 1000:5.2f}x of local"
        launch = "" if math.isnan(up) else f"{up:9.0f} {after:12.0f}"
        print(f"  {label:36} {first:12.0f} {end:9.0f}  {ratio:24}{launch}")
    print(
        "\n  ranks up: from the call until the first rank's wrapper started (the launch, MPI's\n"
        "  daemons included); after ranks: from the last rank's end until wait() returned. The\n"
        "  rest of a job is the program's: here mpi4py's MPI_Init, a Barrier and MPI_Finalize,\n"
        "  over shared memory on one machine and over TCP between hosts (bare mpirun pays it too)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--hosts", type=int, default=2)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("fake hosts need root", file=sys.stderr)
        return 2
    env = {**OPENMPI_TUNING, **os.environ}
    if 2 * args.hosts > len(os.sched_getaffinity(0)):  # bare: as clusterbook does on its own
        env.setdefault(YIELD, "1")
    print(f"clusterbook {cb.__version__}, {os.cpu_count()} CPUs, {args.hosts} hosts x 2 slots")
    yielding = f" {YIELD}={env[YIELD]}" if YIELD in env else ""
    print(f"bare mpirun is given: {' '.join(UNBOUND)}{yielding}")
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        work = Path(scratch)
        hello = work / "hello.py"
        hello.write_text(HELLO)
        bed = make_testbed(args.hosts, work / "bed")
        stack.callback(bed.close)
        control = work / "cm"
        control.mkdir(mode=0o700)
        stack.callback(
            lambda: [
                subprocess.run(
                    ["ssh", "-o", f"ControlPath={control}/%C", "-O", "exit", h.addr],
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
                for h in bed.hosts
            ]
        )
        local = stack.enter_context(
            cb.Cluster.local(
                workers=args.hosts, slots=2, python=sys.executable, run_dir=work / "local"
            )
        )
        np = 2 * args.hosts
        sides: dict[str, Callable[[], tuple[float, ...]]] = {
            "local": lambda: cluster_once(local, hello, np),
        }
        for how in ("warm", "cold"):
            ssh = stack.enter_context(
                bed.cluster(sys.executable, work / how, hosts=args.hosts, slots=2, launch=how)
            )
            sides[f"ssh {how}"] = lambda c=ssh: cluster_once(c, hello, np)  # type: ignore[misc]
        agents: list[subprocess.Popen[bytes]] = []
        stack.callback(lambda: [end_agent(a) for a in agents])  # after the cluster stopped
        elastic = stack.enter_context(
            cb.Cluster.elastic(
                args.hosts,
                args.hosts,
                listen=bed.head_addr,
                last_call=0.1,
                python=sys.executable,
                run_dir=work / "elastic",
            )
        )
        agents += [far_agent(host, elastic, work) for host in bed.hosts[: args.hosts]]
        elastic.wait_ready(timeout=60, progress=False)
        sides["elastic warm"] = lambda: cluster_once(elastic, hello, np)
        program = [sys.executable, str(hello)]
        plain, mastered = (bare_argv(bed, args.hosts, program, c) for c in (None, control))
        sides["bare mpirun --host"] = lambda: bare_once(plain, env, work)
        sides["bare mpirun --host, ssh ControlMaster"] = lambda: bare_once(mastered, env, work)
        times: dict[str, list[tuple[float, ...]]] = {label: [] for label in sides}
        load = []
        for round_ in range(args.repeat + 1):
            load.append(os.getloadavg()[0])
            for label, side in sides.items():
                result = side()
                if round_:
                    times[label].append(result)
        table(times, load[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
