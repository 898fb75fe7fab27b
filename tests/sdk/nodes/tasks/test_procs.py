"""A node's processes by their tag."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from clusterbook.nodes.tasks.procs import kill_tagged, tagged


def test_tagged_matches_whole_tokens_unless_asked_for_a_prefix():
    env = {**os.environ, "CLUSTERBOOK_JOB": "c1:abcdef"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(0.2)
        assert proc.pid in tagged(["c1:abcdef"])
        assert proc.pid not in tagged(["c1:abc"])  # a job token is matched whole
        assert proc.pid in tagged(["c1:"], prefix=True)  # a cluster's clean-up
        assert proc.pid not in tagged(["c10:"], prefix=True)
        assert kill_tagged(["c1:abcdef"], 1.0) == [proc.pid]
        assert proc.wait(timeout=5) != 0
    finally:
        proc.kill()
        proc.wait()
