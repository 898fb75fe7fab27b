"""A rank's traceback of a function sent by value, placed back at the function's file and line
with its source, as a local traceback shows it."""

from __future__ import annotations

from clusterbook.functions.tracebacks import placed


def outer(x: int) -> int:
    def inner(y: int) -> int:
        return 1 // y

    return inner(x)


def test_frames_of_the_function_and_those_inside_it_get_their_place_and_source() -> None:
    here = placed(
        'Traceback (most recent call last):\n  File "<dynamic-code>", line '
        f"{outer.__code__.co_firstlineno + 4}, in outer\n"
        f'  File "<dynamic-code>", line {outer.__code__.co_firstlineno + 2}, in inner\n'
        "ZeroDivisionError: integer division or modulo by zero\n",
        outer,
    )
    assert f'  File "{__file__}", line {outer.__code__.co_firstlineno + 4}, in outer\n' in here
    assert "    return inner(x)\n" in here
    assert "    return 1 // y\n" in here


def test_other_frames_and_other_tracebacks_are_left_as_they_are() -> None:
    text = (
        'Traceback (most recent call last):\n  File "/site/lib.py", line 3, in helper\n'
        '  File "<dynamic-code>", line 999, in outer\nValueError: no\n'
    )
    assert placed(text, outer) == text  # line 999 is none of outer's
    assert placed(text, len) == text  # a builtin has no code to place
