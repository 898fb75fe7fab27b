"""The plots of a cluster's resource history in the cluster widget.

The history changes with every report of every node (a second apart, each); the plots follow
it at most every ``interval`` seconds (a :class:`~clusterbook_widgets.throttle.Throttle`), only
after the widget was told that the cluster changed, and are redrawn only when the answer did
(a cluster whose nodes say nothing new costs nothing). They show the nodes of the page of the
nodes table and the cluster's sum (:func:`clusterbook.views.plots.render_usage`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets

from clusterbook.views.plots import render_usage
from clusterbook_widgets.throttle import Scheduler, Throttle

__all__ = ["UsagePlots"]

_log = logging.getLogger("clusterbook")
History = Callable[..., dict[str, Any]]


class UsagePlots:
    """Plots of ``history`` (a cluster's ``resource_history``; None: a cluster without one,
    and nothing is shown) over the last ``window`` seconds, ``points`` samples a plot, in
    :attr:`html`."""

    def __init__(
        self,
        history: History | None,
        *,
        window: float,
        points: int,
        interval: float,
        scheduler: Scheduler,
    ) -> None:
        self.html = widgets.HTML()
        self.html.layout.display = None if history is not None else "none"
        self._history = history
        self._window, self._points = window, points
        self._shown: tuple[tuple[str, ...], dict[str, Any]] | None = None
        self._throttle: Throttle[tuple[str, ...]] = Throttle(
            interval, self._draw, scheduler=scheduler
        )
        self.draws = 0  # redraws so far

    def changed(self, names: Sequence[str], *, now: bool = False) -> None:
        """The cluster changed, and the nodes table shows ``names``: ask again (``now``: on
        this thread, else within the interval)."""
        if self._history is None:
            return
        self._throttle.push(tuple(names))
        if now:
            self._throttle.flush()

    def _draw(self, names: tuple[str, ...]) -> None:
        assert self._history is not None
        try:
            answer = self._history(self._window, nodes=names, points=self._points)
        except Exception:  # a stopped head, say: the plots stay as they were
            _log.debug("clusterbook widget could not read the resource history", exc_info=True)
            return
        if self._shown == (names, answer):
            return  # nothing new: no redraw, nothing sent to the browser
        self._shown = (names, answer)
        self.html.value = render_usage(answer, names)
        self.draws += 1

    def close(self) -> None:
        self._throttle.close()
        self.html.close()
