"""Bootstrap time of ``Cluster.ssh(...).start()`` on fake hosts, by number of hosts.

For each size N a testbed of N fake hosts (network namespaces with a real sshd each; its set-up
is timed apart and not counted) is made; then a 1-slot-per-host cluster is started and stopped
``--repeat`` times, recording the provider's phase timings and the ssh handshakes made. For
comparison, one plain OpenSSH round per host (``ssh ... root@host true``, all hosts at once) is
timed too: the floor of any bootstrap that logs in to every host.

Goals, at the largest size: the median bootstrap within 1.2 x the plain OpenSSH round to the
same hosts in the same run, this process's CPU (the head's share) <= 10 ms per host, and one
handshake per host. The ratio of the largest size to the smallest is printed too.

The fake hosts are processes of this machine: whatever a node does at bootstrap (its sshd, the
login shell and its start-up files, a Python that imports mpi4py, the node's agent) runs on the
head's cores. CPU per host is printed both for the whole machine and for this process (the
part that stays on the head when the nodes are real machines), and the plain OpenSSH round
gives the same ratio for a bare login, the floor of any bootstrap on this machine.
The head's CPU is split by thread (paramiko's transports, the rendezvous store, the
fan-out's workers, ...), and the CPU of the plain round's ssh clients is printed beside it.
``--skel-bashrc`` gives the fake hosts' login user Debian's default ``~/.bashrc`` (it returns at
once when the shell is not interactive) instead of this machine's, to show what the login
user's shell start-up costs.

    python benchmarks/ssh_bootstrap.py [--repeat 5] [--sizes 1,4,8] [--skel-bashrc]   (as root)

The exit status is 1 when a goal is missed, 2 when not run as root.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import clusterbook as cb
from clusterbook.ssh.paramiko_transport import handshake_count

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.testbed: the fake hosts
from tests.testbed import Testbed, make_testbed

GOAL_RATIO = 1.2  # start() / plain ssh fan-out, largest size
GOAL_HEAD_CPU = 0.010  # seconds of this process's CPU per host during start(), largest size
# connect: until the last host's handshake (each host's probe starts as soon as it is
# connected); probe: until every probe answered; install: the store's start and the cluster's
# files made; agents: each node's files and agent's start (one round trip), the status file,
# until all joined, and what start() does around the provider (launcher, directories)
PHASES = ("connect", "probe", "install", "agents")


@dataclass
class Runs:
    """Measurements of one size, in seconds (handshakes as counted per run)."""

    hosts: int
    setup: float = 0.0
    start: list[float] = field(default_factory=list)
    stop: list[float] = field(default_factory=list)
    openssh: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    handshakes: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # machine CPU busy during start()
    steal: list[float] = field(default_factory=list)  # ... and taken by the hypervisor
    head_cpu: list[float] = field(default_factory=list)  # this process's CPU during start()
    threads: Counter[str] = field(default_factory=Counter)  # head CPU by thread, summed
    openssh_cpu: list[float] = field(default_factory=list)  # the ssh clients' CPU, per round


def busy_cpu() -> tuple[float, float]:
    """CPU seconds the whole machine (head and fake hosts alike) has spent busy since boot,
    and those the hypervisor gave to other machines (steal: the cores were not ours then)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is in user already)
    steal = ticks[7] if len(ticks) > 7 else 0
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks[:7]) - ticks[3] - ticks[4]) / hz, steal / hz


def thread_cpu() -> dict[int, tuple[str, float]]:
    """This process's live threads: by native id, their kind and CPU seconds so far (from the
    scheduler's nanosecond count; empty where the kernel keeps none)."""
    kinds = {}
    for thread in threading.enumerate():
        if thread.native_id is None:
            continue
        if type(thread).__name__ == "Transport":
            kinds[thread.native_id] = "paramiko transports (one per host)"
        elif thread is threading.main_thread():
            kinds[thread.native_id] = "main thread (start() itself)"
        elif thread.name.startswith("clusterbook-store"):
            kinds[thread.native_id] = "rendezvous store (TLS, joins)"
        elif thread.name.startswith("clusterbook-rendezvous"):
            kinds[thread.native_id] = "rendezvous head (follows the state)"
        elif thread.name.startswith("clusterbook-fanout"):
            kinds[thread.native_id] = "the per-host fan-out's threads"
        else:
            kinds[thread.native_id] = "other threads"
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"):
        return {}
    found = {}
    for tid, kind in kinds.items():
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                found[tid] = (kind, int(f.read().split()[0]) / 1e9)
        except (OSError, ValueError, IndexError):
            continue  # it has just ended: counted with the threads that ended
    return found


