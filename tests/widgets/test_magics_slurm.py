"""``%cluster slurm``: its arguments (the magic on a real Slurm is in
tests/integration/test_slurm.py)."""

from __future__ import annotations

import pytest

from clusterbook_widgets.mpirun_cell import ArgsError, parse_cluster_args


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
