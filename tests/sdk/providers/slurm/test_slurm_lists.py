"""Slurm's compressed host lists and counts, expanded as ``scontrol show hostnames`` does."""

from __future__ import annotations

import pytest

from clusterbook.errors import ConfigError
from clusterbook.providers.slurm.lists import expand_counts, expand_nodelist


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("a[1-3,5],b", ["a1", "a2", "a3", "a5", "b"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("gpu-[1-2],cpu[007]", ["gpu-1", "gpu-2", "cpu007"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("snode[1-2].cluster", ["snode1.cluster", "snode2.cluster"]),
    ],
)
def test_host_lists_expand_in_order(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is empty"),
        ("a[1-", "unclosed '['"),
        ("a]1", "unbalanced brackets"),
        ("a[]", "empty '[]'"),
        ("a,,b", "empty entry"),
        ("a[x]", "[x] holds 'x', which is not a number or a range"),
        ("a[3-1]", "runs backwards"),
        ("a b", "'a b' is not part of a host name"),
    ],
)
def test_a_list_that_does_not_expand_names_the_value_and_the_form(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        expand_nodelist(text)
    assert f"SLURM_JOB_NODELIST={text!r}" in str(excinfo.value)
    assert says in str(excinfo.value)
    assert "like 'node[1-3,5],gpu1'" in str(excinfo.value)


def test_counts_per_node() -> None:
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    assert expand_counts("72(x2)") == [72, 72]
    for bad in ("", "x", "0", "2(x0)", "2(3)"):
        with pytest.raises(ConfigError, match=r"is not a list of counts like '4\(x2\),2'"):
            expand_counts(bad, "SLURM_TASKS_PER_NODE")
