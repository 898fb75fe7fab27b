"""Pager controls for a long table: previous and next buttons and where the page is.

A table of 1,024 nodes laid out at once blocks the browser; the cluster widget shows a page of
rows (:data:`clusterbook.views.html.PAGE`) and one of these above it. The pager only keeps the
page number and calls back when it turns: the table is rendered by the caller, from
:func:`clusterbook.views.html.page_of`.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets

from clusterbook.views.html import page_of

__all__ = ["Pager"]


class Pager(widgets.HBox):
    """Previous/next over ``per_page`` rows a page; ``turned()`` is called when the page
    changes (on the kernel's thread that handles the click). Hidden while one page holds every
    row."""

    def __init__(self, per_page: int, turned: Callable[[], None]) -> None:
        self.per_page = per_page
        self.page = 0
        self.total = 0
        self._turned = turned
        self.previous_button = widgets.Button(icon="chevron-left", tooltip="Previous page")
        self.next_button = widgets.Button(icon="chevron-right", tooltip="Next page")
        for button in (self.previous_button, self.next_button):
            button.layout.width = "32px"
        self.label = widgets.HTML()
        self.previous_button.on_click(lambda _: self.turn(-1))
        self.next_button.on_click(lambda _: self.turn(+1))
        super().__init__([self.previous_button, self.label, self.next_button])
        self.layout.display = "none"

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))

    def rows(self, total: int) -> tuple[int, int]:
        """The rows ``[start, end)`` of the page shown, of ``total`` rows now (the page is
        brought within the pages there are); the controls say so."""
        self.total = total
        start, end, self.page = page_of(total, self.page, self.per_page)
        self.layout.display = None if self.pages > 1 else "none"
        self.previous_button.disabled = self.page == 0
        self.next_button.disabled = self.page >= self.pages - 1
        self.label.value = f"page {self.page + 1} of {self.pages}"
        return start, end

    def turn(self, by: int) -> None:
        """Go ``by`` pages on (back, when negative), within the pages there are."""
        page = min(max(0, self.page + by), self.pages - 1)
        if page != self.page:
            self.page = page
            self._turned()

    def close(self) -> None:
        for part in (self.previous_button, self.next_button, self.label):
            part.close()
        super().close()
