"""An agent joins whatever store its join URL names, by scheme: the head's TCP store (every
other test), or a directory every node can write (``file://``)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.backends.file import FileBackend
from clusterbook.rendezvous.backends.tcp import write_secret
from clusterbook.rendezvous.registry import backend_for, join_url, parse_join_url, schemes
from clusterbook.rendezvous.report import NodeReport
from clusterbook.rendezvous.state import decode, encode
from tests.conftest import wait_gone


def test_join_urls_of_every_registered_scheme_round_trip() -> None:
    settings = RendezvousSettings("run-1", 2, 4, timeout=RendezvousTimeout(last_call=0.5))
    for store in ("tcp://10.0.0.1:29400", "file:///shared/rdzv"):
        url = join_url(store, settings)
        back, parsed = parse_join_url(url)
        assert back == store
        assert (parsed.run_id, parsed.min_nodes, parsed.max_nodes) == ("run-1", 2, 4)
        assert parsed.timeout.last_call == 0.5
    assert {"tcp", "file"} <= set(schemes())
    with pytest.raises(ConfigError, match=r"No rendezvous store serves etcd URLs.*file://"):
        backend_for("etcd://h:2379/x", b"s" * 32)
    with pytest.raises(ConfigError, match="not a clusterbook join URL"):
        parse_join_url("http://h/x")


def test_two_agents_rendezvous_through_a_shared_directory(tmp_path: Path) -> None:
    store = tmp_path / "rdzv"
    store.mkdir()
    token = tmp_path / "token"
    write_secret(token)
    settings = RendezvousSettings("filerun", 2, 2, timeout=RendezvousTimeout(last_call=0.1))
    url = join_url(f"file://{store}", settings)
    argv = [sys.executable, "-m", "clusterbook", "worker", "join", url]
    argv += ["--token-file", str(token), "--slots", "2"]
    agents = [
        subprocess.Popen(
            [*argv, "--node-id", node],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in ("a", "b")
    ]
    backend = FileBackend(store)
    try:
        deadline = time.monotonic() + 60
        while True:
            current = backend.get_state()
            state = decode(current[0]) if current else None
            if state is not None and state.complete:
                break
            assert time.monotonic() < deadline, [a.poll() for a in agents]
            time.sleep(0.05)
        assert state.participants == {"a": 0, "b": 1}
        reports = {n: NodeReport.from_json(r) for n, r in state.node_info.items()}
        assert {r.slots for r in reports.values()} == {2}
        assert all(r.pid in {a.pid for a in agents} for r in reports.values())
        # Closing the rendezvous in the directory sends them home.
        current = backend.get_state()
        assert current is not None
        closed = replace(decode(current[0]), closed=True)
        backend.set_state(encode(closed), current[1])
        for agent in agents:
            assert agent.wait(timeout=30) == 0, agent.stderr.read() if agent.stderr else ""
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            if agent.stderr is not None:
                agent.stderr.close()
    assert not wait_gone(str(token), timeout=5)
