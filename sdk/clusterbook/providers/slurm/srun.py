"""The nodes of the Slurm allocation this process runs in, reached through Slurm's ``srun``.

Inside an allocation (``salloc``, an ``sbatch`` script), Slurm's daemons already run on every
node: jobs start as steps of the allocation (:mod:`clusterbook.launch.srun`), and whatever the
cluster asks of a node (stop a job, keep a failed one for inspection, run a command, find a
free port) is a node task (:mod:`clusterbook.nodes.tasks`) run there by a one-task ``srun``.
No ssh, no key, nothing installed: ``stop()`` has nothing to remove but the jobs. The nodes
share this machine's files (the usual Slurm cluster's shared file system): the cluster's
Python is at the same path there, and what a job writes is here.

``start()`` runs one step with a task per node that starts MPI (``mpi4py``) through the PMI
plugin of the cluster's MPI and reports the node and its world: a world of one on every node
means the plugin does not fit that MPI (its ranks would each run alone and exit 0), which is
a :class:`~clusterbook.ConfigError` saying what to do instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterbook.errors import BootstrapError, ClusterError, ConfigError
from clusterbook.launch.command import OPENMPI_TUNING
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.keep import end_far, hold_far
from clusterbook.launch.remote import RemoteLaunch, SrunStep
from clusterbook.launch.result import KeptProcess
from clusterbook.launch.srun import PMI_PLUGIN, inherited_slurm
from clusterbook.nodes.call import Call
from clusterbook.nodes.commands import NodeRun, run_everywhere
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.outgoing import Outgoing
from clusterbook.nodes.tasks.program import ENTRY
from clusterbook.nodes.transfer import uncounted
from clusterbook.providers.base import Provider, StartContext
from clusterbook.providers.elastic.far import head_address_towards
from clusterbook.providers.reach import NodeReach, here_for
from clusterbook.providers.slurm.commands import SlurmRunner, run_command
from clusterbook.providers.ssh.hosts import parse_host_list
from clusterbook.spec import NodeSpec
from clusterbook.wording import spell

__all__ = ["PROBE", "SrunProvider", "SrunReach", "check_world", "read_probe", "step_argv"]

#: What each node runs at start: MPI through Slurm's plugin, and what the node is.
PROBE = """\
import json, os, socket
from mpi4py import MPI
w = MPI.COMM_WORLD
print(json.dumps({"node": os.environ.get("SLURMD_NODENAME"), "host": socket.gethostname(),
                  "cores": os.cpu_count(), "rank": w.Get_rank(), "size": w.Get_size()}),
      flush=True)
"""

_PROBE_TIMEOUT = 120.0  # srun waits, without a word, for nodes it cannot have yet


def read_probe(stdout: str, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The probe's report of each of ``hosts`` (Slurm's node names), from the ``srun
    --label`` output: by the node each task says it ran on (``SLURMD_NODENAME``), else task i
    on ``hosts[i]``; a node that said nothing is missing."""
    found: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        label, sep, text = line.partition(": ")
        if not sep or not label.strip().isdigit() or not text.startswith("{"):
            continue
        try:
            info = json.loads(text)
        except ValueError:
            continue
        node = info.get("node") if isinstance(info, dict) else None
        task = int(label)
        if isinstance(node, str) and node in hosts:
            found[node] = info
        elif node is None and task < len(hosts) and isinstance(info, dict):
            found[hosts[task]] = info
    return found


def step_argv(srun: str, job_id: str, hosts: Sequence[str]) -> list[str]:
    """The start of an ``srun`` command line: a step of job ``job_id`` with a task on each of
    ``hosts`` (Slurm's node names), sharing them with the job's other steps, each line
    labelled with its task, ended when a task fails."""
    return [
        srun,
        f"--jobid={job_id}",
        f"--nodelist={','.join(hosts)}",
        f"--nodes={len(hosts)}",
        f"--ntasks={len(hosts)}",
        "--overlap",
        "--label",
        "--kill-on-bad-exit=1",
    ]


