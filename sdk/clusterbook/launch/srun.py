"""Ranks started as a step of a Slurm allocation by Slurm's own launcher, ``srun``: pure.

Inside an allocation (and for a cluster whose nodes are a Slurm job), Slurm's daemons are
already on every node: ``srun`` starts the ranks there without ssh, and MPI learns its world
from Slurm's PMI plugin, ``--mpi=pmix`` for Open MPI and ``--mpi=pmi2`` for MPICH (see
:data:`PMI_PLUGIN`). A plugin that does not fit the MPI gives no error: every rank comes up
alone, a world of one, and exits 0. The world size is checked where the nodes are brought up
(:mod:`clusterbook.providers.slurm.srun`), once.

Each rank's place is the one ``mpirun`` would give it (:func:`~clusterbook.launch.command.
placement`): ``--distribution=arbitrary`` with ``SLURM_HOSTFILE`` naming the node of each
rank, a line per rank. Its output comes back behind ``srun --label``'s ``N: `` (see
:class:`~clusterbook.launch.parse.LabelParser`), and one failing rank ends the step
(``--kill-on-bad-exit``), as a failing rank ends an ``mpirun`` job.
"""

from __future__ import annotations

from collections.abc import Mapping

from clusterbook.launch.command import (
    OPENMPI_TUNING,
    LaunchCommand,
    LaunchPlan,
    build_command,
    placement,
    rank_env,
)
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.rankwrap import wrap_argv
from clusterbook.launch.remote import SrunStep

__all__ = [
    "PMI_PLUGIN",
    "SrunStep",
    "inherited_slurm",
    "launch_command",
    "rank_hosts",
    "srun_command",
]

#: Slurm's MPI plugin for each MPI flavour (``srun --mpi=...``).
PMI_PLUGIN: Mapping[MPIFlavour, str] = {MPIFlavour.OPENMPI: "pmix", MPIFlavour.MPICH: "pmi2"}

#: Prefixes of what a Slurm job (or a launcher) sets in the environment of its processes;
#: ``srun`` would read some of them as options of the step (``SLURM_NTASKS_PER_NODE``).
_INHERITED = ("SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "PMI_", "PMIX_")
#: What stays: where Slurm's configuration is.
_KEPT = frozenset({"SLURM_CONF"})


def inherited_slurm(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The variables of the Slurm job this process may run in, which a step of its own must
    not see (they describe the job's first step, not this one)."""
    return tuple(k for k in environ if k.startswith(_INHERITED) and k not in _KEPT)


def rank_hosts(plan: LaunchPlan, names: Mapping[str, str]) -> str:
    """``SLURM_HOSTFILE`` for ``--distribution=arbitrary``: each rank's node (by Slurm's name
    for it, ``names``), a line each."""
    hosts = [plan.nodes[i].host for i in placement(plan.nodes, plan.np)]
    return "".join(f"{names.get(host, host)}\n" for host in hosts)


def srun_command(plan: LaunchPlan, step: SrunStep) -> LaunchCommand:
    """The ``srun`` command line that runs ``plan`` as a step of ``step``'s job."""
    env = rank_env(plan)
    flavour = plan.launcher.flavour
    if flavour is MPIFlavour.OPENMPI:
        env.update({k: v for k, v in OPENMPI_TUNING.items() if k not in plan.inherited_env})
        if plan.as_root:  # mpirun's --allow-run-as-root, for ranks Slurm starts
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["SLURM_HOSTFILE"] = plan.hostfile
    argv = [
        step.srun,
        f"--jobid={step.job_id}",
        f"--job-name={plan.job_token}",  # the step's name: how stop_job finds it
        f"--mpi={PMI_PLUGIN[flavour]}",
        f"--ntasks={plan.np}",
        "--distribution=arbitrary",
        "--overlap",  # share the nodes with the allocation's other steps (its agents)
        "--label",
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    if plan.oversubscribe:
        argv.append("--overcommit")
    argv += [*plan.launcher_args, *wrap_argv(list(plan.argv))]
    hosts = rank_hosts(plan, step.names)
    return LaunchCommand(argv, env, hosts, unset=inherited_slurm(plan.inherited_env))


def launch_command(plan: LaunchPlan) -> LaunchCommand:
    """The command line that runs ``plan``: a step of the Slurm job (``srun``) where its nodes
    start steps (``plan.remote.srun``), else the MPI's own launcher's
    (:func:`~clusterbook.launch.command.build_command`)."""
    step = plan.remote.srun if plan.remote is not None else None
    return build_command(plan) if step is None else srun_command(plan, step)
