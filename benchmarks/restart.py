"""How soon a job runs again after one of its three nodes dies: clusterbook against torchrun.

Three fake hosts, one process per host, one run of each side after the other, ``--repeat``
times. The figure is the seconds from the SIGKILL that takes node3 down to the wall-clock
timestamp (``time.time()``; every process is on this machine, one clock) that the first rank
of the relaunched job prints as its first statement:

- **clusterbook**: an SSH cluster of node1..node3 (1 slot each; launching warm, and, for
  information, cold: ``launch="cold"``) runs
  ``cluster.mpirun(["python", PROG], restarts=1)``; PROG prints its start time and
  ``CLUSTERBOOK_RESTART``, then sleeps. Killed on node3: every process in its network
  namespace but the sshd daemon (the clusterbook agent, its ``prted``, the rank, and the ssh
  sessions they run in); with ``--kill agent``, only the agent (the process with "worker" in
  its command line, as tests/integration/test_restarts.py does), torchrun's side unchanged.
  Figure: first start of a rank with ``CLUSTERBOOK_RESTART=1``.
- **torchrun**: ``python -m torch.distributed.run --nnodes=2:3 --nproc-per-node=1
  --rdzv-backend=c10d --rdzv-endpoint=NODE1:PORT --rdzv-id=ID --max-restarts=1`` started in
  each host's network namespace, every other setting at torch's defaults (keep-alive 5 s x 3,
  last call 30 s, monitor interval 0.1 s). ``--local-addr`` (the host's address) and
  ``--rdzv-conf is_host=`` (true on node1) only say who a host is: all hosts share this
  machine's hostname. The worker prints its start time and ``TORCHELASTIC_RESTART_COUNT``,
  joins a gloo process group and all-reduces every 0.1 s (a worker that never talks to its
  peers would never notice the loss, and torchrun would never restart it). Killed on node3:
  every process in its network namespace but the sshd daemon (the torchrun agent and its
  worker). Figure: first start of a worker after the kill.
- **torchrun tuned**: the same, with ``--rdzv-conf last_call_timeout=1,keep_alive_interval=1,
  keep_alive_max_attempt=3`` (clusterbook's heartbeat and last call).
- **torchrun + clusterbook backend**: the same torchrun, tuned alike, with
  ``--rdzv-backend=clusterbook --rdzv-endpoint=JOIN_URL`` of an elastic cluster (2 to 3 nodes)
  whose head is this process. Its agents notice the loss by the rendezvous (the lost agent's
  connection) and restart their workers as for a change of members, so the restart count
  stays 0: the figure is the first start of a worker after the kill, as for the others.

Goals: clusterbook <= 2 s, and <= 1/10 of torchrun's time (medians); clusterbook (warm) <=
0.4 s and >= 10x faster than torchrun tuned; torchrun + clusterbook backend >= 3x faster than
torchrun tuned. Breakdown of
clusterbook's time (from the job's attempts): until attempt 1 ended (the loss noticed), until
attempt 2's launcher started, until its first rank ran.

    python benchmarks/restart.py [--repeat 3] [--kill node|agent] [--sides NAME,...]   (as root)

Exit status 0 whether the goal is met or not, 1 when a run failed or timed out, 2 when not
run as root.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

import clusterbook as cb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.testbed: the fake hosts
from tests.testbed import FakeHost, Testbed, make_testbed

CB_PROG = """\
import os, socket, time
print(f"START {time.time():.6f} restart {os.environ['CLUSTERBOOK_RESTART']} "
      f"on {socket.gethostname()}", flush=True)
time.sleep(600)
"""
TORCH_PROG = """\
import os, time
print(f"START {time.time():.6f} restart {os.environ['TORCHELASTIC_RESTART_COUNT']} "
      f"on {os.environ['NODE']}", flush=True)
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
data = torch.zeros(1)
dist.all_reduce(data)
print("READY", flush=True)
while True:
    dist.all_reduce(data)
    time.sleep(0.1)
