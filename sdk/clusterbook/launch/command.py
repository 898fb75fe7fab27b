"""Pure argv builders for each MPI flavour, hostfiles and rank placement.

Nothing here touches the system: a :class:`LaunchPlan` goes in, a :class:`LaunchCommand`
(argv, environment to add, hostfile text) comes out, so every flag is covered by golden tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from clusterbook.launch.direct import prterun_start
from clusterbook.launch.flavour import Launcher, MPIFlavour
from clusterbook.launch.guard import ENV as GUARD_ENV
from clusterbook.launch.machines import MachineLoad, machine_loads
from clusterbook.launch.rankwrap import HOOK_DIR, wrap_argv
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.spec import HERE, NodeSpec

__all__ = [
    "GPU_ENV",
    "HYDRA_LAST",
    "LAUNCH_ENV",
    "MPICH_OWN_ENV",
    "OPENMPI_OUTPUT",
    "OPENMPI_TUNING",
    "TORCH_ENV",
    "YIELD",
    "LaunchCommand",
    "LaunchPlan",
    "binding",
    "build_command",
    "forwarded",
    "host_gpus",
    "host_load",
    "host_ranks",
    "machine_load",
    "master_addr",
    "placement",
    "placement_args",
    "render_hostfile",
    "shared_hostnames",
]

#: Open MPI defaults for clusters of a few machines over TCP: skip the libfabric probe, which
#: costs about a second at every start and brings nothing on Ethernet or shared memory.
OPENMPI_TUNING: Mapping[str, str] = {"OMPI_MCA_btl": "^ofi", "OMPI_MCA_mtl": "^ofi"}
OPENMPI_OUTPUT = "tag:raw,merge-stderr-to-stdout"
#: Open MPI's ranks yield the processor while they wait, instead of polling: set on a machine
#: given more ranks than cores (:mod:`~clusterbook.launch.machines`), unless the job or the
#: head's environment sets it.
YIELD = "OMPI_MCA_mpi_yield_when_idle"

#: What the system around the head says of the job (names, or prefixes ending in ``*``): these
#: of the head's variables reach every rank, under either MPI. A variable that describes the
#: head's own task (``SLURM_PROCID``, ``PBS_TASKNUM``) is not among them: it would tell every
#: rank that it is the head's.
LAUNCH_ENV = (
    "SM_*",  # a SageMaker training job's (SM_HOSTS, SM_CHANNEL_*, SM_MODEL_DIR, SM_HPS...)
    "TRAINING_JOB_NAME",
    "TRAINING_JOB_ARN",
    "SLURM_JOB_*",  # a Slurm job's, not its steps' or tasks'
    "SLURM_CLUSTER_NAME",
    "SLURM_SUBMIT_DIR",
    "SLURM_SUBMIT_HOST",
    "PBS_JOBID",  # a PBS/Torque job's
    "PBS_JOBNAME",
    "PBS_QUEUE",
    "PBS_O_*",
)
#: Put last in mpiexec's environment: Hydra's -genvlist never finds the last variable there
#: (HYDU_env_lookup stops before the end of its list), so that must be none of the ranks'.
HYDRA_LAST = "CLUSTERBOOK_ENV_END"
#: MPICH's own settings in the head's environment, which reach its ranks as Open MPI's
#: (``OMPI_MCA_*``, ``PRTE_MCA_*``) reach theirs: Open MPI's mpirun forwards those itself.
MPICH_OWN_ENV = ("MPIR_CVAR_*",)


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything that decides a launcher command line."""

    launcher: Launcher
    nodes: tuple[NodeSpec, ...]
    np: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    hostfile: str
    output_dir: str
    as_root: bool = False
    oversubscribe: bool = False
    remote: RemoteLaunch | None = None
    inherited_env: Mapping[str, str] = field(default_factory=dict)
    launcher_args: tuple[str, ...] = ()
    job_token: str = ""
    hook_dir: str = HOOK_DIR
    abort_on_error: bool = True
    master_port: int = 29500  # torch.distributed's, on rank 0's host (chosen at prepare)
    clean: str = "all"  # "none": a failing rank stops itself (see launch.keep)
    forward_env: tuple[str, ...] = ()  # more of inherited_env for the ranks (NAME, PREFIX*)


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """A launcher command line, the variables to add to its environment (and, ``unset``,
    those to take out of it; ``last``, one of them to put last), its hostfile."""

    argv: list[str]
    env: dict[str, str]
    hostfile_text: str
    unset: tuple[str, ...] = ()
    last: str | None = None

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The launcher's environment, in order: ``base`` with this command's changes."""
        env = {**base, **self.env}
        for name in self.unset:
            env.pop(name, None)
        if self.last is not None:
            env[self.last] = env.pop(self.last)
        return env


def placement(nodes: tuple[NodeSpec, ...], np: int) -> list[int]:
    """Index of the node each rank runs on: fill each node's slots in order, then wrap."""
    order: list[int] = []
    for i, node in enumerate(nodes):  # only as far as the ranks go: a cluster may be large
        order += [i] * node.slots
        if len(order) >= np:
            break
    return [order[r % len(order)] for r in range(np)]


