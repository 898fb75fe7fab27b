"""A real user-level sshd, and the fake hosts (namespaces + sshd) the SSH tests run against."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook
from clusterbook.errors import ClusterError, ConfigError
from clusterbook.ssh.sshd import SshdConfig, SshdError, render_sshd_config, start_sshd
from tests import testbed as fake_hosts
from tests.conftest import require
from tests.testbed import (
    HOME_DIRS,
    Testbed,
    cleanup_stale,
    leftovers,
    make_testbed,
    require_testbed,
)

testbed = fake_hosts.testbed  # the module-scoped fixture of three fake hosts

USER = "cbtest"
REPO = Path(__file__).resolve().parents[2]


def require_sshd() -> None:
    require(
        Path("/usr/sbin/sshd").exists() and shutil.which("ssh") is not None,
        "needs OpenSSH (apt-get install openssh-server openssh-client)",
    )


def make_client_key(directory: Path) -> tuple[Path, str]:
    key = directory / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(key)], check=True
    )
    return key, key.with_suffix(".pub").read_text()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


LOGIN_HOME = Path(pwd.getpwuid(0).pw_dir)  # root's: the fake hosts are logged in to as root
PRIVATE_DIRS = {str(LOGIN_HOME / d) for d in HOME_DIRS}


def mount_points(pid: int | str = "self") -> set[str]:
    """Where something is mounted in the mount namespace of ``pid`` (``self``: the head's)."""
    lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    return {line.split()[4].replace("\\040", " ") for line in lines}


def in_mount_namespaces(namespaces: Iterable[str]) -> list[int]:
    """Pids of every process in one of ``namespaces`` (``os.readlink`` of /proc/PID/ns/mnt)."""
    wanted, found = set(namespaces), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "mnt") in wanted:
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    return found


# --- the config, and errors that need no running sshd ------------------------------------


GOLDEN = """\
Port 2222
ListenAddress 127.0.0.1
HostKey /srv/cb/ssh_host_ed25519_key
PidFile /srv/cb/sshd.pid
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile /srv/cb/authorized_keys
PermitRootLogin prohibit-password
AllowTcpForwarding no
AllowStreamLocalForwarding no
AllowAgentForwarding no
PermitTunnel no
X11Forwarding no
PrintMotd no
AcceptEnv none
LogLevel VERBOSE
MaxStartups 64:30:128
Subsystem sftp internal-sftp
"""


def test_render_sshd_config_matches_the_golden_text():
    cfg = SshdConfig(Path("/srv/cb"), 2222)
    text = render_sshd_config(
        cfg, host_key=Path("/srv/cb/ssh_host_ed25519_key"), pid_file=Path("/srv/cb/sshd.pid")
    )
    assert text == GOLDEN


def test_render_sshd_config_quotes_spaces_and_escapes_percent_tokens():
    cfg = SshdConfig(Path("/srv/my cb"), 2222, "10.0.0.5", Path("/srv/100%/keys"))
    text = render_sshd_config(cfg, host_key=Path("/srv/my cb/k"), pid_file=Path("/srv/p"))
    assert 'HostKey "/srv/my cb/k"\n' in text
    assert "ListenAddress 10.0.0.5\n" in text
    assert "AuthorizedKeysFile /srv/100%%/keys\n" in text  # sshd expands %h, %u there


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"port": 0}, "port must be 1-65535, got 0"),
        ({"port": "22"}, "port must be a whole number"),
        ({"listen": "-oProxyCommand=x"}, "starts with '-'"),
        ({"directory": Path('/tmp/a"b')}, "sshd_config cannot hold"),
    ],
)
def test_sshd_config_rejects_bad_values_with_a_config_error(kwargs, match):
    args = {"directory": Path("/srv/cb"), "port": 2222, **kwargs}
    with pytest.raises(ConfigError, match=match):
        SshdConfig(**args)


