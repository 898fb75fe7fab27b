"""Another local user, and the owner's own processes, against a real detached cluster's control
channel: no one else can reach it, learn its secret or run a command through it, and no flood
of connections stops it (its supervisor runs with the common 1,024 open-file limit)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.head.control import ControlClient, unix_dial
from tests.users import LocalUser

pytestmark = pytest.mark.root

CLI = [sys.executable, "-m", "clusterbook"]

# Starts a detached cluster whose supervisor has at most 1,024 files open, prints its id.
STARTER = """\
import resource, sys
import clusterbook as cb
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, min(hard, 1024)))
python, run_dir = sys.argv[1:3]
cluster = cb.Cluster.local(1, 1, python=python, detached=True, run_dir=run_dir or None)
print(cluster.start().id, flush=True)
"""

# Opens up to N connections to the head's address (a socket's path, or HOST:PORT) and holds
# them until its stdin ends; says how many it got and what stopped it.
FLOOD = """\
import socket, sys
address, count = sys.argv[1], int(sys.argv[2])
held, stopped = [], None
for _ in range(count):
    unix = address.startswith("/")
    sock = socket.socket(socket.AF_UNIX if unix else socket.AF_INET)
    host, _, port = address.rpartition(":")
    try:
        sock.connect(address if unix else (host, int(port)))
    except OSError as exc:
        stopped = type(exc).__name__
        sock.close()
        break
    held.append(sock)
print(len(held), stopped, flush=True)
sys.stdin.read()
"""

# As another user who can write the run directory: a head of its own at the socket's place
# and at the address of a rewritten record; prints (hex) all it was sent once stdin ends.
FAKE_HEAD = """\
import json, os, select, socket, sys
run_dir = sys.argv[1]
tcp = socket.create_server(("127.0.0.1", 0))
record_path = os.path.join(run_dir, "cluster.json")
with open(record_path) as f:
    record = json.load(f)
record["address"] = "127.0.0.1:%d" % tcp.getsockname()[1]
with open(os.path.join(run_dir, ".fake"), "w") as f:
    json.dump(record, f)
os.chmod(os.path.join(run_dir, ".fake"), 0o644)
os.replace(os.path.join(run_dir, ".fake"), record_path)
path = os.path.join(run_dir, "control.sock")
if os.path.lexists(path):
    os.rename(path, path + ".moved")
unix = socket.socket(socket.AF_UNIX)
unix.bind(path)
os.chmod(path, 0o777)
unix.listen()
print("ready", flush=True)
got, conns = b"", []
while True:
    ready = select.select([tcp, unix, sys.stdin, *conns], [], [], 60)[0]
    if not ready or sys.stdin in ready:
        break
    for r in ready:
        if r in (tcp, unix):
            conns.append(r.accept()[0])
            continue
        data = r.recv(65536)
        if not data:
            conns.remove(r)
            continue
        got += data
        r.sendall((64).to_bytes(4, "big") + os.urandom(64))  # a challenge it cannot prove
print(got.hex(), flush=True)
"""

# Connects to the head's address as another user and waits, saying nothing, for the end.
PROBE = """\
import socket, sys
address = sys.argv[1]
unix = address.startswith("/")
sock = socket.socket(socket.AF_UNIX if unix else socket.AF_INET)
host, _, port = address.rpartition(":")
sock.connect(address if unix else (host, int(port)))
print("connected")
sock.settimeout(3)
try:
    print("closed" if sock.recv(1) == b"" else "answered")
except TimeoutError:
    print("open")
except ConnectionResetError:
    print("closed")
