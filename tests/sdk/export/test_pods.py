"""The MPIJob's pods: what the launcher and the workers run, run by sh in a pretend pod (a
home, the job's key where it is mounted, a hostfile, stubs of ``clusterbook`` and sshd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from clusterbook.export.pods import HOSTFILE, RESOLVE_WAIT, SSH_PORT, replica_specs, run_words
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.recovery import Recovery

NASTY = {
    "QUOTES": 'it\'s "quoted"',
    "DOLLAR": "$HOME `id` $(id)",
    "LINES": "one\ntwo\n",
    "GLOB": "* ? [a]",
    "EMPTY": "",
}


def script(specs: Mapping[str, Any], kind: str) -> str:
    """The shell script the ``kind`` (``Launcher``, ``Worker``) pods run."""
    (container,) = specs[kind]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    text: str = container["command"][2]
    return text


def pods(argv: list[str], mount: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The replica specs of a 4-rank Open MPI job of ``argv`` whose key is at ``mount``."""
    run = run_words(argv, 4, MPIFlavour.OPENMPI, Recovery.make(), None, env or {}, None, mount)
    return replica_specs("img", run, mount, None, 2)


@pytest.fixture
def pod(tmp_path: Path) -> dict[str, Path]:
    """A pretend pod: a home, the job's key where it is mounted, a hostfile, and stubs of
    ``clusterbook`` and ``/usr/sbin/sshd`` that write down the words they were run with."""
    home, keys, stubs = tmp_path / "home", tmp_path / "keys", tmp_path / "bin"
    for d in (home, keys, stubs):
        d.mkdir()
    (keys / "id_rsa").write_text("PRIVATE\n")
    (keys / "id_rsa.pub").write_text("ecdsa-sha2-nistp521 AAAAKEY\n")
    (keys / "authorized_keys").write_text("ecdsa-sha2-nistp521 AAAAKEY\n")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n127.0.0.1 slots=2\n")
    said = tmp_path / "said.json"
    stub = (
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(said)!r}, 'w'))\n"
    )
    for name in ("clusterbook", "sshd"):
        (stubs / name).write_text(stub)
        (stubs / name).chmod(0o755)
    return {"home": home, "keys": keys, "bin": stubs, "hostfile": hostfile, "said": said}


def _run_script(script: str, pod: dict[str, Path]) -> list[str]:
    script = script.replace(HOSTFILE, str(pod["hostfile"]))
    script = script.replace("/usr/sbin/sshd", str(pod["bin"] / "sshd"))
    env = {"HOME": str(pod["home"]), "PATH": f"{pod['bin']}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    words: list[str] = json.loads(pod["said"].read_text())
    return words


def test_the_launcher_runs_clusterbook_with_every_word_intact(pod: dict[str, Path]) -> None:
    argv = ["python", "-c", "import os; print(os.environ['X'], 'a b')", "--flag=$HOME", "*"]
    words = _run_script(script(pods(argv, str(pod["keys"]), NASTY), "Launcher"), pod)
    assert words[:5] == ["run", "-n", "4", "--hostfile", str(pod["hostfile"])]
    assert words[words.index("--") + 1 :] == argv
    envs = [words[i + 1] for i, w in enumerate(words) if w == "--env"]
    assert envs == [f"{k}={v}" for k, v in NASTY.items()]
    assert words[words.index("--identity") + 1] == str(pod["keys"] / "id_rsa")
    # Every worker's host key is the job's key: pinned for any name.
    known = pod["home"] / ".ssh" / "known_hosts"
    assert known.read_text() == "* ecdsa-sha2-nistp521 AAAAKEY\n"
    assert words[words.index("--known-hosts") + 1] == "~/.ssh/known_hosts"


def test_a_worker_that_does_not_resolve_stops_the_launcher(pod: dict[str, Path]) -> None:
    pod["hostfile"].write_text("nowhere.invalid:1\n")
    text = script(pods(["a"], str(pod["keys"])), "Launcher")
    text = text.replace(f"-ge {RESOLVE_WAIT}", "-ge 1").replace(HOSTFILE, str(pod["hostfile"]))
    env = {"HOME": str(pod["home"]), "PATH": f"{pod['bin']}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["/bin/sh", "-c", text], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert "worker nowhere.invalid does not resolve" in done.stderr
    assert not pod["said"].exists()


def test_the_worker_runs_sshd_with_the_jobs_key_in_a_writable_home(pod: dict[str, Path]) -> None:
    words = _run_script(script(pods(["a"], str(pod["keys"])), "Worker"), pod)
    ssh = pod["home"] / ".ssh"
    assert words == ["-De", "-p", str(SSH_PORT), "-h", str(ssh / "mpijob_host_key")]
    assert (ssh / "mpijob_host_key").read_text() == "PRIVATE\n"
    assert (ssh / "authorized_keys").read_text() == "ecdsa-sha2-nistp521 AAAAKEY\n"
    # sshd refuses a host key others can read; clusterbook adds its key to authorized_keys.
    assert {oct(p.stat().st_mode & 0o777) for p in ssh.iterdir()} == {"0o600"}
    assert os.access(ssh / "authorized_keys", os.W_OK)


def test_workers_are_ready_when_sshd_answers_and_get_the_resources() -> None:
    run = ["clusterbook", "run", "--", "a"]
    specs = replica_specs("img", run, "/keys", {"limits": {"cpu": 0.5}}, 3)
    assert (specs["Launcher"]["replicas"], specs["Worker"]["replicas"]) == (1, 3)
    (worker,) = specs["Worker"]["template"]["spec"]["containers"]
    assert worker["readinessProbe"] == {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2}
    assert worker["resources"] == {"limits": {"cpu": "0.5"}}
    (launcher,) = specs["Launcher"]["template"]["spec"]["containers"]
    assert "resources" not in launcher
    assert "readinessProbe" not in launcher
    assert {s["restartPolicy"] for s in specs.values()} == {"Never"}
