"""Golden tests of the launcher command lines, hostfiles, placement and binding."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from clusterbook.gpus import GPU, GPUInfo
from clusterbook.launch.command import (
    HYDRA_LAST,
    OPENMPI_TUNING,
    YIELD,
    LaunchPlan,
    binding,
    build_command,
    host_gpus,
    placement,
    placement_args,
    rank_env,
    render_hostfile,
    shared_hostnames,
)
from clusterbook.launch.flavour import Launcher, MPIFlavour
from clusterbook.launch.guard import ENV as GUARD_ENV
from clusterbook.launch.rankwrap import HOOK_DIR, WRAPPER, wrap_argv
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.spec import NodeSpec

OMPI = Launcher(path="/opt/mpi/bin/mpirun", flavour=MPIFlavour.OPENMPI, version="5.0.11")
MPICH = Launcher(path="/opt/mpich/bin/mpiexec", flavour=MPIFlavour.MPICH, version="4.2.3")
PROGRAM = ("/usr/bin/python3", "-u", "train.py", "--epochs", "3")
HOSTFILE = "/tmp/cb/job-1/hostfile"
REMOTE = RemoteLaunch(
    ssh_args=("-o", "IdentityFile=~/.clusterbook/clusters/c1/id_ed25519", "-o", "User=me"),
    ssh_wrapper="/home/me/.clusterbook/clusters/c1/ssh",
    head_addr="10.0.0.1",
)
OUT = "/tmp/cb/job-1"
LOCAL = (NodeSpec("local-0", "localhost", 4, cores=8),)
# A value a shell would mangle and `ps` must never show.
NASTY = 'it\'s "quoted" $HOME $(id) `id` ; rm -rf x\nsecond line \u00e9'


def plan(launcher: Launcher = OMPI, **changes: object) -> LaunchPlan:
    base = LaunchPlan(
        launcher=launcher,
        nodes=LOCAL,
        np=2,
        argv=PROGRAM,
        env={},
        hostfile=HOSTFILE,
        output_dir=OUT,
    )
    return replace(base, **changes)


def x_names(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]


# What the rank wrapper turns into torch.distributed's variables, for 2 ranks on LOCAL.
TORCH_LOCAL = {
    "CLUSTERBOOK_RANK_NODES": "0 0",
    "CLUSTERBOOK_MASTER_ADDR": "127.0.0.1",
    "CLUSTERBOOK_MASTER_PORT": "29500",
}


# -- Open MPI ------------------------------------------------------------------------------


def test_openmpi_minimal_golden() -> None:
    cmd = build_command(plan())
    assert cmd.argv == [
        "/opt/mpi/bin/mpirun",
        "--hostfile",
        HOSTFILE,
        "-n",
        "2",
        "--map-by",
        "slot",
        "--bind-to",
        "core",
        "--output",
        "tag:raw,merge-stderr-to-stdout",
        "-x",
        "CLUSTERBOOK_MASTER_ADDR",
        "-x",
        "CLUSTERBOOK_MASTER_PORT",
        "-x",
        "CLUSTERBOOK_RANK_HOOK",
        "-x",
        "CLUSTERBOOK_RANK_NODES",
        "-x",
        "PYTHONPATH",
        *wrap_argv(list(PROGRAM)),
    ]
    assert cmd.argv[-9:] == ["/bin/sh", "-c", WRAPPER, "cb-rank", *PROGRAM]
    assert cmd.env == {
        "OMPI_MCA_btl": "^ofi",
        "OMPI_MCA_mtl": "^ofi",
        "PYTHONPATH": HOOK_DIR,
        "CLUSTERBOOK_RANK_HOOK": "1",
        **TORCH_LOCAL,
    }
    assert cmd.hostfile_text == "localhost slots=4\n"


def test_openmpi_everything_on_golden() -> None:
    nodes = (
        NodeSpec("node1", "node1", 2, cores=2),
        NodeSpec("node2", "10.0.0.5", 2, cores=None),
    )
    cmd = build_command(
        plan(
            nodes=nodes,
            np=6,
            env={"SEED": "42", "A_FLAG": "on"},
            as_root=True,
            oversubscribe=True,
            remote=REMOTE,
            launcher_args=("--mca", "btl_tcp_if_include", "eth0"),
        )
    )
    assert cmd.argv == [
        "/opt/mpi/bin/mpirun",
        "--hostfile",
        HOSTFILE,
        "-n",
        "6",
        "--map-by",
        "slot:OVERSUBSCRIBE",
        "--bind-to",
        "none",
        "--output",
        "tag:raw,merge-stderr-to-stdout",
        "--allow-run-as-root",
        "--prefix",
        "/opt/mpi",
        "--prtemca",
        "plm_ssh_args",
        "-o IdentityFile=~/.clusterbook/clusters/c1/id_ed25519 -o User=me",
        "-x",
        "A_FLAG",
        "-x",
        "CLUSTERBOOK_MASTER_ADDR",
        "-x",
        "CLUSTERBOOK_MASTER_PORT",
        "-x",
        "CLUSTERBOOK_RANK_HOOK",
        "-x",
        "CLUSTERBOOK_RANK_NODES",
        "-x",
        "PYTHONPATH",
        "-x",
        "SEED",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
        *wrap_argv(list(PROGRAM)),
    ]
    assert cmd.hostfile_text == "node1 slots=2\n10.0.0.5 slots=2\n"
    assert cmd.env["CLUSTERBOOK_RANK_NODES"] == "0 0 1 1 0 0"  # filled, then wrapped
    assert cmd.env["CLUSTERBOOK_MASTER_ADDR"] == "node1"


@pytest.mark.parametrize(
    ("flag", "present"),
    [("as_root", "--allow-run-as-root"), ("remote", "--prefix")],
)
def test_openmpi_optional_flags_only_when_asked(flag: str, present: str) -> None:
    assert present not in build_command(plan()).argv
    value = REMOTE if flag == "remote" else True
    assert present in build_command(plan(**{flag: value})).argv


def test_openmpi_oversubscribe_changes_mapping() -> None:
    def map_by(argv: list[str]) -> str:
        return argv[argv.index("--map-by") + 1]

    assert map_by(build_command(plan()).argv) == "slot"
    assert map_by(build_command(plan(oversubscribe=True)).argv) == "slot:OVERSUBSCRIBE"


def test_openmpi_prefix_is_install_dir_above_bin() -> None:
    launcher = replace(OMPI, path="/home/u/venv/bin/mpirun")
    argv = build_command(plan(launcher, remote=REMOTE)).argv
    assert argv[argv.index("--prefix") + 1] == "/home/u/venv"


@pytest.mark.parametrize(
    ("nodes", "np", "expected"),
    [
        (LOCAL, 8, "core"),  # 8 ranks, 8 cores
        (LOCAL, 9, "none"),  # wraps onto the node: more ranks than cores
        ((NodeSpec("n", "n", 2, cores=None),), 1, "none"),  # unknown core count
    ],
)
def test_openmpi_bind_to_follows_binding(
    nodes: tuple[NodeSpec, ...], np: int, expected: str
) -> None:
    argv = build_command(plan(nodes=nodes, np=np, oversubscribe=True)).argv
    assert argv[argv.index("--bind-to") + 1] == expected


@pytest.mark.parametrize(
    "given",
    [["--bind-to", "none"], ["--bind-to=none"], ["-bind-to", "none"]],
)
def test_openmpi_a_binding_in_launcher_args_replaces_clusterbooks(given: list[str]) -> None:
    # mpirun refuses "--bind-to" twice ("listed more than once"): the job's own is the one.
    argv = build_command(plan(launcher_args=tuple(given))).argv
    assert [a for a in argv if "bind-to" in a] == [a for a in given if "bind-to" in a]
    assert argv[argv.index("--map-by") + 1] == "slot"  # the rest as before
    mapped = build_command(plan(launcher_args=("--map-by", "node"))).argv
    assert mapped.count("--map-by") == 1
    assert mapped[mapped.index("--map-by") + 1] == "node"
    assert mapped[mapped.index("--bind-to") + 1] == "core"


def test_placement_args_keep_what_the_launcher_args_do_not_say() -> None:
    options = (("--map-by", "slot"), ("--bind-to", "core"))
    assert placement_args((), options) == ["--map-by", "slot", "--bind-to", "core"]
    assert placement_args(("-x", "BIND", "--bind-to", "none"), options) == ["--map-by", "slot"]
    # A value that merely names an option is not one: only arguments that start with a dash.
    assert placement_args(("--prtemca", "x", "bind-to"), options) == [
        "--map-by",
        "slot",
        "--bind-to",
        "core",
    ]


def test_openmpi_env_names_sorted_values_never_in_argv() -> None:
    env = {"ZED": NASTY, "ALPHA": "x$(whoami)y", "MIDDLE": "plain value"}
    cmd = build_command(plan(env=env))
    assert x_names(cmd.argv) == [
        "ALPHA",
        "CLUSTERBOOK_MASTER_ADDR",
        "CLUSTERBOOK_MASTER_PORT",
        "CLUSTERBOOK_RANK_HOOK",
        "CLUSTERBOOK_RANK_NODES",
        "MIDDLE",
        "PYTHONPATH",
        "ZED",
    ]
    for value in (*env.values(), cmd.env["PYTHONPATH"], "^ofi"):
        assert not any(value in arg for arg in cmd.argv), value
    for part in ("second line", '"quoted"', "$(whoami)", "plain value"):
        assert not any(part in arg for arg in cmd.argv), part
    # The values reach the launcher through its environment, byte for byte.
    assert cmd.env["ZED"] == NASTY
    assert cmd.env["ZED"].encode() == NASTY.encode()
    assert cmd.env["ALPHA"] == "x$(whoami)y"
    assert cmd.env["MIDDLE"] == "plain value"


# -- The ranks' environment: the same under either MPI -------------------------------------

# The head's environment inside a job of some system, and what the user set for themselves.
LAUNCH = {
    "SM_HOSTS": '["algo-1","algo-2"]',
    "SM_CHANNEL_TRAIN": "/opt/ml/input/data/train",
    "TRAINING_JOB_NAME": "tj-1",
    "SLURM_JOB_ID": "42",
    "SLURM_PROCID": "0",  # the head's own task: not every rank's
    "PBS_JOBID": "17.pbs01",
    "PBS_TASKNUM": "1",
    "NCCL_DEBUG": "INFO",
    "NCCL_SOCKET_IFNAME": "eth0",
    "HOME": "/home/head-user",
    "PATH": "/home/head-user/venv/bin:/usr/bin",
    "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
    "MPIR_CVAR_CH4_NETMOD": "ofi",
}
SYSTEM = ["PBS_JOBID", "SLURM_JOB_ID", "SM_CHANNEL_TRAIN", "SM_HOSTS", "TRAINING_JOB_NAME"]


def passed_names(launcher: Launcher, argv: list[str]) -> list[str]:
    """The variables the launcher passes to remote ranks: -x NAME, or -genvlist A,B."""
    if launcher is OMPI:
        assert "-genvall" not in argv
        return x_names(argv)
    assert "-genvall" not in argv
    assert "-x" not in argv
    return argv[argv.index("-genvlist") + 1].split(",")


@pytest.mark.parametrize("launcher", [OMPI, MPICH], ids=["openmpi", "mpich"])
def test_ranks_get_the_launch_environment_and_forward_env_under_either_mpi(
    launcher: Launcher,
) -> None:
    given = plan(launcher, remote=REMOTE, env={"SEED": "1"}, inherited_env=LAUNCH)
    cmd = build_command(given)
    ours = sorted(cmd.env.keys() - OPENMPI_TUNING.keys() - {HYDRA_LAST})
    own_mpi = ["MPIR_CVAR_CH4_NETMOD"] if launcher is MPICH else []  # Open MPI's: by mpirun
    assert passed_names(launcher, cmd.argv) == sorted([*ours, *SYSTEM, *own_mpi])
    # forward_env adds names and prefixes of the head's environment, nothing else of it.
    more = build_command(replace(given, forward_env=("NCCL_*", "HOME", "NOT_SET")))
    assert passed_names(launcher, more.argv) == sorted(
        [*ours, *SYSTEM, *own_mpi, "HOME", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME"]
    )
    for name in ("SM_HOSTS", "SM_CHANNEL_TRAIN", "HOME", "NCCL_SOCKET_IFNAME"):
        # Values travel in the launcher's environment, never in its argv.
        assert not any(LAUNCH[name] in arg for arg in more.argv), name


def test_mpiexec_gets_a_variable_of_no_rank_last_in_its_environment() -> None:
    # Hydra's -genvlist never finds the last variable of mpiexec's environment.
    base = {"PYTHONPATH": "/site", HYDRA_LAST: "x", "SM_HOSTS": "[]", "ZED": "z"}
    cmd = build_command(plan(MPICH, env={"SEED": "1"}, inherited_env=base))
    launched = cmd.environment(base)
    assert list(launched)[-1] == HYDRA_LAST
    assert HYDRA_LAST not in passed_names(MPICH, cmd.argv)
    assert {"SEED", "SM_HOSTS", "PYTHONPATH"} <= set(passed_names(MPICH, cmd.argv))
    assert launched["PYTHONPATH"].endswith(":/site")


def test_a_job_value_wins_over_the_launch_environment() -> None:
    cmd = build_command(plan(env={"SM_HOSTS": "[]"}, inherited_env=LAUNCH))
    assert x_names(cmd.argv).count("SM_HOSTS") == 1
    assert cmd.environment(LAUNCH)["SM_HOSTS"] == "[]"


def test_user_env_is_not_mutated() -> None:
    env = {"SEED": "1"}
    build_command(plan(env=env))
    build_command(plan(MPICH, env=env))
    assert env == {"SEED": "1"}


@pytest.mark.parametrize("launcher", [OMPI, MPICH], ids=["openmpi", "mpich"])
def test_pythonpath_hook_first_keeps_inherited(launcher: Launcher) -> None:
    inherited = {"PYTHONPATH": f"/site/a{os.pathsep}/site/b"}
    cmd = build_command(plan(launcher, inherited_env=inherited))
    assert cmd.env["PYTHONPATH"] == f"{HOOK_DIR}{os.pathsep}/site/a{os.pathsep}/site/b"
    assert cmd.env["CLUSTERBOOK_RANK_HOOK"] == "1"


@pytest.mark.parametrize("launcher", [OMPI, MPICH], ids=["openmpi", "mpich"])
def test_pythonpath_user_value_wins_over_inherited(launcher: Launcher) -> None:
    cmd = build_command(
        plan(launcher, env={"PYTHONPATH": "/mine"}, inherited_env={"PYTHONPATH": "/site"})
    )
    assert cmd.env["PYTHONPATH"] == f"{HOOK_DIR}{os.pathsep}/mine"


@pytest.mark.parametrize("launcher", [OMPI, MPICH], ids=["openmpi", "mpich"])
def test_pythonpath_without_any_base_is_just_the_hook(launcher: Launcher) -> None:
    assert build_command(plan(launcher)).env["PYTHONPATH"] == HOOK_DIR
    assert build_command(plan(launcher, env={"PYTHONPATH": ""})).env["PYTHONPATH"] == HOOK_DIR


def test_hook_dir_holds_the_rank_hook() -> None:
    assert (Path(HOOK_DIR) / "sitecustomize.py").is_file()


def test_rank_hook_flag_cannot_be_turned_off_by_user_env() -> None:
    cmd = build_command(plan(env={"CLUSTERBOOK_RANK_HOOK": "0"}))
    assert cmd.env["CLUSTERBOOK_RANK_HOOK"] == "1"


def test_openmpi_tuning_applied_unless_inherited() -> None:
    assert dict(OPENMPI_TUNING) == {"OMPI_MCA_btl": "^ofi", "OMPI_MCA_mtl": "^ofi"}
    cmd = build_command(plan(inherited_env={"OMPI_MCA_btl": "tcp,self"}))
    # The inherited value stays in effect: nothing of ours overrides it.
    assert "OMPI_MCA_btl" not in cmd.env
    assert cmd.env["OMPI_MCA_mtl"] == "^ofi"
    both = {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_mtl": "cm"}
    cmd = build_command(plan(inherited_env=both))
    assert not any(name.startswith("OMPI_MCA") for name in cmd.env)


def test_nodes_that_share_a_host_name_get_no_shared_memory_transport() -> None:
    # Two sshds on one machine: two hosts, one host name. Open MPI would name both daemons'
    # shared-memory files alike.
    two = (NodeSpec("node1", "127.0.0.2", 2), NodeSpec("node2", "127.0.0.3", 2))
    same = replace(REMOTE, hostnames={"127.0.0.2": "vm", "127.0.0.3": "vm"})
    shared = plan(nodes=two, np=4, remote=same)
    assert shared_hostnames(shared) == ["vm"]
    assert build_command(shared).env["OMPI_MCA_btl"] == "^ofi,sm"
    # Only hosts that get ranks count; other machines, a local cluster and a choice made in
    # the environment or the job's env= keep the tuning or the choice.
    assert shared_hostnames(replace(shared, np=2)) == []
    apart = replace(REMOTE, hostnames={"127.0.0.2": "node1", "127.0.0.3": "node2"})
    assert build_command(replace(shared, remote=apart)).env["OMPI_MCA_btl"] == "^ofi"
    assert shared_hostnames(plan(nodes=two, np=4)) == []
    chosen = replace(shared, inherited_env={"OMPI_MCA_btl": "tcp,self"})
    assert "OMPI_MCA_btl" not in build_command(chosen).env
    job = build_command(replace(shared, env={"OMPI_MCA_btl": "self,sm,tcp"}))
    assert job.env["OMPI_MCA_btl"] == "self,sm,tcp"


@pytest.mark.parametrize(("launcher", "flag"), [(OMPI, "--bind-to"), (MPICH, "-bind-to")])
def test_hosts_that_are_one_machine_run_their_ranks_unbound(launcher: Launcher, flag: str) -> None:
    # Each host's daemon would bind its ranks from the machine's first core: the same cores
    # for every host. Hosts of their own machines bind as before.
    two = (NodeSpec("node1", "127.0.0.2", 2, cores=8), NodeSpec("node2", "127.0.0.3", 2, cores=8))
    same = replace(REMOTE, hostnames={"127.0.0.2": "vm", "127.0.0.3": "vm"})
    argv = build_command(plan(launcher, nodes=two, np=4, remote=same)).argv
    assert argv[argv.index(flag) + 1] == "none"
    apart = replace(REMOTE, hostnames={"127.0.0.2": "node1", "127.0.0.3": "node2"})
    argv = build_command(plan(launcher, nodes=two, np=4, remote=apart)).argv
    assert argv[argv.index(flag) + 1] == "core"


def test_openmpi_user_env_overrides_tuning_and_is_exported() -> None:
    cmd = build_command(plan(env={"OMPI_MCA_btl": "self,vader"}))
    assert cmd.env["OMPI_MCA_btl"] == "self,vader"
    assert cmd.env["OMPI_MCA_mtl"] == "^ofi"
    assert "OMPI_MCA_btl" in x_names(cmd.argv)
    assert "OMPI_MCA_mtl" not in x_names(cmd.argv)


@pytest.mark.parametrize("launcher", [OMPI, MPICH], ids=["openmpi", "mpich"])
def test_job_token_reaches_ranks_through_env_only(launcher: Launcher) -> None:
    assert GUARD_ENV == "CLUSTERBOOK_JOB"
    assert GUARD_ENV not in build_command(plan(launcher)).env
    tag = "5f3a9c0e71d24b88"
    cmd = build_command(plan(launcher, job_token=tag))
    assert cmd.env[GUARD_ENV] == tag
    assert not any(tag in arg for arg in cmd.argv)
    if launcher is OMPI:
        assert x_names(cmd.argv) == [
            "CLUSTERBOOK_JOB",
            "CLUSTERBOOK_MASTER_ADDR",
            "CLUSTERBOOK_MASTER_PORT",
            "CLUSTERBOOK_RANK_HOOK",
            "CLUSTERBOOK_RANK_NODES",
            "PYTHONPATH",
        ]


# -- MPICH ---------------------------------------------------------------------------------


def test_mpich_minimal_golden() -> None:
    cmd = build_command(plan(MPICH))
    assert cmd.argv == [
        "/opt/mpich/bin/mpiexec",
        "-f",
        HOSTFILE,
        "-n",
        "2",
        "-bind-to",
        "core",
        "-outfile-pattern",
        "/tmp/cb/job-1/rank-%r.stdout",
        "-errfile-pattern",
        "/tmp/cb/job-1/rank-%r.stderr",
        "-genvlist",
        ",".join(sorted(cmd.env.keys() - {HYDRA_LAST})),
        *wrap_argv(list(PROGRAM)),
    ]
    assert cmd.env == {
        "PYTHONPATH": HOOK_DIR,
        "CLUSTERBOOK_RANK_HOOK": "1",
        **TORCH_LOCAL,
        HYDRA_LAST: "",
    }
    assert cmd.hostfile_text == "localhost:4\n"


def test_mpich_everything_on_golden() -> None:
    nodes = (NodeSpec("a", "node1", 1, cores=4), NodeSpec("b", "node2", 3, cores=4))
    cmd = build_command(
        plan(
            MPICH,
            nodes=nodes,
            np=4,
            env={"SEED": NASTY},
            as_root=True,
            oversubscribe=True,
            remote=REMOTE,
            output_dir="/var/tmp/out dir",
            launcher_args=("-verbose",),
        )
    )
    # No Open MPI flags: Hydra needs none of them.
    assert cmd.argv == [
        "/opt/mpich/bin/mpiexec",
        "-f",
        HOSTFILE,
        "-n",
        "4",
        "-bind-to",
        "core",
        "-launcher",
        "ssh",
        "-launcher-exec",
        "/home/me/.clusterbook/clusters/c1/ssh",
        "-localhost",
        "10.0.0.1",
        "-outfile-pattern",
        "/var/tmp/out dir/rank-%r.stdout",
        "-errfile-pattern",
        "/var/tmp/out dir/rank-%r.stderr",
        "-genvlist",
        "CLUSTERBOOK_MASTER_ADDR,CLUSTERBOOK_MASTER_PORT,CLUSTERBOOK_RANK_HOOK,"
        "CLUSTERBOOK_RANK_NODES,PYTHONPATH,SEED",
        "-verbose",
        *wrap_argv(list(PROGRAM)),
    ]
    assert cmd.env == {
        "SEED": NASTY,
        "PYTHONPATH": HOOK_DIR,
        "CLUSTERBOOK_RANK_HOOK": "1",
        "CLUSTERBOOK_RANK_NODES": "0 1 1 1",
        "CLUSTERBOOK_MASTER_ADDR": "node1",
        "CLUSTERBOOK_MASTER_PORT": "29500",
        HYDRA_LAST: "",
    }
    assert not any(NASTY in arg or "second line" in arg for arg in cmd.argv)
    assert cmd.hostfile_text == "node1:1\nnode2:3\n"


def test_mpich_no_openmpi_tuning_in_env() -> None:
    cmd = build_command(plan(MPICH, inherited_env={}))
    assert not any(name.startswith("OMPI_") for name in cmd.env)
    assert "-x" not in cmd.argv


def test_mpich_bind_none_when_too_few_cores() -> None:
    nodes = (NodeSpec("a", "node1", 4, cores=2),)
    argv = build_command(plan(MPICH, nodes=nodes, np=4)).argv
    assert argv[argv.index("-bind-to") + 1] == "none"


def test_mpich_a_binding_in_launcher_args_replaces_clusterbooks() -> None:
    argv = build_command(plan(MPICH, launcher_args=("-bind-to", "hwthread"))).argv
    assert argv.count("-bind-to") == 1
    assert argv[argv.index("-bind-to") + 1] == "hwthread"


# -- hostfile, placement, binding ----------------------------------------------------------


def test_render_hostfile_formats() -> None:
    nodes = (
        NodeSpec("n1", "node1", 4),
        NodeSpec("n2", "10.0.0.5", 2),
        NodeSpec("n3", "node1", 3),
        NodeSpec("n4", "my-host_2.example.com", 1),
    )
    assert render_hostfile(nodes, MPIFlavour.OPENMPI) == (
        "node1 slots=7\n10.0.0.5 slots=2\nmy-host_2.example.com slots=1\n"
    )
    assert render_hostfile(nodes, MPIFlavour.MPICH) == (
        "node1:7\n10.0.0.5:2\nmy-host_2.example.com:1\n"
    )


def test_render_hostfile_keeps_first_appearance_order() -> None:
    nodes = (NodeSpec("z", "zeta", 1), NodeSpec("a", "alpha", 1), NodeSpec("z2", "zeta", 1))
    assert render_hostfile(nodes, MPIFlavour.OPENMPI) == "zeta slots=2\nalpha slots=1\n"


@pytest.mark.parametrize(
    ("slots", "np", "expected"),
    [
        ((2, 1), 3, [0, 0, 1]),
        ((2, 1), 5, [0, 0, 1, 0, 0]),
        ((2, 1), 1, [0]),
        ((1, 1, 1), 7, [0, 1, 2, 0, 1, 2, 0]),
        ((3,), 4, [0, 0, 0, 0]),
        ((1, 3), 4, [0, 1, 1, 1]),
    ],
)
def test_placement_fills_then_wraps(slots: tuple[int, ...], np: int, expected: list[int]) -> None:
    nodes = tuple(NodeSpec(f"n{i}", f"node{i}", s) for i, s in enumerate(slots))
    assert placement(nodes, np) == expected


def test_binding_core_only_when_every_host_has_a_core_per_rank() -> None:
    two = (NodeSpec("a", "a", 2, cores=2), NodeSpec("b", "b", 2, cores=3))
    assert binding(two, 4) == "core"
    assert binding(two, 5) == "none"  # the 5th rank wraps to a: 3 ranks on 2 cores
    three = (NodeSpec("a", "a", 2, cores=3), NodeSpec("b", "b", 2, cores=2))
    assert binding(three, 5) == "core"
    assert binding(three, 6) == "none"


def test_binding_counts_ranks_per_host_across_nodes_on_same_host() -> None:
    # Two nodes on one host with 4 cores: 3 + 3 ranks do not fit, 2 + 2 do.
    same = (NodeSpec("a", "box", 3, cores=4), NodeSpec("b", "box", 3, cores=4))
    assert binding(same, 4) == "core"  # placement 0,0,0,1 -> 4 ranks on box
    assert binding(same, 5) == "none"
    apart = (NodeSpec("a", "box1", 3, cores=4), NodeSpec("b", "box2", 3, cores=4))
    assert binding(apart, 6) == "core"


def test_binding_unknown_cores_is_none() -> None:
    nodes = (NodeSpec("a", "a", 1, cores=64), NodeSpec("b", "b", 1, cores=None))
    assert binding(nodes, 2) == "none"
    known = (NodeSpec("a", "a", 1, cores=64), NodeSpec("b", "b", 1, cores=1))
    assert binding(known, 2) == "core"


def test_openmpi_starts_every_daemon_from_the_head_when_nodes_hold_no_key() -> None:
    with_tree = build_command(plan(remote=REMOTE)).argv
    assert "plm_ssh_no_tree_spawn" not in with_tree
    argv = build_command(plan(remote=replace(REMOTE, tree_spawn=False))).argv
    at = argv.index("plm_ssh_no_tree_spawn")
    assert argv[at - 1 : at + 2] == ["--prtemca", "plm_ssh_no_tree_spawn", "1"]
    assert argv.index("plm_ssh_args") < at < argv.index("-x")


def test_warm_launches_start_the_daemons_through_the_launch_agent_from_the_head() -> None:
    agent = "/home/me/.clusterbook/clusters/c1/launch-agent"
    warm = replace(REMOTE, launch_agent=agent)
    argv = build_command(plan(remote=warm)).argv
    at = argv.index("plm_ssh_agent")
    assert argv[at - 1 : at + 2] == ["--prtemca", "plm_ssh_agent", agent]
    # The agent on a node cannot start the next node's daemon: the head starts them all.
    at = argv.index("plm_ssh_no_tree_spawn")
    assert argv[at - 1 : at + 2] == ["--prtemca", "plm_ssh_no_tree_spawn", "1"]
    assert "plm_ssh_agent" not in build_command(plan(remote=REMOTE)).argv
    mpich = build_command(plan(MPICH, remote=warm)).argv
    assert mpich[mpich.index("-launcher-exec") + 1] == agent
    cold = build_command(plan(MPICH, remote=REMOTE)).argv
    assert cold[cold.index("-launcher-exec") + 1] == REMOTE.ssh_wrapper


def test_jobs_that_handle_errors_themselves_keep_the_stacks_but_not_the_abort() -> None:
    assert rank_env(plan())["CLUSTERBOOK_RANK_HOOK"] == "1"
    assert rank_env(plan(abort_on_error=False))["CLUSTERBOOK_RANK_HOOK"] == "stacks"


def gpus(*indices: int) -> GPUInfo:
    return GPUInfo(tuple(GPU(i, "NVIDIA A100-SXM4-40GB") for i in indices))


GPU_NODES = (
    NodeSpec("local-0", "localhost", 2, gpus=gpus(0, 1)),
    NodeSpec("n1", "10.0.0.2", 2),
    NodeSpec("local-1", "localhost", 2, gpus=gpus(2, 3)),
    NodeSpec("n2", "10.0.0.3", 4, gpus=gpus(0, 1, 2, 3)),
    NodeSpec("n2-again", "10.0.0.3", 4, gpus=gpus(0, 1, 2, 3)),  # a 2nd agent, same machine
)


def test_each_hosts_gpus_go_to_the_ranks_with_the_host_index() -> None:
    assert host_gpus(GPU_NODES) == [("0", "1", "2", "3"), (), ("0", "1", "2", "3")]
    env = rank_env(plan(nodes=GPU_NODES, np=6))
    assert env["CLUSTERBOOK_GPUS"] == "0,1,2,3 - 0,1,2,3"
    assert env["CLUSTERBOOK_RANK_NODES"] == "0 0 0 0 1 1"  # indices into the same hosts
    assert "CLUSTERBOOK_USER_SET" not in env


def test_no_gpu_variable_without_gpus_or_when_the_job_chose_them() -> None:
    assert "CLUSTERBOOK_GPUS" not in rank_env(plan())  # no node has a GPU
    chosen = rank_env(plan(nodes=GPU_NODES, env={"CUDA_VISIBLE_DEVICES": "1"}))
    assert "CLUSTERBOOK_GPUS" not in chosen
    assert chosen["CUDA_VISIBLE_DEVICES"] == "1"
    assert chosen["CLUSTERBOOK_USER_SET"] == "CUDA_VISIBLE_DEVICES"
    ordered = rank_env(plan(nodes=GPU_NODES, env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}))
    assert ordered["CLUSTERBOOK_GPUS"] == "0,1,2,3 - 0,1,2,3"
    assert ordered["CLUSTERBOOK_USER_SET"] == "CUDA_DEVICE_ORDER"
    # Open MPI exports it by name, as every other variable of the ranks.
    assert "CLUSTERBOOK_GPUS" in x_names(build_command(plan(nodes=GPU_NODES)).argv)


def test_hosts_of_one_machine_on_the_same_cpus_run_unbound_and_yield() -> None:
    # Two network namespaces of one 2-core machine: each host's daemon alone would bind its
    # 2 ranks to cores 0 and 1, and count them free.
    box = (
        NodeSpec("node1", "10.0.0.11", 2, cores=2, place="b00t-1d/0-1"),
        NodeSpec("node2", "10.0.0.12", 2, cores=2, place="b00t-1d/0-1"),
    )
    assert binding(box, 4) == "none"
    cmd = build_command(plan(nodes=box, np=4, remote=REMOTE))
    assert cmd.argv[cmd.argv.index("--bind-to") + 1] == "none"
    assert cmd.env[YIELD] == "1"
    assert "-bind-to" in (mpich := build_command(plan(MPICH, nodes=box, np=4, remote=REMOTE)).argv)
    assert mpich[mpich.index("-bind-to") + 1] == "none"
    # A rank on each: a core each, and waiting ranks poll (unbound still: the hosts' CPUs
    # overlap, and each daemon would bind its rank to core 0).
    one = tuple(replace(n, slots=1) for n in box)
    assert YIELD not in build_command(plan(nodes=one, np=2, remote=REMOTE)).env
    assert binding(one, 2) == "none"
    # CPUs of their own on one machine (containers with cpusets): bound, polling.
    own = (replace(box[0], place="b00t-1d/0-1"), replace(box[1], place="b00t-1d/2-3"))
    assert binding(own, 4) == "core"
    assert YIELD not in build_command(plan(nodes=own, np=4, remote=REMOTE)).env


def test_ranks_yield_wherever_a_machine_has_more_of_them_than_cores() -> None:
    crowded = plan(nodes=(NodeSpec("local-0", "localhost", 4, cores=2),), np=4)
    assert build_command(crowded).env[YIELD] == "1"
    assert YIELD not in build_command(replace(crowded, np=2)).env
    # The job's own choice, or the head's environment's, stands.
    job = build_command(replace(crowded, env={YIELD: "0"}))
    assert job.env[YIELD] == "0"
    assert YIELD not in build_command(replace(crowded, inherited_env={YIELD: "0"})).env
