"""The time-limit warning reaches a job's ranks through its launcher (SIGUSR1), once per
attempt, and only once every rank of the attempt started: a launcher still starting may not
forward the signal yet, and would end of it."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field

from clusterbook.launch.nodes import warn_ranks
from clusterbook.spec import NodeSpec


@dataclass
class Plan:
    nodes: tuple[NodeSpec, ...]


@dataclass
class Attempt:
    """What ``warn_ranks`` reads of a job: a real process stands for its launcher."""

    id: str
    launcher: subprocess.Popen[bytes]
    ranks_started: int
    np: int = 2
    attempt: int = 1
    plan: Plan = field(default_factory=lambda: Plan((NodeSpec("snode1-8", "snode1", 2),)))

    @property
    def pid(self) -> int:
        return self.launcher.pid

    def done(self) -> bool:
        return False


def launcher() -> subprocess.Popen[bytes]:
    """A process SIGUSR1 ends (the default), as a launcher not yet forwarding it."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_an_attempt_is_warned_once_all_its_ranks_started_and_once_only() -> None:
    starting, running, elsewhere = launcher(), launcher(), launcher()
    try:
        jobs = [
            Attempt("job-0001", starting, ranks_started=1),
            Attempt("job-0002", running, ranks_started=2),
            Attempt("job-0003", elsewhere, ranks_started=2, plan=Plan(())),  # not on the node
        ]
        told = warn_ranks(jobs, {"snode1-8"}, set())  # type: ignore[arg-type]
        assert told == {("job-0002", 1)}
        assert running.wait(10) == -signal.SIGUSR1
        assert starting.poll() is None
        assert elsewhere.poll() is None
        assert warn_ranks(jobs[1:], {"snode1-8"}, told) == set()  # once an attempt
        jobs[0].ranks_started = 2  # its ranks have all started since: the next look tells it
        assert warn_ranks(jobs, {"snode1-8"}, told) == {("job-0001", 1)}
        assert starting.wait(10) == -signal.SIGUSR1
    finally:
        for proc in (starting, running, elsewhere):
            proc.kill()
            proc.wait()
