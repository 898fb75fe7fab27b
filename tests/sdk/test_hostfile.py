"""Hostfiles of both MPI flavours: one node per distinct host, slots added up, bad lines named
with the file, their number and the forms a line may take; ``Cluster.from_hostfile``."""

from __future__ import annotations

from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.spec import parse_hostfile, read_hostfile


def test_open_mpi_and_mpich_lines_comments_and_blank_lines() -> None:
    text = (
        "# Open MPI\n"
        "node1 slots=4\n"
        "node2 slots=2 max_slots=8   # a comment after the line\n"
        "node3 max_slots=3\n"
        "\n"
        "   \n"
        "# MPICH\n"
        "node4:2\n"
        "node5\n"
    )
    assert parse_hostfile(text) == ["node1:4", "node2:2", "node3:3", "node4:2", "node5"]


def test_a_host_listed_again_adds_its_slots_in_the_order_hosts_first_appear() -> None:
    # A PBS nodefile, or an Open MPI hostfile that lists a host once per slot.
    assert parse_hostfile("b\na\nb\nb\n") == ["b:3", "a"]
    assert parse_hostfile("n1 slots=2\nn2:1\nn1:3\n") == ["n1:5", "n2:1"]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("node2 cpus=2", "is not 'HOST', 'HOST slots=N' (Open MPI) or 'HOST:N' (MPICH)"),
        ("node2 slots=x", "is not 'HOST'"),
        ("node2:4 slots=2", "is not 'HOST'"),
        ("node2 slots=0", "slots must be >= 1, got 0"),
        ("node2:zero", "is not a number"),
        ("-oProxyCommand=x slots=1", "starts with '-'"),
    ],
)
def test_a_bad_line_is_named_with_the_file_its_number_and_the_fix(
    tmp_path: Path, line: str, says: str
) -> None:
    path = tmp_path / "hosts"
    path.write_text(f"# mine\nnode1 slots=2\n{line}\n")
    with pytest.raises(cb.ConfigError) as excinfo:
        read_hostfile(path)
    message = str(excinfo.value)
    assert f"hostfile {str(path)!r} line 3: {line!r}" in message
    assert says in message
    assert "like 'node1 slots=4'" in message  # the fix


def test_an_empty_or_missing_hostfile_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("# nothing\n\n")
    with pytest.raises(cb.ConfigError, match="lists no host; write one per line"):
        read_hostfile(tmp_path / "empty")
    with pytest.raises(cb.ConfigError, match=r"Cannot read the hostfile .*No such file"):
        read_hostfile(tmp_path / "absent")


def test_gpus_slots_cannot_be_added_up() -> None:
    with pytest.raises(cb.ConfigError, match="lists host 'n1' 2 times, once with slots=gpus"):
        parse_hostfile("n1 slots=gpus\nn1 slots=2\n")


def test_from_hostfile_makes_an_ssh_cluster_of_its_hosts(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("node1 slots=2\nnode2:3\nnode1\n")
    cluster = cb.Cluster.from_hostfile(path, user="me", name="hf")
    assert cluster.kind == "ssh"
    assert [(n.host, n.slots) for n in cluster.nodes] == [("node1", 3), ("node2", 3)]
    assert cluster.total_slots == 6
