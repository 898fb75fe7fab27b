"""Where an SSH cluster's master connections keep their sockets: a temp directory short enough
for a Unix socket's path, whatever ``TMPDIR`` says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from clusterbook.providers.ssh.masters import ROOM, ControlMasters, socket_base

#: What ssh binds while it makes a master's socket: ``%C`` (40 characters) and 17 more.
BOUND = "/" + "c" * 40 + "." + "r" * 16


def test_the_first_temp_directory_the_sockets_fit_in_is_taken() -> None:
    short, long = "/tmp", "/var/folders/" + "x" * 60
    assert socket_base([long, None, short]) == short
    assert socket_base([short, long]) == short
    assert socket_base(["/run/user/1000", short]) == "/run/user/1000"
    assert socket_base([long]) is None
    assert socket_base([None, ""]) is None


def test_a_directory_of_the_longest_length_taken_holds_a_bindable_socket() -> None:
    base = "/" + "b" * (ROOM - 1)
    assert socket_base([base]) == base
    assert socket_base([base + "b"]) is None
    path = base + "/cbm-XXXXXXXX" + BOUND
    assert len(path.encode()) <= 107  # sun_path holds 108 bytes, its last a NUL


def test_a_long_tmpdir_does_not_put_the_sockets_out_of_reach(tmp_path: Path) -> None:
    long = tmp_path / ("t" * (ROOM + 10))
    long.mkdir()
    code = (
        "import json; from clusterbook.providers.ssh.masters import ControlMasters\n"
        "m = ControlMasters([], ['node1'])\n"
        "print(json.dumps([str(m.directory), m.forward('node1')])); m.stop()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(long)},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    directory, forward = json.loads(done.stdout)
    assert not directory.startswith(str(long)), directory
    assert len((directory + BOUND).encode()) <= 107
    assert len(forward.encode()) <= 107
    assert not Path(directory).exists()  # stop() took it away


def test_a_host_that_leaves_while_its_master_starts_is_said_to_have_left() -> None:
    """A job's check restarts a master while the round's update drops its host (a node that
    scale() let go): the start ends, saying so, instead of failing the job with a KeyError."""
    # A proxy that never answers and ends with ssh (at the end of its input).
    proxy = "ProxyCommand=sh -c 'cat >/dev/null; exit'"
    waiting = ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", proxy]
    masters = ControlMasters(waiting, ["gone"])
    try:
        said: list[dict[str, str]] = []
        starting = threading.Thread(target=lambda: said.append(masters.start(20.0)))
        starting.start()
        time.sleep(0.5)  # its ssh waits on the proxy for a banner: not up, not ended
        masters.drop("gone")
        starting.join(20.0)
        assert said == [{"gone": "its host left the cluster"}]
    finally:
        masters.stop()
