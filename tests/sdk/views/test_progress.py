"""Progress bars: when one is shown, what it shows, and that the calls that block draw one."""

from __future__ import annotations

import sys
import threading
import time

import pytest

import clusterbook as cb
from clusterbook.views.progress import Bar, NodeWatch, bar, wanted


class _Counted:
    """A stand-in for a tqdm bar: what it was told."""

    def __init__(self) -> None:
        self.n: float = 0
        self.total: float | None = None
        self.what: list[str] = []
        self.closed = 0
        self.leave = True

    def update(self, amount: float) -> None:
        self.n += amount

    def set_description_str(self, what: str, refresh: bool = True) -> None:
        self.what.append(what)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


class _Tty:
    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def test_a_bar_is_shown_where_someone_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    assert wanted(True)
    assert not wanted(False)
    assert not wanted(None)  # pytest captures standard error: nobody watches it
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert wanted(None)


def test_a_notebook_counts_as_watched_as_the_jupyter_layer_says() -> None:
    # Whether a notebook watches is the Jupyter layer's answer (clusterbook_widgets.notebook):
    # a maker of bars while one does, None otherwise.
    assert wanted(None, notebook=lambda: lambda options: _Counted())
    assert not wanted(None, notebook=lambda: None)


def test_the_installed_jupyter_layer_says_no_notebook_watches_a_test() -> None:
    from clusterbook.jupyter import notebook_bars

    assert notebook_bars() is None  # pytest runs no kernel
    assert not wanted(None)


def test_a_bar_in_a_notebook_is_the_jupyter_layers_made_with_the_calls_options() -> None:
    asked: list[dict[str, object]] = []

    def make(options: dict[str, object]) -> _Counted:
        asked.append(options)
        return _Counted()

    with bar(True, "put", 10, "B", leave=True, notebook=lambda: make) as shown:
        shown.add(4)
    bytes_scaled = {"unit": "B", "unit_scale": True, "unit_divisor": 1024}
    assert asked == [{"desc": "put", "total": 10, "leave": True, **bytes_scaled}]


def test_a_bar_declined_never_asks_the_jupyter_layer() -> None:
    def asked() -> None:
        raise AssertionError("progress=False: nobody needs to know who watches")

    with bar(False, "put", 10, notebook=asked) as shown:
        shown.add(1)
    assert not wanted(False, notebook=asked)


@pytest.mark.parametrize("bad", ["yes", 1, 0, "auto"])
def test_a_bad_progress_value_is_named(bad: object) -> None:
    with pytest.raises(cb.ConfigError, match=f"progress must be True, False or None.*{bad!r}"):
        wanted(bad)


def test_a_bar_counts_from_many_threads_and_closes_once() -> None:
    counted = _Counted()
    shown = Bar(lambda: counted)

    def add() -> None:
        for _ in range(1000):
            shown.add(1)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counted.n == 4000
    shown.update(3, "three", total=5)
    assert (counted.n, counted.total, counted.what) == (3, 5, ["three"])
    with shown:
        pass
    shown.close()
    shown.add(1)  # after close: nothing, no error
    assert counted.closed == 1


def test_a_bar_is_drawn_late_from_what_it_was_told_or_never_for_a_quick_call() -> None:
    made: list[_Counted] = []

    def make() -> _Counted:
        made.append(_Counted())
        return made[-1]

    with Bar(make, delay=0.2) as quick:
        quick.update(1, "fast", total=2)
    time.sleep(0.3)
    assert made == []  # closed before its delay: never drawn

    with Bar(make, delay=0.2) as slow:
        slow.update(1, "slow", total=4)
        slow.add(2)
        deadline = time.monotonic() + 10
        while not made and time.monotonic() < deadline:
            time.sleep(0.01)
        (drawn,) = made
        assert (drawn.n, drawn.total, drawn.what) == (3, 4, ["slow"])
        slow.add(1)
        assert drawn.n == 4
    assert drawn.closed == 1


def test_a_bar_that_counted_nothing_leaves_nothing() -> None:
    made = [_Counted(), _Counted()]
    with Bar(lambda: made[0]) as empty:
        empty.update(0, "put")
    with Bar(lambda: made[1]) as moved:
        moved.add(10)
    assert [m.leave for m in made] == [False, True]


def test_a_bar_nobody_watches_draws_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with bar(None, "put", 10, "B") as shown:
        shown.add(5)
        shown.update(7, "more")
    assert capsys.readouterr().err == ""


def test_node_watch_follows_the_count_while_it_shows() -> None:
    up = [0]
    watch = NodeWatch(lambda: up[0])
    watch.changed("nobody shows it")  # no bar: nothing happens
    counted = _Counted()
    with watch.showing(Bar(lambda: counted)):
        up[0] = 2
        watch.changed("connecting")
        assert (counted.n, counted.what) == (2, ["connecting"])
    assert counted.closed == 1
    up[0] = 3
    watch.changed()
    assert counted.n == 2  # over once start() returned
