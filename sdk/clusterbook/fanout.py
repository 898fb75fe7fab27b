"""The same work for every node at once: threads, results and errors by node."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["parallel"]

T = TypeVar("T")


def parallel(
    items: Sequence[str], work: Callable[[str], T]
) -> tuple[dict[str, T], dict[str, Exception]]:
    """Run ``work(item)`` for every item in threads; return results and errors by item."""
    done: dict[str, T] = {}
    failed: dict[str, Exception] = {}
    if not items:
        return done, failed
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        futures = {item: pool.submit(work, item) for item in items}
        for item, future in futures.items():
            try:
                done[item] = future.result()
            except Exception as exc:  # gathered, re-raised as one BootstrapError
                failed[item] = exc
    return done, failed