def by_kind(before: dict[int, tuple[str, float]], total: float) -> Counter[str]:
    """CPU seconds since ``before`` by kind of thread; what threads that have ended used is
    the process's ``total`` less the rest."""
    after = thread_cpu()
    if not before or not after:
        return Counter()
    spent: Counter[str] = Counter()
    for tid, (kind, cpu) in after.items():
        spent[kind] += cpu - before.get(tid, (kind, 0.0))[1]
    spent["threads that ended"] = max(0.0, total - sum(spent.values()))
    return spent


def run_cluster(bed: Testbed, known_hosts: Path, run_dir: Path, runs: Runs | None) -> None:
    """Start and stop one cluster on every host of ``bed``; record into ``runs`` if given."""
    cluster = bed.cluster(sys.executable, run_dir, known_hosts=known_hosts)
    threads0 = thread_cpu()
    before, cpu0, head0 = handshake_count(), busy_cpu(), time.process_time()
    t0 = time.perf_counter()
    try:
        cluster.start()
        started = time.perf_counter() - t0
        busy, stolen = busy_cpu()
        handshakes, cpu, steal = handshake_count() - before, busy - cpu0[0], stolen - cpu0[1]
        head_cpu = time.process_time() - head0
        threads = by_kind(threads0, head_cpu)
        timings = dict(cluster._provider.timings)  # cumulative since the provider's start
    finally:
        t1 = time.perf_counter()
        cluster.stop()
        stopped = time.perf_counter() - t1
    if runs is None:
        return
    runs.start.append(started)
    runs.stop.append(stopped)
    runs.handshakes.append(handshakes)
    runs.cpu.append(cpu)
    runs.steal.append(steal)
    runs.head_cpu.append(head_cpu)
    runs.threads.update(threads)
    runs.phases["connect"].append(timings["connect"])
    runs.phases["probe"].append(timings["preflight"] - timings["connect"])
    runs.phases["install"].append(timings["install"] - timings["preflight"])
    runs.phases["agents"].append(started - timings["install"])


