"""The arguments of ``%cluster`` and ``%%mpirun``, parsed: what each asks for, a usage
message naming what is wrong, or the help text (the magics themselves: test_magics*.py)."""

from __future__ import annotations

import pytest

from clusterbook_widgets.arguments import (
    ArgsError,
    HelpRequested,
    MpirunArgs,
    parse_cluster_args,
    parse_mpirun_args,
)

# -- %%mpirun ---------------------------------------------------------------------------------


def test_mpirun_args_parsed() -> None:
    args = parse_mpirun_args("-n 2 --timeout 1.5 --push a,b --push c,a --pull y --oversubscribe")
    assert args == MpirunArgs(np=2, timeout=1.5, push=("a", "b", "c"), pull="y", oversubscribe=True)
    assert parse_mpirun_args("") == MpirunArgs()
    args = parse_mpirun_args("--retries 3 --backoff 5 --retry-on failure,timeout --deadline 2h")
    assert (args.retries, args.backoff, args.retry_on, args.deadline) == (
        3,
        "5",
        ("failure", "timeout"),
        "2h",
    )
    assert parse_mpirun_args("--clean none").clean == "none"
    assert parse_mpirun_args("").clean == "all"
    assert parse_mpirun_args("--no-raise").no_raise
    assert not parse_mpirun_args("").no_raise


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("-n 0", "-n must be >= 1, got 0"),
        ("-n x", "-n must be a whole number >= 1, got 'x'"),
        ("-n -3", "-n must be >= 1, got -3"),
        ("-n", "expected one argument"),
        ("--pull 1bad", "'1bad' is not a Python variable name"),
        ("--pull class", "'class' is not a Python variable name"),
        ("--push a,,b", "'' is not a Python variable name"),
        ("--timeout 0", "timeout must be a duration > 0, got '0'"),
        ("--timeout nan", "timeout must be a duration > 0, got 'nan'"),
        ("--frob", "unrecognized arguments: --frob"),
        ("--time 3", "unrecognized arguments: --time 3"),  # no abbreviations
        ("-n '2", "No closing quotation"),
        ("--retries -1", "--retries must be >= 0, got -1"),
        ("--retries x", "--retries must be a whole number >= 0, got 'x'"),
        ("--clean some", "invalid choice: 'some' (choose from 'all', 'running', 'none')"),
    ],
)
def test_bad_mpirun_args_say_what_and_how(line: str, said: str) -> None:
    with pytest.raises(ArgsError) as info:
        parse_mpirun_args(line)
    assert info.value.message.startswith("%%mpirun: ")
    assert said in info.value.message
    assert info.value.usage.startswith("usage: %%mpirun [-h] [-n N] [--timeout D]")


def test_mpirun_help_is_text_not_an_exit() -> None:
    with pytest.raises(HelpRequested) as info:
        parse_mpirun_args("--help")
    assert "--pull NAME" in info.value.text
    assert "usage: %%mpirun" in info.value.text


# -- %cluster ---------------------------------------------------------------------------------


def test_cluster_args_parsed() -> None:
    local = parse_cluster_args("local --workers 3 --slots 2")
    assert (local.command, local.workers, local.slots) == ("local", 3, 2)
    assert parse_cluster_args("local").workers == 1
    assert parse_cluster_args("local --slots gpus").slots == "gpus"  # one slot per GPU
    ssh = parse_cluster_args(
        "ssh node1:4 10.0.0.2 --user me --identity '~/my key' --port 2222 --accept-new-host-keys"
    )
    assert ssh.hosts == ["node1:4", "10.0.0.2"]
    assert (ssh.user, ssh.identity, ssh.port) == ("me", "~/my key", 2222)
    assert ssh.accept_new_host_keys is True
    assert parse_cluster_args("ssh h").accept_new_host_keys is False
    assert parse_cluster_args("status").command == "status"
    assert parse_cluster_args("stop").command == "stop"


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("", "required"),
        ("start", "invalid choice: 'start'"),
        ("local --workers 0", "--workers must be >= 1"),
        ("local --slots two", "--slots must be a whole number >= 1 or 'gpus'"),
        ("ssh", "required: HOST[:SLOTS]"),
        ("ssh h --port 0", "--port must be >= 1"),
    ],
)
def test_bad_cluster_args(line: str, said: str) -> None:
    with pytest.raises(ArgsError) as info:
        parse_cluster_args(line)
    assert said in info.value.message
    assert "usage: %cluster" in info.value.usage


def test_env_args() -> None:
    args = parse_cluster_args("env")
    assert (args.command, args.kind, args.slots, args.port) == ("env", None, None, None)
    args = parse_cluster_args("env slurm --slots 2 --user me --port 2222 --accept-new-host-keys")
    assert (args.kind, args.slots, args.user, args.port) == ("slurm", 2, "me", 2222)
    assert args.accept_new_host_keys
    with pytest.raises(ArgsError, match="invalid choice: 'lsf'"):
        parse_cluster_args("env lsf")
    assert parse_cluster_args("env --via ssh").via == "ssh"
    with pytest.raises(ArgsError, match="invalid choice: 'mpirun'"):
        parse_cluster_args("env --via mpirun")


def test_cluster_slurm_args_parsed() -> None:
    args = parse_cluster_args(
        "slurm --nodes 3 --slots 4 --partition gpu --time 30m --account proj --min-nodes 2"
    )
    assert (args.command, args.nodes, args.slots, args.min_nodes) == ("slurm", 3, 4, 2)
    assert (args.partition, args.time, args.account) == ("gpu", "30m", "proj")
    default = parse_cluster_args("slurm")
    assert (default.nodes, default.slots, default.time, default.partition) == (
        2,
        None,
        "1:00:00",
        None,
    )


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("slurm --nodes 0", "--nodes must be >= 1, got 0"),
        ("slurm --slots gpus", "--slots must be a whole number >= 1, got 'gpus'"),
        ("slurm --nodes", "expected one argument"),
    ],
)
def test_bad_cluster_slurm_args_say_why(line: str, said: str) -> None:
    with pytest.raises(ArgsError) as err:
        parse_cluster_args(line)
    assert said in err.value.message
