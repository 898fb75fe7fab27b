"""What ``%%mpirun --pull`` takes back into the kernel: plain data only, signed by the cell's
own rank, from a directory that is this user's alone. Nothing a file says runs in this
process: the pickles below that would run code leave a mark if they ever do."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from clusterbook.errors import ClusterError
from clusterbook_widgets.pulled import check_private_dirs, load_data, read_pulled, signed

KEY = bytes(range(32))


class Runs:
    """A pickle that, loaded, calls ``call(*args)``: what a compromised node would send."""

    def __init__(self, call: object, *args: object) -> None:
        self.call, self.args = call, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.call, self.args


def leaves_a_mark(mark: Path) -> list[Runs]:
    code = f"open({str(mark)!r}, 'w').write('ran')"
    return [
        Runs(exec, code),
        Runs(eval, f"__import__('os').system('touch {mark}')"),
        Runs(os.system, f"touch {mark}"),
        Runs(getattr, [], "append"),  # a step to anything
        Runs(__import__, "subprocess"),
    ]


@pytest.fixture
def cell(tmp_path: Path) -> Path:
    """A cell's pull directory as %%mpirun makes it: cells/cell-0001/pull, all 0700."""
    pull = tmp_path / "run" / "cells" / "cell-0001" / "pull"
    pull.mkdir(parents=True, mode=0o700)
    for d in (pull, pull.parent, pull.parent.parent, tmp_path / "run"):
        d.chmod(0o700)
    return pull


def write(pull: Path, rank: int, value: object, *, key: bytes = KEY, as_rank: int | None = None):  # type: ignore[no-untyped-def]
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    (pull / f"rank-{rank}.pkl").write_bytes(signed(key, rank if as_rank is None else as_rank, data))


@pytest.mark.parametrize("protocol", [3, 4, 5])  # the ranks write 5
def test_plain_data_comes_back_as_it_was(protocol: int) -> None:
    value = {
        "n": [1, 2.5, 3 + 4j, True, None, 10**30],
        "text": ("s", b"b", bytearray(b"ba")),
        "sets": [{1, 2}, frozenset({"a"})],
        "std": [
            datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.timezone.utc),
            datetime.date(2026, 1, 1),
            datetime.timedelta(seconds=5),
            decimal.Decimal("1.10"),
            fractions.Fraction(1, 3),
            collections.OrderedDict(a=1),
            collections.Counter("aab"),
            collections.deque([1, 2], maxlen=5),
            range(3),
            slice(1, 2),
        ],
    }
    assert load_data(pickle.dumps(value, protocol=protocol)) == value
    dd = load_data(pickle.dumps(collections.defaultdict(list, a=[1]), protocol=protocol))
    assert dd == {"a": [1]}
    assert isinstance(dd, collections.defaultdict)
    assert dd.default_factory is list


@pytest.mark.parametrize("protocol", [3, 4, 5])  # the ranks write 5
def test_numpy_arrays_and_scalars_come_back(protocol: int) -> None:
    arrays = [np.arange(6).reshape(2, 3), np.array([1.5j]), np.array(["ab", "c"])]
    arrays += [np.array([1, "x", None], dtype=object), np.zeros(2, dtype=[("a", "i4")])]
    for array in arrays:
        back = load_data(pickle.dumps(array, protocol=protocol))
        assert isinstance(back, np.ndarray)
        assert back.dtype == array.dtype
        assert back.tolist() == array.tolist()
    for scalar in (np.float64(1.5), np.int8(-3), np.bool_(True)):
        assert load_data(pickle.dumps(scalar, protocol=protocol)) == scalar
    assert load_data(pickle.dumps(np.dtype("f8"), protocol=protocol)) == np.dtype("f8")


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    for runs in leaves_a_mark(mark):
        with pytest.raises(pickle.UnpicklingError, match=r"it names builtins\.|it names posix\."):
            load_data(pickle.dumps(runs))
        with pytest.raises(pickle.UnpicklingError, match="it names"):
            load_data(pickle.dumps([1, {"nested": runs}]))  # deep inside plain data too
    assert not mark.exists()


def test_objects_of_other_classes_are_refused_naming_them() -> None:
    with pytest.raises(pickle.UnpicklingError, match=r"it names pathlib\.PosixPath"):
        load_data(pickle.dumps(Path("/x")))
    with pytest.raises(pickle.UnpicklingError, match=r"it names tests\.widgets\.test_pulled\.Runs"):
        load_data(pickle.dumps(Runs))  # a class, by reference


