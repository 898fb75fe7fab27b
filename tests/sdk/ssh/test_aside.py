"""An agent's sshd started aside (:mod:`clusterbook.ssh.aside`), with a stand-in for the sshd.

The fork is tried in a fresh interpreter of its own (a script run here): a test process runs
threads, and a fork copies only the thread that makes it. The stand-in records what happens
to it in files, so that the test sees what the fork did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.ssh.aside import OnThread, SshdFacts, start_aside
from clusterbook.ssh.sshd import SshdError

_STAND_IN = """
import json, os, sys, time
from pathlib import Path
from clusterbook.ssh.aside import start_aside

where = Path(sys.argv[1])
how = sys.argv[2]

class StandIn:
    port = 2222
    host_public_key = "ssh-ed25519 AAAAstandin"
    def stop(self):
        if how == "slow":
            time.sleep(1.0)
        (where / "stopped").write_text(str(os.getpid()))

def start():
    (where / "started").write_text(str(os.getpid()))
    if how == "raise":
        raise ValueError("no sshd today")
    if how == "exit":
        os._exit(7)
    return StandIn()
"""


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "agent.py"
    script.write_text(_STAND_IN + textwrap.dedent(body))
    return script


def _run(script: Path, tmp_path: Path, how: str = "ok") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path), how],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_single_threaded_agent_starts_it_on_a_fork_which_stops_it_at_the_end(tmp_path):
    script = _script(
        tmp_path,
        """
        aside = start_aside(start)
        facts = aside.sshd()
        print(json.dumps({"kind": type(aside).__name__, "port": facts.port,
                          "key": facts.host_public_key, "me": os.getpid(), "fork": aside.pid}))
        assert not (where / "stopped").exists()
        aside.end()
        aside.end()  # again: nothing
        """,
    )
    done = _run(script, tmp_path)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["kind"] == "OnFork"
    assert (said["port"], said["key"]) == (2222, "ssh-ed25519 AAAAstandin")
    started = int((tmp_path / "started").read_text())
    assert started == said["fork"] != said["me"]  # started on the fork, not in the agent
    assert int((tmp_path / "stopped").read_text()) == started  # stopped there, by end()
    assert _gone(started)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("raise", "The agent's sshd did not start: Traceback"),
        ("exit", "before the sshd started"),
    ],
)
def test_a_start_that_fails_on_the_fork_is_raised_in_the_agent(tmp_path, how, said):
    script = _script(
        tmp_path,
        """
        aside = start_aside(start)
        try:
            aside.sshd()
        except Exception as exc:
            print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        aside.end()
        """,
    )
    done = _run(script, tmp_path, how)
    assert done.returncode == 0, done.stderr
    error = json.loads(done.stdout)
    assert error["type"] == "ClusterError"
    assert said in error["message"]
    if how == "raise":
        assert "ValueError: no sshd today" in error["message"]
    else:
        assert "exited with code 7" in error["message"]
    assert not (tmp_path / "stopped").exists()


def test_the_fork_stops_the_sshd_when_the_agent_is_killed_and_outlives_its_signals(tmp_path):
    script = _script(
        tmp_path,
        """
        aside = start_aside(start)
        aside.sshd()
        print(aside.pid, flush=True)
        time.sleep(120)
        """,
    )
    agent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), "slow"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert agent.stdout is not None
        fork = int(agent.stdout.readline())
        # A Slurm step's SIGTERM (or a terminal's Ctrl-C) reaches every process of the agent:
        # the fork leaves the stop to the agent, which ends it.
        os.kill(fork, signal.SIGTERM)
        os.kill(fork, signal.SIGINT)
        time.sleep(0.3)
        assert not _gone(fork)
        assert not (tmp_path / "stopped").exists()
        agent.kill()  # no word from the agent: its end closes the fork's pipe
        agent.wait(10)
        # Whoever reads the agent's output sees its end with the agent's: the fork, still
        # stopping the sshd, does not hold it.
        assert agent.stdout.read() == ""
        assert not (tmp_path / "stopped").exists()
        deadline = time.monotonic() + 10
        while not (tmp_path / "stopped").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert int((tmp_path / "stopped").read_text()) == fork
        while not _gone(fork) and time.monotonic() < deadline:  # reaped by init
            time.sleep(0.02)
        assert _gone(fork)
    finally:
        agent.kill()
        agent.wait()
        if agent.stdout is not None:
            agent.stdout.close()


class _StandIn:
    port = 2200
    host_public_key = "ssh-ed25519 AAAAthread"

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


@pytest.fixture
def another_thread():
    """A thread running beside the test's, until the test ends."""
    done = threading.Event()
    thread = threading.Thread(target=done.wait, name="beside")
    thread.start()
    yield thread
    done.set()
    thread.join()


def test_with_threads_running_it_starts_on_a_thread_which_stops_it_at_the_end(another_thread):
    stand_in = _StandIn()
    aside = start_aside(lambda: stand_in)  # type: ignore[arg-type, return-value]
    assert isinstance(aside, OnThread)  # a fork would copy only this thread
    facts = aside.sshd()
    assert isinstance(facts, SshdFacts)
    assert (facts.port, facts.host_public_key) == (2200, "ssh-ed25519 AAAAthread")
    assert not stand_in.stopped.is_set()
    aside.end()
    assert stand_in.stopped.is_set()


def test_on_a_thread_a_failed_start_is_raised_as_it_was():
    def start() -> None:
        raise ConfigError("bad port")

    aside = start_aside(start, fork=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bad port"):
        aside.sshd()
    aside.end()


@pytest.mark.parametrize(
    "error",
    [
        SshdError("sshd did not listen", port=22, directory=Path("/x"), log_tail="Address"),
        ConfigError("port 0x is not a port"),
    ],
)
def test_an_error_crosses_from_the_fork_as_its_own_kind(error):
    from clusterbook.ssh.aside import _error_from, _error_record

    record = json.loads(json.dumps(_error_record(error)))  # as the pipe carries it
    again = _error_from(record)
    assert type(again) is type(error)
    assert str(again) == str(error)
    if isinstance(error, SshdError):
        assert isinstance(again, SshdError)
        assert (again.port, again.directory, again.log_tail) == (22, Path("/x"), "Address")
    assert isinstance(again, ClusterError)
