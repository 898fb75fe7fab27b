"""Fake hosts on a lent machine, looked at: their network, an ssh session in one, and a bare
``mpirun`` across two of them with its daemons' own output (``--debug-daemons``).

    python scripts/device_fakehosts.py      (as root, with sshd, ssh and ip on PATH)

``scripts/device_bench.sh fakehosts`` runs it with the tools of ``.devtools/``. What a
benchmark across fake hosts (``benchmarks/warm.py``) needs before it can say anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from tests.testbed import make_testbed  # noqa: E402

import warm  # noqa: E402 - after the path: the benchmark's hello and bare mpirun command


def show(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    print(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}", flush=True)


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        hello = work / "hello.py"
        hello.write_text(warm.HELLO)
        bed = make_testbed(2, work / "bed")
        try:
            show("ip", "-br", "addr")
            show("ip", "netns", "exec", bed.hosts[0].netns, "ip", "-br", "addr")
            probe = "id; hostname; echo PATH=$PATH; command -v ssh || echo no ssh there"
            session = bed.ssh(bed.hosts[0], ["sh", "-c", probe])
            print(f"an ssh session in {bed.hosts[0].name}:\n{session.stdout}{session.stderr}")
            argv = warm.bare_argv(bed, 2, hello, None)
            argv[1:1] = ["--debug-daemons", "--leave-session-attached"]
            env = {**warm.OPENMPI_TUNING, **os.environ}
            run = subprocess.run(
                argv, env=env, cwd=work, capture_output=True, text=True, timeout=60, check=False
            )
            print(f"bare mpirun across both: exit {run.returncode}\n{run.stdout}{run.stderr}")
            return run.returncode
        finally:
            bed.close()


if __name__ == "__main__":
    sys.exit(main())