def placement_args(
    launcher_args: tuple[str, ...], options: tuple[tuple[str, str], ...]
) -> list[str]:
    """Each ``(option, value)`` clusterbook would give the launcher (``--map-by``,
    ``--bind-to``, ...), but those the job's ``launcher_args`` give themselves (as ``OPT V`` or
    ``OPT=V``, with one dash or two): a launcher refuses such an option twice, and the user's
    choice is the one meant (e.g. ``--bind-to none`` for nodes that share one machine's
    cores)."""
    given = {a.split("=", 1)[0].lstrip("-") for a in launcher_args if a.startswith("-")}
    return [x for opt, value in options if opt.lstrip("-") not in given for x in (opt, value)]


def binding(nodes: tuple[NodeSpec, ...], np: int) -> str:
    """``core`` when every machine has a core per rank it gets and no two of its hosts
    that get ranks share CPUs (:mod:`~clusterbook.launch.machines`), else ``none``.

    Binding more ranks than cores makes Open MPI refuse to start; an unknown core count is
    treated as too few. Each host's daemon binds its ranks from the first CPUs it may use:
    two hosts of one machine would bind theirs to the same ones.
    """
    return _bind(machine_load(nodes, np))


def _bind(loads: list[MachineLoad]) -> str:
    fits = all(m.cores is not None and not m.crowded and not m.overlap for m in loads)
    return "core" if fits else "none"


def _binding(plan: LaunchPlan, loads: list[MachineLoad]) -> str:
    """:func:`binding` of the plan's machine ``loads``, but ``none`` where two of the job's
    hosts report one host name (:func:`shared_hostnames`; nodes that do not say where their
    cores are): each one's daemon binds its ranks from the machine's first core, the same
    cores for all."""
    return "none" if shared_hostnames(plan) else _bind(loads)


def _ranks_per_node(nodes: tuple[NodeSpec, ...], np: int) -> list[int]:
    """How many of ``np`` ranks :func:`placement` puts on each of ``nodes``."""
    per_node = [0] * len(nodes)
    for i in placement(nodes, np):
        per_node[i] += 1
    return per_node


def machine_load(nodes: tuple[NodeSpec, ...], np: int) -> list[MachineLoad]:
    """The load :func:`placement` puts on each machine of ``nodes``
    (:func:`~clusterbook.launch.machines.machine_loads`)."""
    return machine_loads(nodes, _ranks_per_node(nodes, np))


def host_load(nodes: tuple[NodeSpec, ...], np: int) -> dict[str, tuple[int, int | None]]:
    """The ranks ``np`` ranks put on each host of ``nodes`` (nodes on one host share its
    cores) and the host's cores (its first node's; None when not known), in the nodes'
    order."""
    hosts: dict[str, tuple[int, int | None]] = {}
    for node, count in zip(nodes, _ranks_per_node(nodes, np), strict=True):
        ranks, cores = hosts.get(node.host, (0, node.cores))
        hosts[node.host] = (ranks + count, cores)
    return hosts


def render_hostfile(nodes: tuple[NodeSpec, ...], flavour: MPIFlavour) -> str:
    """The hostfile in ``flavour``'s format; nodes on the same host add up their slots."""
    slots: dict[str, int] = {}
    for node in nodes:
        slots[node.host] = slots.get(node.host, 0) + node.slots
    if flavour is MPIFlavour.OPENMPI:
        return "".join(f"{host} slots={n}\n" for host, n in slots.items())
    return "".join(f"{host}:{n}\n" for host, n in slots.items())


#: What torch.distributed reads, set on every rank by the rank wrapper unless the job sets it.
TORCH_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


