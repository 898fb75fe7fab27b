"""Progress bars in a notebook: tqdm's widget, in an output that is emptied (or left with the
bar's last line) once the bar closes, so that a saved notebook keeps no bar frozen mid-way.

The core draws its bars through :mod:`clusterbook.views.progress`, which asks
:func:`notebook_bars` (the ``progress`` entry point) for a maker of bars; it gets one only
while a notebook watches (:func:`clusterbook_widgets.notebook.watching`). ipywidgets,
IPython's display and ``tqdm.notebook`` are imported when a bar is made, never before.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from clusterbook_widgets.notebook import watching

__all__ = ["NotebookBar", "notebook_bars"]


def notebook_bars() -> Callable[[dict[str, Any]], Any] | None:
    """How to make a bar while a notebook watches this process (tqdm's options in): a
    :class:`NotebookBar`, or tqdm's text bar where ipywidgets is missing (the notebook shows
    standard error); None when no notebook watches."""
    if not watching():
        return None
    if importlib.util.find_spec("ipywidgets") is None:
        return _text_bar
    return NotebookBar


def _text_bar(options: dict[str, Any]) -> Any:
    from tqdm import tqdm

    return tqdm(**options)


class NotebookBar:
    """tqdm's notebook widget, shown in an output it can replace: once closed, that output
    holds the bar's last line as text (``leave``) or nothing. A saved notebook then shows no
    bar frozen at the moment it was drawn.

    It has what :class:`clusterbook.views.progress.Bar` uses of a tqdm bar: ``total``, ``n``,
    ``leave``, ``set_description_str``, ``refresh``, ``update`` and ``close``.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        from IPython import display
        from tqdm.notebook import tqdm

        self.leave = bool(options.get("leave"))
        self._bar: Any = tqdm(display=False, **options)
        show: Any = display.display
        self._shown = show(self._bar.container, display_id=True)

    @property
    def total(self) -> float | None:
        total: float | None = self._bar.total
        return total

    @total.setter
    def total(self, value: float | None) -> None:
        if value != self._bar.total and value:
            self._bar.reset(total=value)  # the widget's own end too (tqdm.notebook's reset)

    @property
    def n(self) -> float:
        done: float = self._bar.n
        return done

    @n.setter
    def n(self, value: float) -> None:
        self._bar.n = value

    def set_description_str(self, what: str, refresh: bool = True) -> None:
        self._bar.set_description_str(what, refresh=refresh)

    def refresh(self) -> None:
        self._bar.refresh()

    def update(self, amount: float) -> None:
        self._bar.update(amount)

    def close(self) -> None:
        last = str(self._bar)
        self._bar.leave = self.leave
        self._bar.close()
        if self._shown is not None:
            # Nothing is an empty text: an output without data is a warning to nbconvert.
            self._shown.update({"text/plain": last if self.leave else ""}, raw=True)
