"""A call pickled for the ranks (``clusterbook.functions.payload``): what travels by value, what
cannot travel and how it is named, and the signature on a rank's value."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from clusterbook.errors import SerializationError
from clusterbook.functions import payload


def test_lambdas_and_closures_come_back_whole() -> None:
    base = 10
    fn, args, kwargs = payload.loads(
        payload.envelope(payload.dumps(lambda x, y=0: x + y + base, (1,), {"y": 2}), b"k")
    )
    assert (args, kwargs) == ((1,), {"y": 2})
    assert fn(*args, **kwargs) == 13


def test_what_cannot_be_pickled_is_named() -> None:
    lock = threading.Lock()

    def holds_a_lock() -> None:
        lock.acquire()

    with pytest.raises(SerializationError, match=r"the function .*holds_a_lock cannot be pickled"):
        payload.dumps(holds_a_lock)
    with pytest.raises(SerializationError, match=r"argument 2 \(lock\) cannot be pickled"):
        payload.dumps(print, (1, "two", lock))
    with pytest.raises(SerializationError, match=r"keyword argument guard= \(lock\)"):
        payload.dumps(print, (), {"guard": lock})
    with pytest.raises(SerializationError, match=r"must be a function .* not a str"):
        payload.dumps("train.py")  # type: ignore[arg-type]


def test_a_value_is_read_only_when_its_rank_signed_it_with_the_key() -> None:
    content = payload.signed(b"key", 3, b"pickle")
    assert payload.verified(b"key", 3, content) == b"pickle"
    assert payload.verified(b"other key", 3, content) is None
    assert payload.verified(b"key", 2, content) is None  # another rank's
    assert payload.verified(b"key", 3, content[:-1] + b"!") is None
    assert payload.verified(b"key", 3, b"pickle") is None


def test_a_call_from_another_python_version_is_refused_by_name() -> None:
    import marshal

    other = marshal.dumps(((2, 7), b"k", True, payload.dumps(print)))
    with pytest.raises(SerializationError, match=r"pickled by Python 2\.7"):
        payload.loads(other)


def _uses_a_global() -> int:
    return len(SerializationError.__name__)


def test_a_function_of_plain_code_goes_in_marshals_format() -> None:
    def plain(x: int, *, y: int = 1) -> int:
        return abs(x) + y

    call = payload.dumps(plain, (-3,), {"y": 2})
    assert call.startswith(payload.CODE)
    fn, args, kwargs = payload.loads(payload.envelope(call, b"k"))
    assert (fn(*args, **kwargs), fn.__qualname__, fn.__module__) == (
        5,
        plain.__qualname__,
        __name__,
    )
    assert fn.__code__.co_filename == "<dynamic-code>"  # as cloudpickle names it


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (_uses_a_global, ()),  # a global other than a builtin
        ((lambda n: lambda: n)(1), ()),  # a closure
        (abs, (1,)),  # not a Python function
        (lambda x: x, (Path("/x"),)),  # an argument marshal does not take
        (lambda x: x, (True.__class__.__mro__,)),  # types: not plain data
    ],
)
def test_what_is_not_plain_goes_by_cloudpickle(fn, args) -> None:
    call = payload.dumps(fn, args)
    assert not call.startswith(payload.CODE)
    loaded, again, _ = payload.loads(payload.envelope(call, b"k"))
    assert loaded(*again) == fn(*args)