#: What the rank wrapper sets on a rank of a node with GPUs, unless the job sets it: the
#: rank's GPU, by nvidia-smi's index, in nvidia-smi's order.
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def host_gpus(nodes: tuple[NodeSpec, ...]) -> list[tuple[str, ...]]:
    """The GPUs of each host (numbered as in :func:`host_ranks`), by ``CUDA_VISIBLE_DEVICES``
    id: its nodes' together, each GPU once (agents on one machine each report all of it)."""
    gpus: dict[str, dict[str, None]] = {}
    for node in nodes:
        gpus.setdefault(node.host, {}).update(dict.fromkeys(node.gpus.ids))
    return [tuple(ids) for ids in gpus.values()]


def host_ranks(nodes: tuple[NodeSpec, ...], np: int) -> list[int]:
    """Index of the host each rank runs on, hosts numbered in order of first appearance:
    the launcher fills each host's slots (its nodes' together, as in the hostfile), then
    wraps."""
    slots: dict[str, int] = {}
    for node in nodes:
        slots[node.host] = slots.get(node.host, 0) + node.slots
    order = [i for i, n in enumerate(slots.values()) for _ in range(n)]
    return [order[r % len(order)] for r in range(np)]


def master_addr(nodes: tuple[NodeSpec, ...]) -> str:
    """Rank 0's host, as the other ranks reach it."""
    host = nodes[0].host if nodes else "127.0.0.1"
    return "127.0.0.1" if host == HERE else host