def check_world(
    run: SlurmRunner, srun: str, job_id: str, hosts: Sequence[str], ctx: StartContext
) -> dict[str, dict[str, Any]]:
    """Start MPI on each of ``hosts`` through the PMI plugin of the cluster's MPI (a step of
    job ``job_id``, run by ``run``); return what each node reported. A world of one on every
    node is a :class:`ConfigError` (the plugin does not fit the MPI); a step that fails, a
    :class:`BootstrapError` naming the nodes."""
    flavour = ctx.launcher.flavour
    plugin = PMI_PLUGIN[flavour]
    argv = [*step_argv(srun, job_id, hosts), f"--mpi={plugin}", ctx.python, "-c", PROBE]
    try:
        done = run(argv, {**ctx.env, **_mpi_env(flavour)}, _PROBE_TIMEOUT)
    except ClusterError as exc:  # srun waits, without a word, for what it cannot have
        raise ClusterError(
            f"srun did not start its step on the nodes of Slurm job {job_id} within "
            f"{_PROBE_TIMEOUT:g} s ({exc}); is the job still running? 'squeue -j {job_id}'."
        ) from None
    found = read_probe(done.stdout, hosts)
    missing = [h for h in hosts if h not in found]
    if done.returncode != 0 or missing:
        said = (done.stderr.strip() or done.stdout.strip() or "nothing")[-2000:]
        why = (
            f"The start check through srun (job {job_id}) failed (exit code "
            f"{done.returncode}): {said}. Each node needs the cluster's Python at {ctx.python} "
            "with mpi4py (a shared file system)."
        )
        raise BootstrapError({h: [why] for h in (missing or hosts)})
    if len(hosts) > 1 and {info.get("size") for info in found.values()} == {1}:
        raise ConfigError(
            f"srun --mpi={plugin} started every rank alone (a world of 1, not {len(hosts)}): "
            f"this Slurm's {plugin} plugin does not work with the cluster's {flavour.value} "
            f"({ctx.launcher.path}), so every rank would run by itself and exit 0. Use an MPI "
            f"built for this Slurm, or start its jobs with mpirun over ssh "
            f"({spell('via', 'ssh')})."
        )
    return found


class SrunReach:
    """The reach of the nodes of Slurm job ``job_id`` (``nodes()``, their hosts Slurm's node
    names), once :meth:`open`: jobs start as steps of the job, and whatever else the cluster
    asks of a node is a node task run there by a one-task step (``run``: how a Slurm command
    runs). The nodes share this machine's files: nothing to put or gather."""

    def __init__(
        self, nodes: Callable[[], tuple[NodeSpec, ...]], job_id: str, run: SlurmRunner
    ) -> None:
        self._nodes = nodes
        self._job_id = job_id
        self._run = run
        self._srun = "srun"
        self._ctx: StartContext | None = None
        self._remote: RemoteLaunch | None = None
        self._held: set[str] = set()

    def open(self, srun: str, ctx: StartContext, head_addr: str) -> None:
        """Reach the nodes through ``srun`` from now on; ``head_addr``: this machine's
        address as the nodes see it ("" when it cannot be told)."""
        self._srun, self._ctx = srun, ctx
        self._remote = RemoteLaunch(
            ssh_args=(), ssh_wrapper="", head_addr=head_addr, srun=SrunStep(srun, self._job_id)
        )

    def close(self) -> None:
        """Nothing was put on the nodes: the cluster's jobs are all it had there, and its
        stop ends them first."""
        self._ctx = None
        self._remote = None

    def remote(self) -> RemoteLaunch | None:
        return self._remote

    def put(
        self,
        sent: Outgoing,
        sending: Callable[[int], None] = uncounted,
        nodes: Collection[str] | None = None,
    ) -> dict[str, Exception]:
        """What goes to another path than its own is written here: the allocation's nodes
        share this machine's files (as ``put`` of their own paths takes for granted)."""
        return here_for(sent, sending, [n.name for n in self._nodes()], nodes)

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        return [], {}

    def stop_job(self, token: str) -> None:
        if self._ctx is None:
            return
        callers = self._callers()
        if token in self._held:  # kept stopped for inspection: no grace to give
            self._held.discard(token)
            end_far(callers, token)
            return
        parallel(sorted(callers), lambda host: callers[host]("kill", {"token": token}, 15.0))

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        if self._ctx is None:
            return ()
        self._held.add(token)
        return hold_far(self._callers(), token, failing)

    def run_on_nodes(
        self, argv: Sequence[str], timeout: float, nodes: Collection[str] | None = None
    ) -> list[NodeRun]:
        return run_everywhere(self._nodes(), self._callers(), argv, timeout, only=nodes)

    def free_port(self, node: NodeSpec) -> int | None:
        if self._ctx is None:
            return None
        return int(self._callers()[node.name]("free_port", {}, 30.0)["port"])

    def _callers(self) -> dict[str, Call]:
        """Node tasks on each node, each a one-task step of the allocation there."""
        if self._ctx is None:
            raise ClusterError("The cluster is not started; call start() first.")
        python, env = self._ctx.python, dict(self._ctx.env)

        def caller(host: str) -> Call:
            def call(task: str, args: Mapping[str, Any], timeout: float, **_: Any) -> Any:
                argv = [*step_argv(self._srun, self._job_id, [host]), python, "-S", _TASKS]
                done = self._run([*argv, task, json.dumps(dict(args))], env, timeout)
                lines = [line.partition(": ")[2] for line in done.stdout.splitlines()]
                if done.returncode != 0 or not lines:
                    raise ClusterError(
                        f"The node task {task!r} on {host} (through srun) failed: "
                        f"{(done.stderr.strip() or done.stdout.strip() or 'no output')[-1000:]}"
                    )
                return json.loads(lines[-1])

            return call

        return {n.name: caller(n.host) for n in self._nodes()}


