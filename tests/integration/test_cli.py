"""The ``clusterbook`` command, run as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import clusterbook
from clusterbook.nodes.tasks.cpus import usable_cores_here

pytestmark = pytest.mark.mpi

CLI = [sys.executable, "-m", "clusterbook"]


def run(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLUSTERBOOK_RUN_ROOT": str(tmp_path / "runs")}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def test_demo_runs_an_allreduce_on_every_rank(openmpi_python, tmp_path):
    proc = run(["demo"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # A rank per core this process may use, shared by the two nodes (a slot each at least).
    n = max(2, usable_cores_here())
    for rank in range(n):
        assert re.search(
            rf"^\[{rank}\] rank {rank}/{n} on \S+: allreduce\(rank\+1\) = {n * (n + 1) // 2} ",
            proc.stdout,
            re.M,
        ), proc.stdout
    assert ("OversubscriptionWarning" in proc.stderr) == (usable_cores_here() < 2), proc.stderr
    assert "local-0" in proc.stdout
    assert "local-1" in proc.stdout
    assert re.search(r"cluster start [\d.]+ s, job [\d.]+ s, total [\d.]+ s", proc.stdout)


def test_demo_with_mpich(mpich_python, tmp_path):
    proc = run(["demo", "--python", mpich_python], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "mpich" in proc.stdout
    n = max(2, usable_cores_here())
    sums = re.findall(r"allreduce\(rank\+1\) = (\d+) \(expected (\d+)\)", proc.stdout)
    assert sums == [(str(n * (n + 1) // 2),) * 2] * n, proc.stdout


def test_demo_without_the_flavour_names_the_extra_to_install(tmp_path):
    proc = run(["demo", "--python", "/usr/bin/python3", "--mpi", "mpich"], tmp_path)
    assert proc.returncode == 2
    assert "No mpich launcher found" in proc.stderr
    assert "pip install 'clusterbook[mpich]'" in proc.stderr


def test_run_returns_the_failing_rank_exit_code(openmpi_python, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import sys\nfrom mpi4py import MPI\n"
        "if MPI.COMM_WORLD.rank == 1:\n    sys.exit(7)\nMPI.COMM_WORLD.Barrier()\n"
    )
    proc = run(["run", "-n", "2", "--", "python", str(script)], tmp_path)
    assert proc.returncode == 7, proc.stderr
    assert "Rank 1" in proc.stderr
    assert "exited with code 7" in proc.stderr


def test_run_streams_output_with_rank_prefix(openmpi_python, tmp_path):
    proc = run(
        [
            "run",
            "-n",
            "2",
            "--env",
            "WHO=there",
            "--",
            "python",
            "-c",
            "import os; from mpi4py import MPI; "
            "print('hello', os.environ['WHO'], MPI.COMM_WORLD.rank)",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] hello there 0", "[1] hello there 1"]


def test_run_timeout_exits_124_with_stacks(openmpi_python, tmp_path):
    proc = run(
        ["run", "-n", "1", "--timeout", "2", "--", "python", "-c", "import time; time.sleep(600)"],
        tmp_path,
    )
    assert proc.returncode == 124
    assert "most recent call first" in proc.stderr
    assert "timed out" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "-n", "0", "--", "true"], "np must be >= 1"),
        (["run", "-n", "2"], "No command given"),
        (["run", "-n", "1", "--", "no-such-program-xyz"], "'no-such-program-xyz' was not found"),
        (["run", "-n", "1", "--", "python", "missing.py"], "'missing.py' does not exist"),
        # Fixes are told with this command's options, not Python's (no np=, no cwd=).
        (["run", "-n", "1", "--", "python", "missing.py"], "or pass --wdir /its/directory"),
        (["run", "-n", "99", "--slots", "2", "--", "true"], "-n 99 is more than the cluster's"),
        (["run", "-n", "99", "--slots", "2", "--", "true"], "or pass --oversubscribe to run"),
        (["run", "-n", "1", "--env", "1BAD=x", "--", "true"], "'1BAD' is invalid"),
        (["run", "-n", "1", "--env", "NOEQUALS", "--", "true"], "has no '='"),
        (["run", "-n", "1", "--timeout", "0", "--", "true"], "timeout must be"),
        (["run", "-n", "1", "--hosts=-oProxyCommand=x", "--", "true"], "starts with '-'"),
        (["run", "-n", "1", "--hosts", "a:1,,b:1", "--", "true"], "empty entry"),
        (["run", "-n", "1", "--hosts", "a:zero", "--", "true"], "is not a number"),
        (["run", "-n", "1", "--hostfile", "/no/such/hostfile", "--", "true"], "Cannot read"),
        (["run", "-n", "1", "--hosts", "a", "--hostfile", "f", "--", "true"], "not both"),
        (["run", "-n", "1", "--every", "5s", "--", "true"], "--every 5s is how often a discov"),
        (["run", "-n", "1", "--every", "5s", "--", "true"], "like --discover ./hosts.sh"),
        (["run", "-n", "1", "--slurm", "1", "--discover", "x", "--", "true"], "not both"),
        (["run", "-n", "1", "--discover", "echo no >&2; exit 3", "--", "true"], "exited 3: no"),
        (["run", "-n", "1", "--discover", "echo a:zero", "--", "true"], "'a:zero'"),
        (
            ["run", "-n", "1", "--launcher", "/nonexistent/mpirun", "--", "true"],
            "does not exist or is not executable",
        ),
    ],
)
def test_bad_input_gets_a_clear_message_and_exit_2(args, message, tmp_path):
    proc = run(args, tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_lists_the_commands(tmp_path):
    proc = run(["run", "--help"], tmp_path)
    assert proc.returncode == 0
    assert "--hosts" in proc.stdout
    assert "--timeout" in proc.stdout


def test_version_and_python_dash_m(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "clusterbook", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"clusterbook {clusterbook.__version__}"


def test_a_mistyped_flag_gets_the_subcommands_usage_and_the_closest_flag(tmp_path):
    proc = run(["run", "-n", "2", "--timout", "5", "--", "true"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: clusterbook run")
    assert "unrecognized arguments: --timout (did you mean --timeout?)" in proc.stderr
    proc = run(["worker", "join", "tcp://h:1/x", "--token-file", "t", "--slotz", "2"], tmp_path)
    assert proc.returncode == 2
    assert "usage: clusterbook worker join" in proc.stderr
    assert "(did you mean --slots?)" in proc.stderr


def test_worker_alone_prints_the_worker_help(tmp_path):
    proc = run(["worker"], tmp_path)
    assert proc.returncode == 2
    assert proc.stdout.startswith("usage: clusterbook worker")
    assert "join" in proc.stdout


def test_np_and_slots_as_mpi_users_type_them(openmpi_python, tmp_path):
    code = "from mpi4py import MPI; print(MPI.COMM_WORLD.size)"
    proc = run(["run", "-np", "3", "--slots", "3", "--", "python", "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] 3", "[1] 3", "[2] 3"]


def test_a_failed_run_folds_the_launchers_banners_and_tells_each_error_once(
    openmpi_python, tmp_path
):
    script = tmp_path / "fail.py"
    script.write_text(
        "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"
        "raise ValueError('the same on every rank')\n"
    )
    proc = run(["run", "-n", "2", "--", "python", str(script)], tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("ValueError: the same on every rank") == 1, proc.stderr
    assert re.search(r"^Error on ranks? [01](, 1)?:$", proc.stderr, re.M), proc.stderr
    # Open MPI's banners between rules of dashes say nothing the error does not.
    assert "MPI_ABORT" not in proc.stderr
    assert "-" * 74 not in proc.stderr
    assert "clusterbook: Job job-0001 failed" in proc.stderr


def test_wdir_is_where_the_ranks_run(openmpi_python, tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "where.py").write_text("import os\nprint(os.getcwd())\n")
    proc = run(
        ["run", "-n", "1", "--wdir", str(tmp_path / "job"), "--", "python", "where.py"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"[0] {tmp_path / 'job'}\n"


def test_a_failed_run_says_where_its_logs_are(openmpi_python, tmp_path):
    code = "print('about to fail'); raise SystemExit(3)"
    proc = run(["run", "-n", "1", "--", "python", "-c", code], tmp_path)
    assert proc.returncode == 3
    logs = re.search(r"each rank's log is in (\S+)", proc.stderr)
    assert logs is not None, proc.stderr
    assert "about to fail" in (Path(logs.group(1)) / "rank-0.log").read_text()


def test_run_retries_a_failed_job_and_says_so(openmpi_python, tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, sys\nfrom mpi4py import MPI\n"
        "attempt = os.environ['CLUSTERBOOK_ATTEMPT']\n"
        "print('attempt', attempt, flush=True)\n"
        "if attempt == '1' and MPI.COMM_WORLD.rank == 1:\n    sys.exit(5)\n"
        "MPI.COMM_WORLD.Barrier()\n"
    )
    argv = ["run", "-n", "2", "--retries", "2", "--backoff", "0.1", "--", "python", str(script)]
    proc = run(argv, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "clusterbook: attempt 2\n" in proc.stderr
    assert "[0] attempt 2\n" in proc.stdout
    assert "[1] attempt 2\n" in proc.stdout
    assert "[1] attempt 1\n" in proc.stdout

    proc = run(["run", "-n", "2", "--retries", "-1", "--", "python", str(script)], tmp_path)
    assert proc.returncode == 2
    assert "Retries -1 is negative; give 0 (never) or more, like --retries 3." in proc.stderr
