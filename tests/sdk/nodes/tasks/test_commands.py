"""Processes the head starts on a node: ``spawn`` (detached, or as a fork of the session) and
the end of their logs, against a private home directory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterbook.nodes.tasks.commands import spawn, tail
from clusterbook.nodes.tasks.common import JOB_ENV, REPLY
from clusterbook.nodes.tasks.install import install
from clusterbook.nodes.tasks.procs import tagged
from clusterbook.nodes.tasks.program import source


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_spawn_starts_a_detached_process_logging_to_the_cluster_dir(home):
    install({"cluster_id": "c1", "files": {}})
    argv = ["sh", "-c", 'echo "out $CB_X"; echo err >&2; exec sleep 30']
    pid = spawn({"cluster_id": "c1", "argv": argv, "env": {"CB_X": "1"}, "log": "a.log"})["pid"]
    try:
        assert os.getsid(pid) == pid  # its own session: closing ours does not end it
        log = home / ".clusterbook" / "clusters" / "c1" / "a.log"
        deadline = time.monotonic() + 10
        while log.read_text().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(log.read_text().splitlines()) == ["err", "out 1"]
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert tail({"cluster_id": "c1", "name": "a.log", "lines": 1})["text"] in (
            "err",
            "out 1",
        )
        assert tail({"cluster_id": "c1", "name": "none.log", "lines": 5}) == {"text": ""}
    finally:
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # maybe reaped by subprocess already
            os.waitpid(pid, 0)
    with pytest.raises(ValueError, match="bad file name"):
        spawn({"cluster_id": "c1", "argv": ["true"], "log": "../x"})


FORKED = """\
import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "x", os.environ.get("CB_X"), flush=True)
time.sleep(float(sys.argv[1]))
"""


class Session:
    """The node program as a node's session runs it: its own process, requests on stdin."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source(), "session"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=home,
            env={**os.environ, "HOME": str(home), **env},
        )

    def call(self, task: str, args: dict[str, object]) -> dict[str, object]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"task": task, "args": args}).encode() + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().decode()
        assert line.startswith(REPLY), line
        reply: dict[str, object] = json.loads(line[len(REPLY) :])
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


def _gone(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _log_lines(path: Path, count: int, until: str = "") -> list[str]:
    """The log's lines once it has `count` of them and `until` is in it (a traceback is written
    in several writes: counting lines alone can read it half-way)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = path.read_text()
        if text.count("\n") >= count and until in text:
            break
        time.sleep(0.02)
    return path.read_text().splitlines()


def test_a_session_with_the_tag_starts_python_m_as_a_fork_of_itself(home):
    (home / "cbforked.py").write_text(FORKED)
    tag = {JOB_ENV: "c1:agents"}
    session = Session(home, tag)
    pids = []
    try:
        assert "ok" in session.call("install", {"cluster_id": "c1", "files": {}})
        spawn = {
            "cluster_id": "c1",
            "argv": [sys.executable, "-m", "cbforked", "30", "two words"],
            "env": tag,
            "log": "agent.log",
            "name": "cb-agent",
        }
        reply = session.call("spawn", spawn)["ok"]
        assert isinstance(reply, dict)
        assert reply["forked"] is True
        pid = reply["pid"]
        assert isinstance(pid, int)
        pids.append(pid)
        log = home / ".clusterbook" / "clusters" / "c1" / "agent.log"
        assert _log_lines(log, 1) == [f"argv ['30', 'two words'] cwd {home} x None"]
        agent = Path(f"/proc/{pid}")
        # Nothing of the session's open: not its pipes, not the log's own descriptor.
        assert sorted(int(fd) for fd in os.listdir(agent / "fd")) == [0, 1, 2]
        assert os.readlink(agent / "fd" / "0") == os.devnull
        assert os.readlink(agent / "fd" / "1") == str(log)
        assert (agent / "comm").read_text().strip() == "cb-agent"
        assert (agent / "cmdline").read_bytes().split(b"\0")[-2] == b"session"  # no new exec
        assert b"CLUSTERBOOK_JOB=c1:agents" in (agent / "environ").read_bytes().split(b"\0")
        assert os.getsid(pid) == pid
        # The session keeps no child (the fork between them has exited and been waited for)
        # and goes on taking tasks.
        session_children = subprocess.run(
            ["ps", "--ppid", str(session.proc.pid), "-o", "pid="], capture_output=True
        ).stdout.split()
        assert session_children == []
        assert pid in tagged(["c1:agents"])
        # Without the tag in the session's environment (what the clean-up looks for), a new
        # process runs the command instead.
        spawn["env"] = {JOB_ENV: "c1-other"}
        spawn["argv"] = [sys.executable, "-m", "cbforked", "0", "x"]
        reply = session.call("spawn", spawn)["ok"]
        assert isinstance(reply, dict)
        assert reply["forked"] is False
        pids.append(reply["pid"])
        # A module that is not there: the fork says so in its log and exits.
        spawn["env"], spawn["argv"] = tag, [sys.executable, "-m", "cb_no_such_module"]
        reply = session.call("spawn", spawn)["ok"]
        assert isinstance(reply, dict)
        assert reply["forked"] is True
        assert isinstance(reply["pid"], int)
        pids.append(reply["pid"])
        lines = _log_lines(log, 3, until="No module named cb_no_such_module")
        assert any("No module named cb_no_such_module" in line for line in lines), lines
    finally:
        for pid in pids:
            _gone(pid)
        session.close()
