"""Progress bars for the calls that can block for more than a second: ``start()``,
``wait_ready()``, ``put()``, ``gather()``, ``engines()``.

A bar is shown where someone watches: in a terminal (standard error is one, and the bar is
tqdm's) or a notebook (the Jupyter layer says so, and makes the bar: the ``progress`` entry
point, :func:`clusterbook.jupyter.notebook_bars`), once the call took over a second; nothing
is drawn otherwise (a script writing to a file, CI, a quick call). ``progress=True`` (at once)
or ``False`` on a call decides instead. Bars are updated from any thread.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from clusterbook.errors import ConfigError
from clusterbook.jupyter import notebook_bars

__all__ = ["DELAY", "Bar", "NodeWatch", "NotebookBars", "bar", "checked", "wanted"]

DELAY = 1.0
"""Seconds a call runs before its automatic bar is drawn."""

Maker = Callable[[dict[str, Any]], Any]
"""Makes a tqdm-like bar from tqdm's options."""
NotebookBars = Callable[[], Maker | None]
"""Asks the Jupyter layer for its bars: a :data:`Maker` while a notebook watches, else None."""


def checked(progress: object) -> bool | None:
    """``progress`` if it is True, False or None (automatic); else a ConfigError naming it."""
    if progress is not None and not isinstance(progress, bool):
        raise ConfigError(f"progress must be True, False or None (automatic), got {progress!r}.")
    return progress


def wanted(progress: object, notebook: NotebookBars = notebook_bars) -> bool:
    """Whether to show a bar: ``progress`` if it is True or False, else where someone watches
    (a notebook, as ``notebook`` says, or a terminal on standard error)."""
    if checked(progress) is not None:
        assert isinstance(progress, bool)
        return progress
    return notebook() is not None or _terminal()


def _terminal() -> bool:
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


class Bar:
    """One bar: :meth:`update` sets how far it got (and what it does now), :meth:`add` counts
    on; use it in ``with``. It is drawn ``delay`` seconds after it was made (a call quicker
    than that draws nothing), from what it was told so far; a bar nobody watches
    (``make`` None) does nothing."""

    def __init__(self, make: Callable[[], Any] | None, delay: float = 0.0) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._bar: Any | None = None
        self._done: float = 0
        self._what: str | None = None
        self._total: float | None = None
        self._closed = make is None
        self._timer: threading.Timer | None = None
        if make is not None and delay > 0:
            self._timer = threading.Timer(delay, self._draw)
            self._timer.daemon = True
            self._timer.start()
        elif make is not None:
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            if self._closed or self._bar is not None or self._make is None:
                return
            self._bar = self._make()
            self._show()

    def _show(self) -> None:
        drawn = self._bar
        if drawn is None:
            return
        if self._total is not None:
            drawn.total = self._total
        if self._what is not None:
            drawn.set_description_str(self._what, refresh=False)
        drawn.n = self._done
        drawn.refresh()

    def update(self, done: float, what: str | None = None, total: float | None = None) -> None:
        with self._lock:
            self._done = done
            self._what = self._what if what is None else what
            self._total = self._total if total is None else total
            self._show()

    def add(self, amount: float) -> None:
        with self._lock:
            self._done += amount
            if self._bar is not None:
                self._bar.update(amount)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                if not self._done:
                    self._bar.leave = False  # nothing moved: nothing to keep on the screen
                self._bar.close()
                self._bar = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def bar(
    progress: object,
    what: str,
    total: float | None = None,
    unit: str = "",
    leave: bool = False,
    *,
    notebook: NotebookBars = notebook_bars,
) -> Bar:
    r"""A bar of ``total`` steps (None: unknown) described by ``what``, or one that does
    nothing when :func:`wanted` says no. Asked for (``progress=True``), it is drawn at once;
    else after :data:`DELAY` seconds, so that a quick call draws nothing. A bar that
    ``leave``\ s stays with its last figures once closed (transfers: what was moved); others
    are wiped. While a notebook watches, the bar is the Jupyter layer's (``notebook``);
    elsewhere, tqdm's on standard error."""
    in_notebook = None if checked(progress) is False else notebook()  # asked once
    if not wanted(progress, lambda: in_notebook):
        return Bar(None)
    options: dict[str, Any] = {"desc": what, "total": total, "leave": leave}
    if unit == "B":
        options |= {"unit": "B", "unit_scale": True, "unit_divisor": 1024}
    elif unit:
        options["unit"] = unit
    make: Maker = in_notebook or _terminal_bar
    return Bar(lambda: make(options), 0.0 if progress is True else DELAY)


def _terminal_bar(options: dict[str, Any]) -> Any:
    from tqdm import tqdm

    return tqdm(**options)


class NodeWatch:
    """The bar of a ``start()`` or ``wait_ready()`` while it runs, fed by the cluster's
    changes (:meth:`changed`) with the count of nodes up."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count
        self._bar: Bar | None = None

    @contextlib.contextmanager
    def showing(self, shown: Bar) -> Iterator[Bar]:
        self._bar = shown
        shown.update(self._count())
        try:
            yield shown
        finally:
            self._bar = None
            shown.close()

    def changed(self, what: str | None = None) -> None:
        if (shown := self._bar) is not None:
            shown.update(self._count(), what)