class SrunProvider(Provider):
    """The nodes of Slurm job ``job_id`` (default ``SLURM_JOB_ID``): ``hosts`` as Slurm names
    them, with their slots (``["node1:4", ...]``), jobs started by ``srun``. A fixed set:
    ready once started (the default watch); reached through Slurm (:class:`SrunReach`)."""

    kind = "srun"

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        job_id: str | int | None = None,
        srun: str = "srun",
        runner: SlurmRunner | None = None,
    ) -> None:
        entries = parse_host_list(hosts)
        for host, slots in entries:
            if not isinstance(slots, int):
                raise ConfigError(
                    f"Host {host!r} of a Slurm allocation has slots {slots!r}; give a number "
                    "(Slurm says how many tasks each node takes)."
                )
        self._nodes = tuple(NodeSpec(host, host, int(slots)) for host, slots in entries)
        given = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID")
        if given is None or not str(given).strip().isdigit():
            raise ConfigError(
                f"The Slurm job id {given!r} is not a job's number: run inside an allocation "
                "(salloc, an sbatch script), where SLURM_JOB_ID says it, or give job_id=."
            )
        self.job_id = str(given).strip()
        self._srun = srun
        self._run: SlurmRunner = runner or run_command
        self._env = {k: v for k, v in os.environ.items() if k not in inherited_slurm(os.environ)}
        self._reach = SrunReach(lambda: self._nodes, self.job_id, self._run_env)

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return self._nodes

    @property
    def reach(self) -> NodeReach:
        return self._reach

    def start(self, ctx: StartContext) -> None:
        srun = shutil.which(self._srun)
        if srun is None:
            raise ConfigError(
                f"Slurm's {self._srun!r} is not on PATH here: the nodes of an allocation are "
                "reached through it. Run where Slurm's commands are (inside the allocation), "
                "or give the path as srun=."
            )
        hosts = [n.host for n in self._nodes]
        ctx.progress(f"checking {len(hosts)} nodes")
        found = check_world(self._run_env, srun, self.job_id, hosts, ctx)
        self._nodes = tuple(
            NodeSpec(n.name, n.host, n.slots, cores=_cores(found[n.host])) for n in self._nodes
        )
        self._reach.open(srun, ctx, self._head_address(hosts[0]))
        self.started = True

    def _head_address(self, node: str) -> str:
        """This machine's address on the way to ``node`` (its ``NodeAddr``, as scontrol says
        it): what processes there connect back to (engines); "" when it cannot be told."""
        try:
            done = self._run_env(["scontrol", "show", "node", "-o", node], {}, 30.0)
            said = re.search(r"\bNodeAddr=(\S+)", done.stdout) if done.returncode == 0 else None
            return head_address_towards(socket.gethostbyname(said.group(1) if said else node))
        except (OSError, ClusterError):
            return ""

    def stop(self) -> None:
        """Nothing was put on the nodes: the cluster's jobs are all it had there, and its
        stop ends them first. Never raises."""
        self._reach.close()
        self.started = False

    def _run_env(
        self, argv: Sequence[str], env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command with this process's environment but its Slurm job's."""
        return self._run(argv, {**self._env, **env}, timeout)


_TASKS = ENTRY  # the node program, run from its files (they are shared there)


def _mpi_env(flavour: MPIFlavour) -> dict[str, str]:
    """What the MPI of the start check needs under srun (as a job's ranks get it)."""
    if flavour is not MPIFlavour.OPENMPI:
        return {}
    env = dict(OPENMPI_TUNING)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _cores(info: Mapping[str, Any]) -> int | None:
    cores = info.get("cores")
    return cores if isinstance(cores, int) and cores > 0 else None