def rank_env(plan: LaunchPlan) -> dict[str, str]:
    """Variables every rank gets: the user's, the rank hook on PYTHONPATH, and what the rank
    wrapper needs to give torch.distributed its variables and each rank its GPU."""
    env = dict(plan.env)
    env["CLUSTERBOOK_RANK_NODES"] = " ".join(map(str, host_ranks(plan.nodes, plan.np)))
    env["CLUSTERBOOK_MASTER_ADDR"] = master_addr(plan.nodes)
    env["CLUSTERBOOK_MASTER_PORT"] = str(plan.master_port)
    gpus = host_gpus(plan.nodes)
    # A rank's GPU, unless the job chose the GPUs itself: each host's, "-" for none.
    if any(gpus) and "CUDA_VISIBLE_DEVICES" not in plan.env:
        env["CLUSTERBOOK_GPUS"] = " ".join(",".join(ids) or "-" for ids in gpus)
    if chosen := " ".join(name for name in (*TORCH_ENV, *GPU_ENV) if name in plan.env):
        env["CLUSTERBOOK_USER_SET"] = chosen
    base = env.get("PYTHONPATH", plan.inherited_env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = plan.hook_dir + (os.pathsep + base if base else "")
    env["CLUSTERBOOK_RANK_HOOK"] = "1" if plan.abort_on_error else "stacks"
    if plan.clean == "none":
        env["CLUSTERBOOK_CLEAN"] = "none"
    else:  # what stops a failing rank is the head's to ask, not the job's env
        env.pop("CLUSTERBOOK_CLEAN", None)
    if plan.job_token:
        env[GUARD_ENV] = plan.job_token
    return env


def _matching(names: Iterable[str], patterns: tuple[str, ...]) -> set[str]:
    """The ``names`` that one of ``patterns`` (a name, or a prefix ending in ``*``) matches:
    one C-level test per name (this runs at every job's start, over the head's environment)."""
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    exact = {p for p in patterns if not p.endswith("*")}
    return {name for name in names if name in exact or name.startswith(prefixes)}


def forwarded(plan: LaunchPlan, env: Mapping[str, str]) -> list[str]:
    """The names the ranks get, besides the job's own ``env``: those of the head's
    environment (``plan.inherited_env``) that :data:`LAUNCH_ENV` or ``plan.forward_env``
    name (and, for MPICH, :data:`MPICH_OWN_ENV`), with ``env``'s, sorted. Remote ranks get
    these and what their node's session has, the same under either MPI; local ranks get the
    head's whole environment as well, as child processes do."""
    patterns = (*LAUNCH_ENV, *plan.forward_env)
    if plan.launcher.flavour is MPIFlavour.MPICH:
        patterns += MPICH_OWN_ENV
    return sorted(_matching(plan.inherited_env, patterns) | set(env))


def build_command(plan: LaunchPlan) -> LaunchCommand:
    """The MPI launcher's command line for ``plan`` (``mpirun``, ``mpiexec``); the nodes of a
    Slurm allocation that start steps take ``srun``'s instead
    (:func:`clusterbook.launch.srun.launch_command` chooses)."""
    if plan.launcher.flavour is MPIFlavour.OPENMPI:
        return _openmpi(plan)
    return _mpich(plan)


def shared_hostnames(plan: LaunchPlan) -> list[str]:
    """Host names that two or more of the job's hosts (those ranks go to) report: two sshds,
    or containers with the host's network, on one machine."""
    if plan.remote is None:
        return []
    names: dict[str, set[str]] = {}
    for i in placement(plan.nodes, plan.np):
        host = plan.nodes[i].host
        names.setdefault(plan.remote.hostnames.get(host, host), set()).add(host)
    return sorted(name for name, hosts in names.items() if len(hosts) > 1)


def _openmpi(plan: LaunchPlan) -> LaunchCommand:
    env = rank_env(plan)
    extra = {k: v for k, v in OPENMPI_TUNING.items() if k not in plan.inherited_env}
    if "OMPI_MCA_btl" in extra and shared_hostnames(plan):
        # Open MPI names a rank's shared-memory file by host name, job and local rank: ranks
        # of two daemons on one machine under one name would write into each other's (a
        # segfault in btl_sm, now and then). The job's ranks talk over TCP instead.
        extra["OMPI_MCA_btl"] = "^ofi,sm"
    loads = machine_load(plan.nodes, plan.np)  # once: for the yielding and the binding
    mine = YIELD not in plan.env and YIELD not in plan.inherited_env
    if mine and any(m.crowded for m in loads):
        extra[YIELD] = "1"  # Open MPI's own: only for more ranks than slots on one host
    mapping = "slot:OVERSUBSCRIBE" if plan.oversubscribe else "slot"
    argv = [plan.launcher.path, "--hostfile", plan.hostfile, "-n", str(plan.np)]
    places = (("--map-by", mapping), ("--bind-to", _binding(plan, loads)))
    argv += placement_args(plan.launcher_args, places)
    # Every chunk of rank output as it comes, tagged, on mpirun's stdout (see launch.parse).
    argv += ["--output", OPENMPI_OUTPUT]
    if plan.as_root:
        argv.append("--allow-run-as-root")
    if plan.remote is not None:
        # Remote shells do not have the venv's PATH: prted is found through --prefix. The
        # launcher's ssh (tree spawn too) uses the cluster's key and strict known_hosts.
        argv += ["--prefix", plan.launcher.prefix]
        argv += ["--prtemca", "plm_ssh_args", " ".join(plan.remote.ssh_args)]
        if plan.remote.launch_agent is not None:
            argv += ["--prtemca", "plm_ssh_agent", plan.remote.launch_agent]
        if not plan.remote.tree_spawn or plan.remote.launch_agent is not None:
            argv += ["--prtemca", "plm_ssh_no_tree_spawn", "1"]
    # -x NAME exports the value from mpirun's own environment: byte for byte, and not on
    # the command line where `ps` would show it.
    for name in forwarded(plan, env):
        argv += ["-x", name]
    argv += [*plan.launcher_args, *wrap_argv(list(plan.argv))]
    env = {**extra, **env}
    # mpirun's own two starts skipped: its prterun, with the arguments and variables it gives.
    if (direct := prterun_start(plan.launcher.path, plan.launcher.prterun_sets, env)) is not None:
        argv[0], sets = direct
        env |= sets
    return LaunchCommand(argv, env, render_hostfile(plan.nodes, MPIFlavour.OPENMPI))


def _mpich(plan: LaunchPlan) -> LaunchCommand:
    env = rank_env(plan)
    out = plan.output_dir
    argv = [plan.launcher.path, "-f", plan.hostfile, "-n", str(plan.np)]
    binds = _binding(plan, machine_load(plan.nodes, plan.np))
    argv += placement_args(plan.launcher_args, (("-bind-to", binds),))
    if plan.remote is not None:
        # Hydra's proxies connect back to the head: give them an address they can reach.
        ssh = plan.remote.launch_agent or plan.remote.ssh_wrapper
        argv += ["-launcher", "ssh", "-launcher-exec", ssh]
        argv += ["-localhost", plan.remote.head_addr]
    argv += [
        "-outfile-pattern",
        f"{out}/rank-%r.stdout",
        "-errfile-pattern",
        f"{out}/rank-%r.stderr",
    ]
    # -genvlist passes these of mpiexec's own environment (ours added) byte for byte, values
    # off the command line where `ps` would show them: what -x passes under Open MPI, not
    # all of it (-genvall), so that a rank's environment does not depend on the MPI.
    argv += ["-genvlist", ",".join(forwarded(plan, env))]
    argv += [*plan.launcher_args, *wrap_argv(list(plan.argv))]
    env[HYDRA_LAST] = ""
    hostfile = render_hostfile(plan.nodes, MPIFlavour.MPICH)
    return LaunchCommand(argv, env, hostfile, last=HYDRA_LAST)
