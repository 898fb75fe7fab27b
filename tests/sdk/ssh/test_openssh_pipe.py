"""The OpenSSH client's process, spoken to over pipes (``clusterbook.ssh.openssh``): a local
program stands in for ``ssh host command``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from clusterbook.errors import SSHConnectError, SSHTimeoutError
from clusterbook.ssh.openssh import FAST_CIPHERS, OpenSSHShell, PipeProcess

ECHO = (
    "import sys\n"
    "for line in sys.stdin.buffer:\n"
    "    sys.stdout.buffer.write(line); sys.stdout.flush()\n"
)


def test_lines_and_bytes_go_both_ways_in_order() -> None:
    proc = PipeProcess("here", [sys.executable, "-c", ECHO])
    big = os.urandom(3 << 20).replace(b"\n", b"") + b"\n"  # more than a pipeful, one line
    proc.send(b"first\n" + big)
    assert proc.readline(10) == b"first\n"
    assert proc.read(5, 10) == big[:5]
    assert proc.read(len(big) - 5, 10) == big[5:]
    assert proc.close() == (0, "")


def test_an_end_gives_what_there_is_and_stderr_is_kept() -> None:
    proc = PipeProcess("n1", [sys.executable, "-c", "import sys; print('x'); sys.exit('bye')"])
    assert proc.readline(10) == b"x\n"
    assert proc.readline(10) == b""
    assert proc.read(4, 10) == b""
    assert proc.close() == (1, "bye")


def test_silence_is_a_timeout_naming_the_host() -> None:
    proc = PipeProcess("n1", [sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(SSHTimeoutError, match=r"No data from n1 within 0\.2 s"):
        proc.read(1, 0.2)
    with pytest.raises(SSHTimeoutError, match=r"No data from n1 within 0\.2 s"):
        proc.readline(0.2)
    code, _ = proc.close(timeout=0.2)  # it does not end: stopped
    assert code is None


def test_a_process_that_takes_nothing_times_the_send_out_and_a_dead_one_is_lost() -> None:
    stuck = PipeProcess("n1", [sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(SSHTimeoutError, match=r"n1 took nothing of what was sent for 0\.2 s"):
        stuck.send(b"x" * (8 << 20), timeout=0.2)
    stuck.close(timeout=0.2)
    dead = PipeProcess("n2", [sys.executable, "-c", "import sys; sys.exit('gone')"])
    dead.readline(10)
    time.sleep(0.1)
    with pytest.raises(SSHConnectError, match="Lost the connection to n2: gone"):
        dead.send(b"x" * (2 << 20), timeout=5)
    dead.close()


def test_a_missing_program_is_a_connect_error() -> None:
    with pytest.raises(SSHConnectError, match="Cannot start '/nowhere/ssh' to reach n1"):
        PipeProcess("n1", ["/nowhere/ssh", "n1"])


def test_the_shell_runs_the_command_through_its_wrapper_with_aes_gcm_first(
    tmp_path: Path,
) -> None:
    wrapper = tmp_path / "ssh"  # prints what ssh would have been given
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    wrapper.chmod(0o755)
    proc = OpenSSHShell("node1", str(wrapper)).start(
        ["python3", "-c", "print('a b')"], env={"X": "1 2"}
    )
    said = [proc.readline(10).decode().rstrip("\n") for _ in range(4)]
    assert said == [*FAST_CIPHERS, "node1", "env 'X=1 2' python3 -c 'print('\"'\"'a b'\"'\"')'"]
    assert proc.close() == (0, "")
