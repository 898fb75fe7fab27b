"""The Jupyter layer of clusterbook (``%load_ext clusterbook`` lands here)."""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """Register clusterbook's magics with ``ipython``."""
