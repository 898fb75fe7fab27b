"""Progress bars for the calls that can block for more than a second: ``start()``,
``wait_ready()``, ``put()``, ``gather()``, ``engines()``.

A bar is shown where someone watches: in a terminal (standard error is one) or a notebook
(``tqdm.auto`` draws a widget there); nothing is printed otherwise (a script writing to a file,
CI). ``progress=True`` or ``False`` on a call decides instead. Bars are updated from any thread.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from clusterbook.errors import ConfigError

__all__ = ["Bar", "NodeWatch", "bar", "wanted"]


def wanted(progress: object) -> bool:
    """Whether to show a bar: ``progress`` if it is True or False, else where someone watches."""
    if progress is not None and not isinstance(progress, bool):
        raise ConfigError(f"progress must be True, False or None (automatic), got {progress!r}.")
    if progress is not None:
        return progress
    return _in_notebook() or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")  # never imported here: only if it runs already
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


class Bar:
    """One bar: :meth:`update` sets how far it got (and what it does now); use it in
    ``with``. A bar nobody watches does nothing."""

    def __init__(self, bar: Any | None) -> None:
        self._bar = bar
        self._lock = threading.Lock()

    def update(self, done: float, what: str | None = None, total: float | None = None) -> None:
        if self._bar is None:
            return
        with self._lock:
            if total is not None:
                self._bar.total = total
            if what is not None:
                self._bar.set_description_str(what, refresh=False)
            self._bar.n = done
            self._bar.refresh()

    def add(self, amount: float) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(amount)

    def close(self) -> None:
        if self._bar is not None:
            with self._lock:
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
    progress: object, what: str, total: float | None = None, unit: str = "", leave: bool = False
) -> Bar:
    r"""A bar of ``total`` steps (None: unknown) described by ``what``, or a bar that does
    nothing when :func:`wanted` says no (or tqdm is missing). A bar that ``leave``\ s stays
    with its last figures once closed (transfers: what was moved); others are wiped."""
    if not wanted(progress):
        return Bar(None)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with the jupyter extra
        return Bar(None)
    options: dict[str, Any] = {"desc": what, "total": total, "leave": leave}
    if unit == "B":
        options |= {"unit": "B", "unit_scale": True, "unit_divisor": 1024}
    elif unit:
        options["unit"] = unit
    return Bar(tqdm(**options))


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