"""


@pytest.fixture
def detached(openmpi_python) -> Iterator[list[tuple[str, int]]]:
    """Start detached clusters (:func:`start`); each is stopped at teardown, its supervisor
    killed if it does not stop (a test may have left its directory unusable)."""
    started: list[tuple[str, int]] = []
    yield started
    for cluster_id, pid in started:
        with contextlib.suppress(Exception):
            subprocess.run([*CLI, "stop", cluster_id], capture_output=True, timeout=60)
        with contextlib.suppress(psutil.NoSuchProcess):
            head = psutil.Process(pid)
            if head.is_running():
                head.send_signal(signal.SIGTERM)
                if psutil.wait_procs([head], timeout=30)[1]:
                    head.kill()


def start(python: str, started: list[tuple[str, int]], run_dir: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", STARTER, python, str(run_dir or "")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cluster_id = done.stdout.strip()
    started.append((cluster_id, cb.Cluster.attach(cluster_id).record.head_pid))
    return cluster_id


def as_user(user: LocalUser, code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        user.argv([sys.executable, "-c", code, *args], user.home),
        cwd=user.home, env=user.env(user.home), text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def reachable_dir(user: LocalUser) -> Path:
    """A directory of ours that ``user`` may enter (its parents too), for a run directory."""
    base = Path(tempfile.mkdtemp(dir=user.root))
    base.chmod(0o755)
    return base


def connect(address: str) -> socket.socket:
    if address.startswith("/"):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(address)
        return sock
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)))


def test_another_users_flood_reaches_nothing_and_the_head_serves_on(
    other_user, openmpi_python, detached
) -> None:
    cluster_id = start(openmpi_python, detached)
    attached = cb.Cluster.attach(cluster_id)
    head = psutil.Process(attached.record.head_pid)
    address = attached.record.address
    assert address is not None
    flood = as_user(other_user, FLOOD, address, "1100")
    try:
        assert flood.stdout is not None
        held, stopped = flood.stdout.readline().split()
        assert (held, stopped) == ("0", "PermissionError")  # not even one connection
        [run] = attached.node_runs(["id", "-un"], timeout=30)
        assert (run.returncode, run.stdout.strip()) == (0, "root")
        assert head.num_threads() < 50
        assert attached.state == "running"
        assert attached.snapshot().problem is None
    finally:
        attached.close()
        flood.kill()
        flood.communicate(timeout=30)


def test_the_owners_own_flood_does_not_stop_the_head_from_serving(openmpi_python, detached) -> None:
    cluster_id = start(openmpi_python, detached)
    attached = cb.Cluster.attach(cluster_id)
    head = psutil.Process(attached.record.head_pid)
    address = attached.record.address
    assert address is not None
    idle = []
    try:
        for _ in range(1100):  # past the head's 1,024 descriptors; none says a word
            idle.append(connect(address))
        [run] = attached.node_runs(["true"], timeout=30)
        assert run.returncode == 0
        assert attached.mpirun(["true"], np=1).wait(60).ok  # files and a job, as usual
        assert head.num_threads() < 50
        assert head.num_fds() < 512
    finally:
        for sock in idle:
            sock.close()
        attached.close()
    with cb.Cluster.attach(cluster_id) as again:  # a new connection is served too
        assert again.node_runs(["true"], timeout=30)[0].returncode == 0
        assert again.snapshot().problem is None


def test_a_shared_run_dir_lets_another_user_learn_nothing_and_run_nothing(
    other_user, openmpi_python, detached
) -> None:
    run_dir = reachable_dir(other_user) / "c"
    cluster_id = start(openmpi_python, detached, run_dir)
    token = run_dir / "token"
    secret = token.read_text().strip()
    run_dir.chmod(0o777)  # the directory became one others can write
    fake = as_user(other_user, FAKE_HEAD, str(run_dir))
    try:
        assert fake.stdout is not None
        assert fake.stdout.readline() == "ready\n", fake.stderr.read() if fake.stderr else ""
        shared = rf"directory {run_dir} .*writable by other users \(mode 0777\)"
        with pytest.raises(cb.UnsafePathError, match=shared):
            cb.Cluster.attach(cluster_id)
        # Below that check, the client talks to no socket another user serves.
        sock = run_dir / "control.sock"
        client = ControlClient(unix_dial(sock), token, where=str(sock))
        with pytest.raises(cb.ClusterStateError, match=r"served by uid \d+, not by you"):
            client.call("run_on_nodes", argv=["id", "-un"], timeout=10)
    finally:
        sent, _ = fake.communicate("", timeout=60)
    assert sent.strip() == ""  # nothing at all: not the secret, not even a nonce
    assert secret not in sent
    assert bytes.fromhex(secret).hex() not in sent


def test_the_head_drops_another_users_connection_even_where_files_let_it_in(
    other_user, openmpi_python, detached
) -> None:
    run_dir = reachable_dir(other_user) / "c"
    cluster_id = start(openmpi_python, detached, run_dir)
    address = cb.Cluster.attach(cluster_id).record.address
    assert address is not None
    run_dir.chmod(0o711)
    if address.startswith("/"):
        Path(address).chmod(0o777)
    try:
        probe = other_user.run_python(PROBE, address, timeout=60)
        assert probe.stdout.split() == ["connected", "closed"], probe.stderr
    finally:
        run_dir.chmod(0o700)
    with cb.Cluster.attach(cluster_id) as attached:
        assert attached.node_runs(["true"], timeout=30)[0].returncode == 0


# A control server of the other user's, out of threads for a moment (RLIMIT_NPROC).
NO_THREADS = """\
import resource, sys, tempfile
from pathlib import Path
import clusterbook as cb
from clusterbook.head.control import ControlClient, unix_dial
from clusterbook.head.control_server import ControlServer
d = Path(tempfile.mkdtemp())
server = ControlServer(d, {"echo": lambda r: {"said": r["text"]}})
client = ControlClient(unix_dial(d / "control.sock"), d / "token", where="here")
print(client.call("echo", text="before")["said"])
soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
resource.setrlimit(resource.RLIMIT_NPROC, (1, hard))
try:
    client.call("echo", text="during")
except cb.ClusterStateError as exc:
    print("refused:", exc)
resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
print(client.call("echo", text="after")["said"])
server.close()
"""


def test_a_head_that_cannot_start_a_thread_answers_so_and_serves_on(other_user) -> None:
    done = other_user.run_python(NO_THREADS, timeout=60)
    assert done.returncode == 0, done.stderr
    before, refused, after = done.stdout.splitlines()
    assert (before, after) == ("before", "after")
    assert refused.startswith("refused: The cluster's head cannot start a thread")