def test_the_ranks_values_are_read_in_rank_order(cell: Path) -> None:
    for rank in range(3):
        write(cell, rank, {"rank": rank, "a": np.arange(rank)})
    values = read_pulled(cell, 3, KEY)
    assert [v["rank"] for v in values] == [0, 1, 2]  # type: ignore[index]
    assert values[2]["a"].tolist() == [0, 1]  # type: ignore[index]


def test_a_value_that_would_run_code_is_refused_naming_the_rank(cell: Path, tmp_path: Path) -> None:
    write(cell, 0, 1)
    write(cell, 1, leaves_a_mark(tmp_path / "mark")[0])  # signed: as a compromised node can
    with pytest.raises(ClusterError) as refused:
        read_pulled(cell, 2, KEY)
    said = str(refused.value)
    assert said.startswith("rank 1's value is not plain data (it names builtins.exec)")
    assert "would run code in this kernel" in said
    assert not (tmp_path / "mark").exists()


@pytest.mark.parametrize(
    ("key", "as_rank", "said"),
    [(b"x" * 32, None, "not signed with the cell's key"), (KEY, 0, "not signed")],
)
def test_a_value_not_signed_by_that_rank_of_the_cell_is_not_read(
    cell: Path, tmp_path: Path, key: bytes, as_rank: int | None, said: str
) -> None:
    write(cell, 0, 1)
    write(cell, 1, leaves_a_mark(tmp_path / "mark")[0], key=key, as_rank=as_rank)
    with pytest.raises(ClusterError, match=f"rank 1's value .* was not written by rank 1.*{said}"):
        read_pulled(cell, 2, KEY)
    (cell / "rank-1.pkl").write_bytes(pickle.dumps(Runs(exec, "open('/nonexistent/x', 'w')")))
    with pytest.raises(ClusterError, match="was not written by rank 1"):
        read_pulled(cell, 2, KEY)  # no header at all: never unpickled
    assert not (tmp_path / "mark").exists()


def test_a_missing_value_or_a_link_is_named(cell: Path, tmp_path: Path) -> None:
    write(cell, 0, 1)
    with pytest.raises(ClusterError, match=r"rank 1 left no value \(.*rank-1\.pkl is missing\)"):
        read_pulled(cell, 2, KEY)
    write(tmp_path, 1, 2)
    (cell / "rank-1.pkl").symlink_to(tmp_path / "rank-1.pkl")
    with pytest.raises(ClusterError, match="rank 1's value cannot be read"):
        read_pulled(cell, 2, KEY)


def test_a_pull_directory_open_to_others_is_not_read(cell: Path) -> None:
    write(cell, 0, 1)
    cell.chmod(0o777)
    with pytest.raises(ClusterError, match=r"pull is not this user's alone .*drwxrwxrwx"):
        read_pulled(cell, 1, KEY)
    cell.chmod(0o700)
    cell.parent.parent.chmod(0o777)  # cells/: anyone could swap the cell's directory
    with pytest.raises(ClusterError, match=r"cells cannot hold .*others may change what is in it"):
        read_pulled(cell, 1, KEY)


@pytest.mark.root
def test_a_file_or_directory_of_another_user_is_not_trusted(cell: Path, tmp_path: Path) -> None:
    write(cell, 0, 1)
    os.chown(cell / "rank-0.pkl", 20001, 20001)
    with pytest.raises(ClusterError, match=r"not a file of this user's \(uid 20001"):
        read_pulled(cell, 1, KEY)
    os.chown(cell / "rank-0.pkl", 0, 0)
    os.chown(cell.parent.parent, 20001, 20001)
    with pytest.raises(ClusterError, match=r"cells cannot hold .* belongs to uid 20001"):
        read_pulled(cell, 1, KEY)


def test_a_shared_sticky_directory_above_is_fine_but_one_anyone_may_rename_in_is_not(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    (shared / "run" / "cells").mkdir(parents=True, mode=0o700)
    (shared / "run").chmod(0o700)
    (shared / "run" / "cells").chmod(0o700)
    shared.chmod(0o1777)  # as /tmp
    check_private_dirs(shared / "run" / "cells")
    shared.chmod(0o777)
    with pytest.raises(ClusterError, match=r"shared cannot hold .*drwxrwxrwx"):
        check_private_dirs(shared / "run" / "cells")