"""
START_RE = re.compile(r"START (\S+) restart (\d+) on (\S+)")
STARTED_TIMEOUT = 120.0  # the first run on all three hosts
RESTART_TIMEOUT = {"clusterbook": 60.0, "torchrun": 150.0}
GOAL_SECONDS, GOAL_RATIO = 2.0, 10.0
#: The warm relaunch's goal: this many seconds at most, this many times faster than torchrun
#: tuned to clusterbook's heartbeat and last call.
WARM_SECONDS, WARM_RATIO = 0.4, 10.0
BACKEND_RATIO = 3.0  # torchrun + clusterbook backend against torchrun tuned
TUNED = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
SIDES = (
    "clusterbook",
    "clusterbook cold (info)",
    "torchrun",
    "torchrun tuned",
    "torchrun + clusterbook backend",
)


class SideTimeout(TimeoutError):
    """A bounded wait of one side ran out; the message names the side and what it waited for."""


def starts(lines: Iterable[str], restart: int) -> list[tuple[float, str]]:
    """(timestamp, host) of each START line of restart number ``restart``."""
    found = []
    for line in lines:
        match = START_RE.search(line)
        if match and int(match[2]) == restart:
            found.append((float(match[1]), match[3]))
    return sorted(found)


def after(lines: Iterable[str], killed: float) -> list[tuple[float, str]]:
    """(timestamp, host) of each START line after the kill, whatever its restart count."""
    return [(t, host) for t, host in starts(lines, 0) + starts(lines, 1) if t > killed]


def kill_node(host: FakeHost) -> float:
    """Kill ``host`` as the node dying would (every process but its sshd daemon, see
    :meth:`FakeHost.die`); returns the wall-clock time it began."""
    at = time.time()
    host.die()
    return at


def kill_agent(host: FakeHost) -> float:
    """SIGKILL the clusterbook agent on ``host`` (as tests/integration/test_restarts.py does);
    returns the wall-clock time of the SIGKILL."""
    agents = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            if "worker" in psutil.Process(pid).cmdline():
                agents.append(pid)
    if not agents:
        raise RuntimeError(f"no clusterbook agent found on {host.name}")
    at = time.time()
    for pid in agents:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return at


def clusterbook_once(
    bed: Testbed, work: Path, run: int, kill: str, launch: str = "warm"
) -> dict[str, float]:
    node3 = bed.hosts[2]
    prog = work / "cb_prog.py"
    run_dir = work / f"cb-{launch}-run-{run}"
    with bed.cluster(sys.executable, run_dir, hosts=3, launch=launch) as cluster:
        job = cluster.mpirun(["python", str(prog)], restarts=1, timeout=300)
        try:
            deadline = time.monotonic() + STARTED_TIMEOUT
            while len(starts(job.logs().line, 0)) < 3:
                if job.done():
                    raise RuntimeError(f"the job ended early: {job.wait().summary()}")
                if time.monotonic() > deadline:
                    raise SideTimeout(f"timed out: 3 ranks not started in {STARTED_TIMEOUT:g} s")
                time.sleep(0.05)
            killed = kill_node(node3) if kill == "node" else kill_agent(node3)
            deadline = time.monotonic() + RESTART_TIMEOUT["clusterbook"]
            while not (again := starts(job.logs().line, 1)):
                if job.done():
                    ended = job.wait()
                    how = ", ".join(f"attempt {a.number} {a.outcome}" for a in ended.attempts)
                    raise RuntimeError(
                        f"no relaunch: the job ended ({how}, launcher exit {ended.returncode}, "
                        f"rank exit codes {ended.rank_exit_codes}); see {job.directory}"
                    )
                if time.monotonic() > deadline:
                    raise SideTimeout(
                        f"timed out: no rank of the relaunch ran within "
                        f"{RESTART_TIMEOUT['clusterbook']:g} s of the kill"
                    )
                time.sleep(0.05)
        finally:
            job.cancel()
            result = job.wait()
    first, second = result.attempts[0], result.attempts[1]
    if first.outcome != "node-lost":
        raise RuntimeError(f"attempt 1 ended {first.outcome}: {first.reason}")
    return {
        "figure": again[0][0] - killed,
        "attempt 1 ended": first.started + first.duration - killed,
        "attempt 2 launched": second.started - killed,
    }


def torchrun_once(
    bed: Testbed, work: Path, run: int, *, tuned: bool = False, clusterbook: bool = False
) -> dict[str, float]:
    if not clusterbook:
        return _torchrun_once(bed, work, run, tuned=tuned, endpoint=None)
    cluster = cb.Cluster.elastic(2, 3, listen=bed.head_addr, run_dir=work / f"tr-cb-{run}")
    try:
        cluster.start()
        assert cluster.join_command is not None
        url = shlex.split(cluster.join_command)[3]  # clusterbook worker join URL --token-file F
        return _torchrun_once(bed, work, run, tuned=True, endpoint=url)
    finally:
        cluster.stop()


def _torchrun_once(
    bed: Testbed, work: Path, run: int, *, tuned: bool, endpoint: str | None
) -> dict[str, float]:
    node1, node3 = bed.hosts[0], bed.hosts[2]
    prog = work / "torch_prog.py"
    port = 29400 + run
    side = "clusterbook" if endpoint else "tuned" if tuned else "c10d"
    procs: list[subprocess.Popen[bytes]] = []
    outs = {h.name: work / f"torchrun-{side}-{run}-{h.name}.log" for h in bed.hosts}
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}

    def lines(hosts: list[FakeHost]) -> list[str]:
        return [line for h in hosts for line in outs[h.name].read_text().splitlines()]

    def dead_agents() -> list[str]:
        return [
            f"{h.name} (exit {p.returncode})"
            for h, p in zip(bed.hosts, procs, strict=False)  # procs: those started so far
            if p.poll() is not None
        ]

    try:
        for host in bed.hosts:
            if endpoint is None:
                conf = f"is_host={str(host is node1).lower()}" + (f",{TUNED}" if tuned else "")
                rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint={node1.addr}:{port}"]
            else:
                conf = TUNED
                rdzv = ["--rdzv-backend=clusterbook", f"--rdzv-endpoint={endpoint}"]
            argv = [
                "ip", "netns", "exec", host.netns,
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes=2:3", "--nproc-per-node=1", *rdzv,
                f"--rdzv-id=restart-bench-{run}", "--max-restarts=1",
                f"--local-addr={host.addr}", f"--rdzv-conf={conf}",
                str(prog),
            ]  # fmt: skip
            with outs[host.name].open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        argv,
                        env={**env, "NODE": host.name},
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + STARTED_TIMEOUT
        while sum(line == "READY" for line in lines(bed.hosts)) < 3:
            if dead := dead_agents():
                raise RuntimeError(f"agents exited early: {dead}; see {work}")
            if time.monotonic() > deadline:
                raise SideTimeout(
                    f"timed out: 3 workers not ready in {STARTED_TIMEOUT:g} s; see {work}"
                )
            time.sleep(0.05)
        killed = kill_node(node3)
        deadline = time.monotonic() + RESTART_TIMEOUT["torchrun"]
        while not (again := after(lines(bed.hosts[:2]), killed)):
            if dead := [d for d in dead_agents() if not d.startswith(node3.name)]:
                raise RuntimeError(f"agents exited: {dead}; see {work}")
            if time.monotonic() > deadline:
                raise SideTimeout(
                    f"timed out: no worker of the restart ran within "
                    f"{RESTART_TIMEOUT['torchrun']:g} s of the kill; see {work}"
                )
            time.sleep(0.05)
        return {"figure": again[0][0] - killed}
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for host in bed.hosts:  # workers that left the agents' process groups, if any
            for pid in host.processes():
                if pid != host.sshd.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--kill",
        choices=("node", "agent"),
        default="node",
        help="what dies on clusterbook's side: the whole node (default), or only its agent "
        "as tests/integration/test_restarts.py does; torchrun's side always loses the node",
    )
    parser.add_argument(
        "--sides",
        default=",".join(SIDES),
        help=f"which sides to run, comma-separated (default: all of {', '.join(SIDES)})",
    )
    args = parser.parse_args()
    chosen = [side.strip() for side in args.sides.split(",") if side.strip()]
    if unknown := [side for side in chosen if side not in SIDES]:
        parser.error(f"unknown sides {unknown}; the sides are {', '.join(SIDES)}")
    if os.geteuid() != 0:
        print("fake hosts need root", file=sys.stderr)
        return 2
    import torch

    work = Path(tempfile.mkdtemp(prefix="cb-restart-"))
    (work / "cb_prog.py").write_text(CB_PROG)
    (work / "torch_prog.py").write_text(TORCH_PROG)
    every: dict[str, Callable[[Testbed, Path, int], dict[str, float]]] = {
        "clusterbook": functools.partial(clusterbook_once, kill=args.kill),
        "clusterbook cold (info)": functools.partial(
            clusterbook_once, kill=args.kill, launch="cold"
        ),
        "torchrun": torchrun_once,
        "torchrun tuned": functools.partial(torchrun_once, tuned=True),
        "torchrun + clusterbook backend": functools.partial(torchrun_once, clusterbook=True),
    }
    sides = {side: every[side] for side in chosen}
    killed = "node3 (all but sshd)" if args.kill == "node" else "node3's agent"
    print(
        f"clusterbook {cb.__version__} vs torch {torch.__version__}, 3 fake hosts; "
        f"seconds from the SIGKILL to the first rank of the relaunch running "
        f"(clusterbook: {killed} killed; torchrun: node3 (all but sshd) killed)",
        flush=True,
    )
    figures, failures = measure(sides, work, args.repeat)
    report(figures, args.repeat)
    return 1 if failures else 0


def measure(
    sides: dict[str, Callable[[Testbed, Path, int], dict[str, float]]], work: Path, repeat: int
) -> tuple[dict[str, list[float]], int]:
    """Each side ``repeat`` times, one after the other; the figures by side, and how many
    runs failed."""
    figures: dict[str, list[float]] = {side: [] for side in sides}
    failures = 0
    bed = make_testbed(3, work / "bed")
    try:
        for run in range(1, repeat + 1):
            said = []
            for side, once in sides.items():
                try:
                    got = once(bed, work, run)
                except (SideTimeout, RuntimeError, cb.ClusterError) as exc:
                    failures += 1
                    said.append(f"{side} FAILED ({exc})")
                    continue
                figures[side].append(got["figure"])
                extra = ", ".join(f"{k} {v:.2f}" for k, v in got.items() if k != "figure")
                said.append(f"{side} {got['figure']:6.2f}" + (f" ({extra})" if extra else ""))
            print(f"  run {run}: " + "  ".join(said), flush=True)
    finally:
        bed.close()
    return figures, failures


def report(figures: dict[str, list[float]], repeat: int) -> None:
    """The medians, and whether the goals are met."""
    medians = {k: statistics.median(v) for k, v in figures.items() if v}
    print(
        "  median: "
        + "  ".join(
            f"{k} {medians[k]:6.2f} ({len(figures[k])} runs)" if k in medians else f"{k} -"
            for k in figures
        )
    )
    goal = f"clusterbook <= {GOAL_SECONDS:g} s and <= 1/{GOAL_RATIO:g} of torchrun's time"
    if "clusterbook" in figures:
        missed = repeat - len(figures["clusterbook"])
        if missed:
            print(f"goal: {goal}: NOT MET (no relaunch measured in {missed} of {repeat} runs)")
        elif "torchrun" not in medians:
            print(f"goal: {goal}: not judged (torchrun not measured)")
        else:
            ours, theirs = medians["clusterbook"], medians["torchrun"]
            met = ours <= GOAL_SECONDS and ours * GOAL_RATIO <= theirs
            print(
                f"goal: {goal}: {'MET' if met else 'NOT MET'} (torchrun/clusterbook "
                f"{theirs / ours:.1f}x)"
            )
    backend, tuned = "torchrun + clusterbook backend", "torchrun tuned"
    if "clusterbook" in medians and tuned in medians:
        ours, theirs = medians["clusterbook"], medians[tuned]
        met = ours <= WARM_SECONDS and ours * WARM_RATIO <= theirs
        print(
            f"goal: clusterbook <= {WARM_SECONDS:g} s and >= {WARM_RATIO:g}x faster than {tuned}: "
            f"{'MET' if met else 'NOT MET'} ({theirs / ours:.1f}x)"
        )
    if backend in medians and tuned in medians:
        ratio = medians[tuned] / medians[backend]
        met = ratio >= BACKEND_RATIO and len(figures[backend]) == repeat
        print(
            f"goal: {backend} >= {BACKEND_RATIO:g}x faster than {tuned}: "
            f"{'MET' if met else 'NOT MET'} ({ratio:.1f}x)"
        )


if __name__ == "__main__":
    sys.exit(main())
