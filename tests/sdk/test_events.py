"""Subscribers get snapshots; a failing one is logged and does not stop the others."""

from __future__ import annotations

import logging

import pytest

from clusterbook.events import Subscribers


def test_publish_reaches_every_subscriber_until_it_unsubscribes(caplog):
    subs: Subscribers[int] = Subscribers()
    got_a: list[int] = []
    got_b: list[int] = []

    def broken(value: int) -> None:
        raise RuntimeError("subscriber bug")

    stop_a = subs.subscribe(got_a.append)
    subs.subscribe(broken)
    subs.subscribe(got_b.append)
    with caplog.at_level(logging.ERROR, logger="clusterbook"):
        subs.publish(1)
    stop_a()
    stop_a()  # twice is fine
    subs.publish(2)
    assert got_a == [1]
    assert got_b == [1, 2]
    assert len(subs) == 2
    assert "subscriber failed" in caplog.text


def test_subscribe_needs_a_callable():
    with pytest.raises(TypeError, match="callable"):
        Subscribers().subscribe(42)  # type: ignore[arg-type]
