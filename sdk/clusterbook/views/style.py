"""The look every view shares: state colours, muted text, badges, tables, durations, and the
escaping that every piece of user data passes through.

Colours come from JupyterLab's theme variables (``--jp-*``) where there is one, so the views
read well in a dark theme too; the hex values are their fallbacks elsewhere.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence

__all__ = [
    "FAILED",
    "MUTED",
    "MUTED_COLOUR",
    "STATE_COLOURS",
    "STDERR_COLOUR",
    "badge",
    "empty",
    "escaped",
    "seconds",
    "table",
]

#: Badge colour of every node, job and cluster state.
STATE_COLOURS: dict[str, str] = {
    # nodes
    "pending": "#b7791f",
    "ready": "#2f855a",
    "joined": "#2f855a",
    "running": "#2b6cb0",
    "set-aside": "#c05621",
    "lost": "#c53030",
    "left": "#718096",
    # jobs
    "succeeded": "#2f855a",
    "failed": "#c53030",
    "timed out": "#c05621",
    "cancelled": "#718096",
    # clusters
    "created": "#718096",
    "stopping": "#b7791f",
    "stopped": "#718096",
}
_OTHER_COLOUR = "#4a5568"
STDERR_COLOUR = "#c53030"  # red reads on a light and on a dark theme alike

_TABLE = 'style="border-collapse:collapse;font-size:12px;margin:2px 0"'
_TH = (
    'style="text-align:left;padding:2px 10px 2px 0;'
    'border-bottom:1px solid var(--jp-border-color1, #cbd5e0)"'
)
_TD = 'style="padding:2px 10px 2px 0;border-bottom:1px solid var(--jp-border-color2, #edf2f7)"'
#: Text that says less: JupyterLab's secondary font colour.
MUTED_COLOUR = "var(--jp-ui-font-color2, #718096)"
#: The style attribute of muted text.
MUTED = f'style="color:{MUTED_COLOUR}"'
#: The style attribute of what failed.
FAILED = f'style="color:{STATE_COLOURS["failed"]};font-weight:bold"'


def escaped(value: object) -> str:
    """``value`` as text safe in HTML content and attribute values alike."""
    return html.escape(str(value), quote=True)


def badge(state: str) -> str:
    """``state`` on its colour (class ``cb-state cb-state-SLUG``)."""
    colour = STATE_COLOURS.get(state, _OTHER_COLOUR)
    slug = re.sub(r"[^a-z0-9]+", "-", state.lower()).strip("-") or "unknown"
    return (
        f'<span class="cb-state cb-state-{slug}" style="color:#fff;background:{colour};'
        f'padding:0 6px;border-radius:8px;white-space:nowrap">{escaped(state)}</span>'
    )


def seconds(value: float | None) -> str:
    """A duration as people read it: ``4.2 s``, ``3m 07s``, ``2h 05m``; "—" when unknown."""
    if value is None:
        return "—"
    if value < 60:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str) -> str:
    """A table of class ``cls``: ``headers`` escaped here, ``rows`` already HTML."""
    head = "".join(f"<th {_TH}>{escaped(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td {_TD}>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f'<table class="{cls}" {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )


def empty(cls: str, text: str) -> str:
    """What a view of nothing says (``No jobs yet.``), muted, of class ``cls cb-empty``."""
    return f'<div class="{cls} cb-empty" {MUTED}>{escaped(text)}</div>'
