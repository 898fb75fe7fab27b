"""A handle on a cluster attached through its directory, against a head running here on the
shipped FakeProvider (its real control server): what the handle holds is let go of when it is
closed, and when it is dropped without being closed."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.testing import FakeProvider
from tests.sdk.cluster.test_facade import STAND_IN


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[cb.Cluster]:
    launcher = tmp_path / "bin" / "mpirun"
    launcher.parent.mkdir()
    launcher.write_text(STAND_IN)
    launcher.chmod(0o755)
    options = ClusterOptions.make("fake", launcher=str(launcher), run_dir=tmp_path / "run")
    running = cb.Cluster(FakeProvider(nodes=1), options).start()
    yield running
    running.stop()


def connections_to(sock: Path) -> int:
    """This process's sockets connected to ``sock`` (their peer is its path; those the head
    accepted, here too, have none)."""
    count = 0
    for fd in _socket_fds():
        # An fd listed may be closed (or another's) by the time it is read: another thread's.
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as dup:
            count += dup.family == socket.AF_UNIX and dup.getpeername() == str(sock)
    return count


def _socket_fds() -> list[int]:
    fds = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.append(int(name))
    return fds


def pollers() -> int:
    return sum(t.name == "clusterbook-attached" for t in threading.enumerate())


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)


def test_a_dropped_handle_closes_its_connection_to_the_head(cluster: cb.Cluster) -> None:
    sock = cluster.run_dir / "control.sock"
    handle = cb.Cluster.attach(cluster.run_dir)
    handle.wait_ready(5)  # asks the head: the handle connects
    assert connections_to(sock) == 1
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        del handle
        gc.collect()
    assert [w for w in said if issubclass(w.category, ResourceWarning)] == []
    assert connections_to(sock) == 0


def test_a_dropped_handle_that_followed_its_record_stops_following(cluster: cb.Cluster) -> None:
    sock = cluster.run_dir / "control.sock"
    before = pollers()
    handle = cb.Cluster.attach(cluster.run_dir)
    handle.subscribe(lambda _: None)
    handle.wait_ready(5)
    assert (connections_to(sock), pollers()) == (1, before + 1)
    del handle  # the thread that follows the record does not keep it
    gc.collect()
    wait_for(lambda: (connections_to(sock), pollers()) == (0, before))


def test_a_closed_handle_holds_nothing_and_a_new_one_asks_again(cluster: cb.Cluster) -> None:
    sock = cluster.run_dir / "control.sock"
    before = pollers()
    with cb.Cluster.attach(cluster.run_dir) as handle:
        handle.subscribe(lambda _: None)
        handle.wait_ready(5)
        assert (connections_to(sock), pollers()) == (1, before + 1)
    assert connections_to(sock) == 0
    with cb.Cluster.attach(cluster.run_dir) as again:
        again.wait_ready(5)
        assert connections_to(sock) == 1


def test_a_handles_wait_names_a_bad_timeout_and_takes_none_as_a_cluster_does(
    cluster: cb.Cluster,
) -> None:
    with cb.Cluster.attach(cluster.run_dir) as handle:
        handle.wait_ready(None)  # type: ignore[arg-type]  # no limit: at once, as Cluster's
        cluster.wait_ready(None)  # type: ignore[arg-type]
        for waiting in (handle, cluster):
            with pytest.raises(cb.ConfigError, match="timeout must be a duration"):
                waiting.wait_ready("soon")  # type: ignore[arg-type]


def test_a_handle_aims_at_nodes_and_paths_as_a_cluster_does(
    cluster: cb.Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterbook.cluster.remote.node_calls import WRITE_MAX

    monkeypatch.chdir(tmp_path)  # where the head (this process) runs its jobs
    (tmp_path / "src.txt").write_text("put\n")
    with cb.Cluster.attach(cluster.run_dir) as handle:
        runs = handle.run_on_nodes(["echo", "hi"], nodes="fake-0")
        assert (runs.node.tolist(), runs.stdout.tolist()) == (["fake-0"], ["hi\n"])
        with pytest.raises(cb.ConfigError, match=r"'fake-3' is not a node.*its nodes are fake-0"):
            handle.run_on_nodes(["true"], nodes=["fake-3"])
        handle.write("conf/a.txt", "written\n", nodes=["fake-0"], mode=0o600)
        assert (tmp_path / "conf" / "a.txt").read_text() == "written\n"
        assert (tmp_path / "conf" / "a.txt").stat().st_mode & 0o777 == 0o600
        handle.put(tmp_path / "src.txt", dest="placed/")
        assert (tmp_path / "placed" / "src.txt").read_text() == "put\n"
        with pytest.raises(cb.ConfigError, match="a relative dest stays inside"):
            handle.put(tmp_path / "src.txt", dest="../out")
        with pytest.raises(cb.ConfigError, match=f"at most {WRITE_MAX} bytes"):
            handle.write("big", b"x" * (WRITE_MAX + 1))
        with pytest.raises(cb.ConfigError, match="takes bytes, or str"):
            handle.write("x", 5)  # type: ignore[arg-type]
