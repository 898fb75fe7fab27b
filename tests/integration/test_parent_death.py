"""A job dies with the Python process that started it, even when that one is SIGKILLed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import processes_mentioning, wait_gone

pytestmark = pytest.mark.mpi

DRIVER = """\
import sys, time
import clusterbook as cb
python, script, run_dir, name = sys.argv[1:5]
cluster = cb.Cluster.local(1, 2, python=python, run_dir=run_dir, name=name).start()
job = cluster.mpirun(["python", script], np=2)
seen = 0
for record in job.stream():
    seen += record.line == "started"
    if seen == 2:
        break
print("ready", cluster.id, flush=True)
time.sleep(600)
"""

SLEEPER = """\
import time
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
print("started", flush=True)
time.sleep(600)
"""


def test_sigkill_of_the_parent_kills_the_job_within_two_seconds(mpi_python, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    name = f"pd-{os.getpid()}-{tmp_path.name[-12:]}".replace("_", "-")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, mpi_python, str(script), str(tmp_path / "run"), name],
        stdout=subprocess.PIPE,
        text=True,
    )
    secret = None
    try:
        assert driver.stdout is not None
        ready, cluster_id = driver.stdout.readline().split()
        assert ready == "ready"
        ranks = [
            p
            for p in processes_mentioning(str(script))
            if p.pid != driver.pid and "cb-rank" not in p.cmdline()
        ]
        assert len(ranks) == 2  # both ranks run before the parent dies
        assert processes_mentioning(f"/{cluster_id}?")  # and its node agent (the store's URL)
        secret = Path.home() / ".clusterbook" / "clusters" / cluster_id
        assert (secret / "token").exists()
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        survivors = wait_gone(str(script), timeout=2.0)
        assert survivors == [], [p.cmdline() for p in survivors]
        agents = wait_gone(f"/{cluster_id}?", timeout=2.0)  # the node agents go too
        assert agents == [], [p.cmdline() for p in agents]
        # The head's token goes with them, and its directory, which held nothing else.
        deadline = time.monotonic() + 5.0
        while secret.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not secret.exists(), sorted(p.name for p in secret.iterdir())
    finally:
        driver.kill()
        driver.wait(timeout=10)
        if driver.stdout is not None:
            driver.stdout.close()
        for p in processes_mentioning(str(script)) + processes_mentioning(f"{name}-"):
            p.kill()
        if secret is not None:  # what a failed check left
            shutil.rmtree(secret, ignore_errors=True)