def run_openssh(bed: Testbed, known_hosts: Path) -> tuple[float, float]:
    """Seconds for ``ssh root@host true`` to every host, all started together, and the CPU
    seconds the ssh clients used (on the head: their key exchange, above all)."""
    options = ["-i", str(bed.identity), "-o", f"UserKnownHostsFile={known_hosts}"]
    options += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    t0, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = [
        subprocess.Popen(
            ["ssh", *options, f"root@{h.addr}", "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for h in bed.hosts
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    for proc, (_, err) in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            sys.exit(f"plain ssh failed ({proc.returncode}): {err.decode().strip()}")
    return elapsed, cpu


SKEL_BASHRC = Path("/etc/skel/.bashrc")


def measure(n: int, repeat: int, warmup: int, tmp: Path, *, skel_bashrc: bool) -> Runs:
    """Make a testbed of ``n`` hosts, time bootstraps and ssh rounds on it, tear it down."""
    runs = Runs(n)
    t0 = time.perf_counter()
    bed = make_testbed(n, tmp / f"bed{n}")
    runs.setup = time.perf_counter() - t0
    try:
        if skel_bashrc:
            for host in bed.hosts:
                host.rebind([(SKEL_BASHRC, Path.home() / ".bashrc")])
        known_hosts = bed.write_known_hosts()
        for i in range(warmup + repeat):
            counted = i >= warmup
            run_cluster(bed, known_hosts, tmp / f"run-{n}-{i}", runs if counted else None)
            elapsed, cpu = run_openssh(bed, known_hosts)
            if counted:
                runs.openssh.append(elapsed)
                runs.openssh_cpu.append(cpu)
    finally:
        bed.close()
    return runs


def row(label: str, times: list[float]) -> str:
    ms = [t * 1000 for t in times]
    return f"  {label:42} {statistics.median(ms):8.1f} {min(ms):8.1f}"


def report(runs: Runs, repeat: int, warmup: int) -> None:
    print(f"\n{runs.hosts} host(s), testbed up in {runs.setup:.2f} s (not counted)")
    title = f"{repeat} runs after {warmup} warm-up"
    print(f"  {title:42} {'median':>8} {'min':>8}  (ms)")
    print(row("start() (bootstrap)", runs.start))
    for phase in PHASES:
        print(row(f"  {phase}", runs.phases[phase]))
    print(row("stop()", runs.stop))
    print(row("floor: plain OpenSSH, 1 round per host", runs.openssh))
    start, floor = statistics.median(runs.start), statistics.median(runs.openssh)
    cpus = os.cpu_count() or 1
    share = statistics.median(c / (t * cpus) for c, t in zip(runs.cpu, runs.start, strict=True))
    print(f"  start() / floor (medians): {start / floor:.2f}")
    stolen = statistics.median(c / (t * cpus) for c, t in zip(runs.steal, runs.start, strict=True))
    print(
        f"  machine CPU busy during start(): {share:.0%} of {cpus} CPUs; taken by the "
        f"hypervisor (steal): {stolen:.0%}"
    )
    n = runs.hosts
    print(
        f"  CPU per host during start(): {statistics.median(runs.cpu) / n * 1000:.0f} ms on the "
        f"machine (fake hosts included), {statistics.median(runs.head_cpu) / n * 1000:.0f} ms "
        "in this process"
    )
    if runs.threads:
        count = len(runs.head_cpu) * n
        print("  this process's CPU per host during start(), by thread (ms, mean):")
        for kind, spent in runs.threads.most_common():
            print(f"    {spent / count * 1000:6.2f}  {kind}")
    clients = statistics.median(runs.openssh_cpu) / n * 1000
    print(f"  the plain OpenSSH round's ssh clients: {clients:.0f} ms of CPU per host, on the head")
    per_host = sorted({h / runs.hosts for h in runs.handshakes})
    print(f"  handshakes per host during start(): {', '.join(f'{x:.1f}' for x in per_host)}")


def leftover_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [ln.split()[0] for ln in out.stdout.splitlines() if ln.startswith("cb")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="counted runs per size (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted runs per size (default 1)")
    parser.add_argument("--sizes", default="1,4,8", help="host counts (default 1,4,8)")
    parser.add_argument(
        "--skel-bashrc",
        action="store_true",
        help=f"the fake hosts' login user gets {SKEL_BASHRC} as ~/.bashrc",
    )
    args = parser.parse_args()
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if args.repeat < 1 or args.warmup < 0 or sizes[0] < 1 or len(sizes) < 2:
        parser.error("give two sizes or more, each >= 1; --repeat >= 1, --warmup >= 0")
    if os.geteuid() != 0:
        print("error: fake hosts need root (network namespaces); run as root.", file=sys.stderr)
        return 2
    if args.skel_bashrc and not SKEL_BASHRC.is_file():
        parser.error(f"--skel-bashrc: there is no {SKEL_BASHRC} on this machine")

    print(f"clusterbook {cb.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    rc = SKEL_BASHRC if args.skel_bashrc else Path.home() / ".bashrc"
    print(f"login user's ~/.bashrc on the fake hosts: {rc}")
    results: dict[int, Runs] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="cb-sshbench-") as tmp:
            for n in sizes:
                results[n] = measure(
                    n, args.repeat, args.warmup, Path(tmp), skel_bashrc=args.skel_bashrc
                )
                report(results[n], args.repeat, args.warmup)
    finally:
        if left := leftover_namespaces():
            print(f"\nWARNING: network namespaces remain: {' '.join(left)}", file=sys.stderr)

    small, large = results[sizes[0]], results[sizes[-1]]
    n = large.hosts
    ratio = statistics.median(large.start) / statistics.median(large.openssh)
    ratio_ok = ratio <= GOAL_RATIO
    print(
        f"\n{n} hosts: start() / plain OpenSSH round (medians): {ratio:.2f}   "
        f"goal <= {GOAL_RATIO:.1f}: {'PASS' if ratio_ok else 'MISS'}"
    )
    head = statistics.median(large.head_cpu) / n
    head_ok = head <= GOAL_HEAD_CPU
    print(
        f"{n} hosts: this process's CPU per host during start(): {head * 1000:.1f} ms   "
        f"goal <= {GOAL_HEAD_CPU * 1000:.0f} ms: {'PASS' if head_ok else 'MISS'}"
    )
    extra = statistics.median(large.head_cpu) - statistics.median(small.head_cpu)
    print(
        f"each host past the first {small.hosts}: {extra / (n - small.hosts) * 1000:.1f} ms of "
        f"this process's CPU (what start() costs once, whatever the hosts, left out) (info)"
    )
    growth = statistics.median(large.start) / statistics.median(small.start)
    floor = statistics.median(large.openssh) / statistics.median(small.openssh)
    print(
        f"median {n} hosts / {small.hosts} host(s): bootstrap {growth:.2f}, "
        f"plain OpenSSH {floor:.2f} (info)"
    )
    one_each = all(h == r.hosts for r in results.values() for h in r.handshakes)
    print(f"one handshake per host: {'PASS' if one_each else 'MISS'}")
    return 0 if ratio_ok and head_ok and one_each else 1


if __name__ == "__main__":
    sys.exit(main())