def test_start_sshd_without_the_binary_says_what_to_install(tmp_path):
    with pytest.raises(SshdError, match="apt-get install openssh-server") as info:
        start_sshd(tmp_path / "d", sshd_path=tmp_path / "no-such-sshd")
    assert isinstance(info.value, ClusterError)
    assert str(tmp_path / "no-such-sshd") in str(info.value)


def test_start_sshd_with_netns_needs_root_and_an_explicit_port(tmp_path):
    # A fake host's sshd (the testbed's helper: network namespaces are not the SDK's).
    from tests.testbed import start_host_sshd

    match = "explicit port" if os.geteuid() == 0 else "needs root"
    with pytest.raises(ConfigError, match=match):
        start_host_sshd(tmp_path, 0, "127.0.0.1", netns="cb1-h1")
    with pytest.raises(ConfigError, match="not starting with '-'"):
        start_host_sshd(tmp_path, 2222, "127.0.0.1", netns="-n")


# --- a real sshd on 127.0.0.1 --------------------------------------------------------------


@pytest.mark.sshd
def test_start_sshd_on_a_busy_port_names_the_port_and_the_log_line(tmp_path):
    require_sshd()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(SshdError) as info:
            start_sshd(tmp_path / "d", port=port, timeout=10)
        assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "Address already in use" in message
    assert info.value.port == port


@pytest.mark.sshd
def test_sshd_keeps_its_host_key_across_restarts_and_stops_idempotently(tmp_path):
    require_sshd()
    with start_sshd(tmp_path / "d") as first:
        key, pid = first.host_public_key, first.pid
        assert key.startswith("ssh-ed25519 AAAA")
        assert (first.host_key_path.stat().st_mode & 0o777) == 0o600
        assert (first.config_path.stat().st_mode & 0o777) == 0o600
    first.stop()
    assert gone(pid)
    with start_sshd(tmp_path / "d") as second:
        assert second.host_public_key == key


def test_render_sshd_config_lists_more_key_files_after_the_first():
    cfg = SshdConfig(Path("/srv/cb"), 2222, authorized_keys=Path(".ssh/authorized_keys"),
                     more_keys=(Path("/mnt/job ssh/authorized_keys"),))  # fmt: skip
    text = render_sshd_config(cfg, host_key=Path("/srv/cb/k"), pid_file=Path("/srv/p"))
    assert 'AuthorizedKeysFile .ssh/authorized_keys "/mnt/job ssh/authorized_keys"\n' in text


@pytest.mark.sshd
@pytest.mark.root
def test_sshd_shows_a_given_host_key_and_lets_in_the_keys_of_more_files(tmp_path):
    require_sshd()
    job = tmp_path / "job"  # as a Secret is mounted: readable by all
    job.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-C", "job",
                    "-f", str(job / "id_rsa")], check=True)  # fmt: skip
    key, public = make_client_key(tmp_path)
    (job / "authorized_keys").write_text(public)
    for path in job.iterdir():
        path.chmod(0o644)
    (tmp_path / "none").write_text("")
    with start_sshd(tmp_path / "d", authorized_keys=tmp_path / "none",
                    more_authorized_keys=[job / "authorized_keys"],
                    host_key=job / "id_rsa") as sshd:  # fmt: skip
        shown = " ".join((job / "id_rsa.pub").read_text().split()[:2])
        assert sshd.host_public_key == shown
        assert (sshd.host_key_path.stat().st_mode & 0o777) == 0o600  # sshd wants it private
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {shown}\n")  # pinned to the job's key
        done = subprocess.run(
            ["ssh", "-F", "none", "-p", str(sshd.port), "-i", str(key),
             "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
             "-o", "ConnectTimeout=5", "root@127.0.0.1", "echo", "in"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert (done.returncode, done.stdout) == (0, "in\n"), done.stderr
    (tmp_path / "nope").write_text("")
    with pytest.raises(SshdError, match=r"Cannot read the host key .*/nope\.pub"):
        start_sshd(tmp_path / "e", host_key=tmp_path / "nope")


def _python_for(user: str) -> tuple[str, dict[str, str]]:
    """An interpreter ``user`` can run that imports clusterbook and its dependencies.

    The venv's interpreter may live under /root (unreadable to others); then use the system
    Python of the same version with the venv's site-packages on PYTHONPATH.
    """
    sdk = str(Path(clusterbook.__file__).resolve().parents[1])
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env = {"PYTHONPATH": os.pathsep.join([sdk, *sorted(paths)])}
    system = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [(sys.executable, env), (system, env)]
    # Last resort when the checkout itself is unreadable to others: a world-readable copy of
    # clusterbook and psutil (all that importing clusterbook.ssh.sshd needs) in /tmp.
    shared = Path(tempfile.mkdtemp(prefix="cb-user-sshd-"))
    shared.chmod(0o755)
    for module in (clusterbook, psutil):
        source = Path(module.__file__).resolve().parent
        shutil.copytree(source, shared / source.name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in shared.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    candidates.append((system, {"PYTHONPATH": str(shared)}))
    for python, extra in candidates:
        probe = subprocess.run(
            [*_as_user(user), python, "-c", "import clusterbook.ssh.sshd"],
            env={**_user_env(user), **extra},
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            if extra is env:
                shutil.rmtree(shared)
            return python, extra
    shutil.rmtree(shared)
    pytest.fail(f"no Python that user {user} can run imports clusterbook: {candidates}")


def _as_user(user: str) -> list[str]:
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]


def _user_env(user: str) -> dict[str, str]:
    home = pwd.getpwnam(user).pw_dir
    return {"HOME": home, "USER": user, "LOGNAME": user, "PATH": "/usr/bin:/bin:/usr/sbin"}


USER_SCRIPT = textwrap.dedent("""\
    import json, os, sys
    from pathlib import Path
    from clusterbook.ssh.sshd import start_sshd
    home = Path(sys.argv[1])
    sshd = start_sshd(home / "sshd", authorized_keys=home / "authorized_keys", timeout=20)
    print(json.dumps({"port": sshd.port, "key": sshd.host_public_key, "pid": sshd.pid}),
          flush=True)
    sys.stdin.read()  # until the test is done with it
    sshd.stop()
""")


@pytest.fixture
def user_home() -> Iterator[Path]:
    """A fresh directory owned by the throwaway non-root user, removed afterwards."""
    require(os.geteuid() == 0, "needs root to create and become a throwaway user")
    require(shutil.which("setpriv") is not None, "needs setpriv (util-linux)")
    try:
        pwd.getpwnam(USER)
    except KeyError:  # a parallel session may create it at the same time: then it exists
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], capture_output=True, check=False)
    entry = pwd.getpwnam(USER)
    directory = Path(tempfile.mkdtemp(prefix="cb-sshd-", dir=entry.pw_dir))
    os.chown(directory, entry.pw_uid, entry.pw_gid)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.sshd
@pytest.mark.root
def test_user_level_sshd_serves_a_non_root_user(user_home, tmp_path):
    require_sshd()
    entry = pwd.getpwnam(USER)
    key, public = make_client_key(tmp_path)
    keys = user_home / "authorized_keys"
    keys.write_text(public)
    os.chown(keys, entry.pw_uid, entry.pw_gid)
    keys.chmod(0o600)
    python, env = _python_for(USER)
    proc = subprocess.Popen(
        [*_as_user(USER), python, "-c", USER_SCRIPT, str(user_home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**_user_env(USER), **env},
        text=True,
    )
    sshd_pid = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"the user-level sshd did not start (exit code {proc.wait(10)})"
        info = json.loads(line)
        sshd_pid = info["pid"]
        assert psutil.Process(sshd_pid).uids().real == entry.pw_uid
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{info['port']} {info['key']}\n")
        done = subprocess.run(
            ["ssh", "-F", "none", "-p", str(info["port"]), "-i", str(key),
             "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
             "-o", "ConnectTimeout=5", f"{USER}@127.0.0.1", "id", "-un"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == USER
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()  # the sshd gets SIGTERM from its parent-death signal
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if sshd_pid is not None:
            deadline = time.monotonic() + 5
            while not gone(sshd_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not gone(sshd_pid):
                os.kill(sshd_pid, signal.SIGKILL)
                pytest.fail(f"the user-level sshd {sshd_pid} outlived its owner")


# --- fake hosts ------------------------------------------------------------------------------


@pytest.mark.sshd
@pytest.mark.root
def test_head_reaches_every_host_by_address_and_sees_its_hostname(testbed: Testbed):
    for host in testbed.hosts:
        done = testbed.ssh(host, ["hostname"])
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == host.name


@pytest.mark.sshd
@pytest.mark.root
def test_hosts_reach_each_other(testbed: Testbed):
    node1, node2, node3 = testbed.hosts
    assert testbed.ssh(node2, ["hostname"], via=node1).stdout.strip() == "node2"
    assert testbed.ssh(node1, ["hostname"], via=node3).stdout.strip() == "node1"


@pytest.mark.sshd
@pytest.mark.root
def test_link_down_makes_connect_fail_in_time_and_link_up_restores(testbed: Testbed):
    host = testbed.hosts[1]
    host.link_down()
    try:
        started = time.monotonic()
        done = testbed.ssh(host, ["true"], options=["-o", "ConnectTimeout=2"], timeout=20)
        assert done.returncode == 255
        assert time.monotonic() - started < 6
    finally:
        host.link_up()
    assert testbed.ssh(host, ["hostname"]).stdout.strip() == host.name


@pytest.mark.sshd
@pytest.mark.root
def test_paused_sshd_makes_connect_time_out_and_resume_restores(testbed: Testbed):
    host = testbed.hosts[0]
    host.pause_sshd()
    try:
        started = time.monotonic()
        done = testbed.ssh(host, ["true"], options=["-o", "ConnectTimeout=2"], timeout=20)
        assert done.returncode == 255
        assert time.monotonic() - started < 6
    finally:
        host.resume_sshd()
    assert testbed.ssh(host, ["hostname"]).stdout.strip() == host.name


@pytest.mark.sshd
@pytest.mark.root
def test_swapped_host_key_is_refused_by_strict_checking(testbed: Testbed):
    host = testbed.hosts[2]
    old_key = host.host_public_key
    host.swap_host_key()
    try:
        assert host.host_public_key != old_key
        done = testbed.ssh(host, ["true"])
        assert done.returncode == 255
        assert (
            "REMOTE HOST IDENTIFICATION HAS CHANGED" in done.stderr
            or "Host key verification failed" in done.stderr
        ), done.stderr
    finally:
        testbed.write_known_hosts()
    assert testbed.ssh(host, ["hostname"]).stdout.strip() == host.name


@pytest.mark.sshd
@pytest.mark.root
def test_each_host_has_its_own_ssh_and_clusterbook_dirs_in_a_shared_home(testbed: Testbed):
    node1, node2, _ = testbed.hosts
    name = f"x-{uuid.uuid4().hex[:8]}"
    script = f'echo written-on-node1 > ~/.clusterbook/{name} && echo "$HOME"'
    done = testbed.ssh(node1, ["sh", "-c", script])
    try:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(LOGIN_HOME)  # the home itself is not replaced
        assert (node1.home / ".clusterbook" / name).read_text() == "written-on-node1\n"
        assert not (node2.home / ".clusterbook" / name).exists()
        assert not (LOGIN_HOME / ".clusterbook" / name).exists()
        elsewhere = testbed.ssh(node2, ["test", "-e", f"{LOGIN_HOME}/.clusterbook/{name}"])
        assert elsewhere.returncode == 1, elsewhere.stderr
    finally:
        (node1.home / ".clusterbook" / name).unlink(missing_ok=True)
    # The rest of the home is the head's: the interpreter running these tests (pyenv in ~).
    assert testbed.ssh(node1, ["test", "-x", os.path.realpath(sys.executable)]).returncode == 0
    # The bind mounts exist in the hosts' mount namespaces, never in the head's.
    for host in testbed.hosts:
        assert mount_points(host.sshd.pid) >= PRIVATE_DIRS
    assert not PRIVATE_DIRS & mount_points()


@pytest.mark.sshd
@pytest.mark.root
def test_each_host_reads_its_own_authorized_keys(testbed: Testbed):
    node1, node2, _ = testbed.hosts
    assert "\nAuthorizedKeysFile .ssh/authorized_keys\n" in node2.sshd.config_path.read_text()
    assert node2.authorized_keys == node2.home / ".ssh" / "authorized_keys"
    assert node2.authorized_keys.stat().st_mode & 0o777 == 0o600
    assert node2.authorized_keys.parent.stat().st_mode & 0o777 == 0o700
    client_key = testbed.identity.with_suffix(".pub").read_text().strip()
    original = node2.authorized_keys.read_text()
    lines = original.splitlines(keepends=True)
    assert client_key in [line.strip() for line in lines]
    node2.authorized_keys.write_text("".join(x for x in lines if x.strip() != client_key))
    try:
        refused = testbed.ssh(node2, ["true"])
        assert refused.returncode == 255
        assert "Permission denied" in refused.stderr, refused.stderr
        assert testbed.ssh(node1, ["hostname"]).stdout.strip() == "node1"
    finally:
        node2.authorized_keys.write_text(original)
    assert testbed.ssh(node2, ["hostname"]).stdout.strip() == "node2"
    head_keys = LOGIN_HOME / ".ssh" / "authorized_keys"
    assert not head_keys.exists() or client_key not in head_keys.read_text()


@pytest.mark.sshd
@pytest.mark.root
def test_close_leaves_no_namespace_link_process_or_mount(tmp_path):
    require_testbed()
    bed = make_testbed(2, tmp_path)
    try:
        node1 = bed.hosts[0]
        started = bed.ssh(node1, ["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"])
        assert started.returncode == 0, started.stderr
        pids = [pid for host in bed.hosts for pid in host.processes()]
        assert {h.sshd.pid for h in bed.hosts} <= set(pids)
        assert len(pids) >= 3  # two sshds and the session's sleep
        names = [bed.bridge] + [h.veth for h in bed.hosts] + [h.netns for h in bed.hosts]
        mount_namespaces = {os.readlink(f"/proc/{h.sshd.pid}/ns/mnt") for h in bed.hosts}
        assert os.readlink("/proc/self/ns/mnt") not in mount_namespaces
        assert in_mount_namespaces(mount_namespaces)  # the sshds and the sleep
    finally:
        bed.close()
    # No process is left in the hosts' mount namespaces, so they and their mounts are gone.
    assert in_mount_namespaces(mount_namespaces) == []
    assert not PRIVATE_DIRS & mount_points()
    bed.close()  # again: nothing to do
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for name in names:
        assert name not in namespaces.split()
        assert f" {name}:" not in links
    assert [pid for pid in pids if not gone(pid)] == []


@pytest.mark.sshd
@pytest.mark.root
def test_cleanup_stale_removes_the_testbed_of_a_killed_owner(tmp_path):
    require_testbed()
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from tests.testbed import make_testbed; "
         "bed = make_testbed(1, sys.argv[1]); print(bed.index, bed.hosts[0].sshd.pid, "
         "flush=True); time.sleep(300)", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    index = None
    try:
        assert owner.stdout is not None
        index, sshd_pid = map(int, owner.stdout.readline().split())
        owner.kill()  # no teardown runs: what a crashed test session leaves
        owner.wait()
        assert leftovers(index), "the killed owner's namespace and links should still exist"
        assert index in cleanup_stale()
        assert leftovers(index) == []
        assert gone(sshd_pid)
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
        cleanup_stale()
