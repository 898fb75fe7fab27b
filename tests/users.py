"""Unprivileged local accounts that tests make and run programs as: the Binder user notebooks
run as (:mod:`tests.notebooks.binder`), another user of the same machine trying to reach a
cluster (the ``other_user`` fixture).

As root, the tests make such an account (:func:`make_user`): a uid and gid of the caller's
choosing (``useradd -o``: the uid may already be someone's, as uid 1000 is on Binder's images;
a group of that gid is made too where there is none), named for the session, whose home is a
fresh directory under a root of its own in /tmp (the passwd entry matters: a user-level sshd
logs its user in there). Every process of the user's runs with that uid and gid only, no
supplementary group, no way to gain privileges (``setpriv --no-new-privs``: a setuid program
such as sudo cannot raise it) and an environment of its own (no ``SLURM_CONF``, no
``OMPI_ALLOW_RUN_AS_ROOT``). The user runs this checkout's test venv: its checkout and venv
must be open to others (they are checked, and the test fails saying so otherwise). When the
venv's base interpreter lives under a directory others cannot enter (a pyenv build in root's
home), the user's processes see that interpreter's installation, and nothing else of that
directory, through a private mount namespace: a tmpfs over the directory with the
installation bound into it. The namespace, like the account, is gone once the tests are done.

Not as root (a laptop), the current user stands for the account (``LocalUser.made`` is False).
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
#: What the user's environment keeps of the tests'; the rest stays out.
KEPT_ENV = ("LANG", "LC_ALL", "TZ", "TERM")

# Run as root, in a private mount namespace: build a /root-like tmpfs holding only the
# interpreter's installation, put it over the directory that hides it, then become the user.
# $1 stage dir, $2 hidden directory, $3 installation, $4 uid, $5 gid, $6 cwd; then argv.
_EXPOSE = r"""
set -eu
stage=$1 hidden=$2 install=$3 uid=$4 gid=$5 cwd=$6
shift 6
mount -t tmpfs -o mode=0755,size=1m clusterbook-user "$stage"
mkdir -p "$stage${install#"$hidden"}"
mount --bind "$install" "$stage${install#"$hidden"}"
mount --move "$stage" "$hidden"
cd "$cwd"
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs -- "$@"
"""


class UserError(RuntimeError):
    """The account or its environment could not be set up; the message says what to change."""


def blocked(path: Path) -> Path | None:
    """The first directory on the way to ``path`` (itself included) that other users cannot
    enter, or None."""
    path = Path(path)
    for directory in [*reversed(path.parents), path]:
        try:
            mode = directory.stat().st_mode
        except OSError:
            return directory
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return directory
    return None


@dataclass
class LocalUser:
    """An unprivileged local user, and how to run a command as it."""

    name: str
    uid: int
    gid: int
    root: Path  # a directory of the session's: homes and stage directories go under it
    hidden: Path | None = None  # the directory the interpreter hides in (None: nothing hidden)
    install: Path | None = None  # the interpreter's installation shown in it
    made: bool = False  # the account is ours (removed by close())
    group: str | None = None  # a group made for gid 1000, where there was none (removed too)
    before: set[int] = field(default_factory=set)  # pids of the uid before the user ran

    @property
    def is_self(self) -> bool:
        """True when the user is the one running the tests (not root: no account made)."""
        return not self.made

    def new_home(self, where: Path) -> Path:
        """A fresh home at ``where``, owned by the user, made its passwd home."""
        where.mkdir(mode=0o700, parents=True)
        if self.made:
            os.chown(where, self.uid, self.gid)
            _run(["usermod", "-d", str(where), self.name])
        return where

    def env(self, home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of the user's processes: a login's, this venv's PATH first."""
        env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
        env.update(
            HOME=str(home),
            USER=self.name,
            LOGNAME=self.name,
            SHELL="/bin/sh",
            PATH=os.pathsep.join(
                [str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]
            ),
            PYTHONNOUSERSITE="1",
            PYTHONDONTWRITEBYTECODE="1",  # the checkout is not the user's to write in
            TMPDIR=str(home / "tmp"),
        )
        (home / "tmp").mkdir(exist_ok=True)
        if self.made:
            os.chown(home / "tmp", self.uid, self.gid)
        return env | (extra or {})

    def argv(self, argv: Sequence[str], cwd: Path) -> list[str]:
        """``argv`` run as the user in ``cwd`` (as root: through setpriv, and the mount
        namespace when the interpreter must be shown)."""
        if not self.made:
            return list(argv)
        if self.hidden is None or self.install is None:
            return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                    "--no-new-privs", "--", *argv]  # fmt: skip
        stage = Path(tempfile.mkdtemp(prefix="stage-", dir=self.root))
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _EXPOSE,
                "sh", str(stage), str(self.hidden), str(self.install), str(self.uid),
                str(self.gid), str(cwd), *argv]  # fmt: skip

    @property
    def home(self) -> Path:
        """The home :func:`make_user` made (the current user's own when not made)."""
        return self.root / "home" if self.made else Path.home()

    def run_python(
        self, code: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``python -c code *args`` with the test venv's Python as the user, in its home."""
        return subprocess.run(
            self.argv([sys.executable, "-c", code, *args], self.home),
            cwd=self.home,
            env=self.env(self.home, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def processes(self) -> list[psutil.Process]:
        """The user's processes started since it was made (or since the last ``mark()``)."""
        if not self.made:
            return []
        found = []
        for p in psutil.process_iter(["uids", "status"]):
            with contextlib.suppress(psutil.Error):
                mine = p.info["uids"].real == self.uid and p.pid not in self.before
                if mine and p.info["status"] != psutil.STATUS_ZOMBIE:
                    found.append(p)
        return found

    def mark(self) -> None:
        """Remember the processes of the uid there are now (someone else's of that uid)."""
        if self.made:
            self.before = {p.pid for p in psutil.process_iter(["uids"])
                           if p.info["uids"] and p.info["uids"].real == self.uid}  # fmt: skip

    def close(self) -> None:
        """Kill what the user left running, remove the account and the session's directory."""
        if self.made:
            for p in self.processes():
                with contextlib.suppress(psutil.Error):
                    p.kill()
            _run(["userdel", "-f", self.name], check=False)
            if self.group is not None:
                _run(["groupdel", self.group], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def make_user(
    uid: int,
    gid: int,
    *,
    prefix: str,
    comment: str,
    imports: str = "clusterbook",
) -> LocalUser:
    """A new account of ``uid`` and ``gid`` named ``prefix`` and a random suffix, as root (else
    the current user), that can run the test venv's Python and import ``imports`` with it."""
    root = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    if os.geteuid() != 0:
        return LocalUser(pwd.getpwuid(os.getuid()).pw_name, os.getuid(), os.getgid(), root)
    root.chmod(0o755)  # the homes under it are the user's own (0700)
    group = None
    name = f"{prefix}{secrets.token_hex(3)}"
    try:
        for tool in ("useradd", "usermod", "userdel", "groupadd", "setpriv", "unshare", "mount"):
            if shutil.which(tool) is None:
                raise UserError(f"{tool} is needed to run programs as another user ({comment})")
        _check_open_to_others(REPO, "the checkout", uid)
        _check_open_to_others(Path(sys.prefix), "the test venv", uid)
        hidden, install = _hidden_interpreter()
        if _gid_missing(gid):
            group = name
            _run(["groupadd", "-g", str(gid), group])
        _run(["useradd", "-o", "-u", str(uid), "-g", str(gid), "-M", "-d", str(root / "home"),
              "-s", "/bin/sh", "-c", comment, name])  # fmt: skip
    except BaseException:
        if group is not None:
            _run(["groupdel", group], check=False)
        shutil.rmtree(root, ignore_errors=True)
        raise
    user = LocalUser(name, uid, gid, root, hidden, install, made=True, group=group)
    home = root / "home"
    try:
        user.mark()
        user.new_home(home)
        probe = subprocess.run(
            user.argv([sys.executable, "-c", f"import {imports}"], home),
            env=user.env(home),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if probe.returncode != 0:
            raise UserError(
                f"user {name} (uid {uid}) cannot run the test venv's {sys.executable}: "
                f"{probe.stderr.strip()[-2000:]}"
            )
    except BaseException:
        user.close()
        raise
    return user


def free_id(start: int = 20000, stop: int = 30000) -> int:
    """A number that is neither a user's uid nor a group's gid here, drawn at random (two test
    processes asking at once get different ones)."""
    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    return secrets.choice([n for n in range(start, stop) if n not in taken])


def _gid_missing(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
    except KeyError:
        return True
    return False


def _check_open_to_others(path: Path, what: str, uid: int) -> None:
    if (closed := blocked(path)) is not None:
        raise UserError(
            f"{what} ({path}) is closed to other users at {closed} (mode "
            f"{stat.filemode(closed.stat().st_mode)}): the user of uid {uid} runs it "
            f"from there. Open the way (chmod o+x on each directory, o+r on the files) or "
            f"move it where others can read it."
        )


def _hidden_interpreter() -> tuple[Path | None, Path | None]:
    """Where the venv's base interpreter hides (a directory others cannot enter, the
    installation under it), or (None, None) when others can run it."""
    install = Path(sys.base_prefix).resolve()
    closed = blocked(Path(os.path.realpath(sys.executable)))
    if closed is None:
        return None, None
    if (
        closed not in install.parents
        or closed in REPO.parents
        or closed in Path(sys.prefix).resolve().parents
    ):
        raise UserError(
            f"the test venv's interpreter {os.path.realpath(sys.executable)} is closed to other "
            f"users at {closed}; make a venv from an interpreter others can run"
        )
    return closed, install


#: Taken around every change of the account files: useradd, usermod and userdel of two test
#: processes at once (pytest-xdist workers) fail on each other's lock of /etc/passwd.
ACCOUNTS_LOCK = Path("/run/clusterbook-tests-accounts.lock")


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    with open(ACCOUNTS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check and done.returncode != 0:
        raise UserError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


def wait_left(user: LocalUser, timeout: float) -> list[psutil.Process]:
    """The user's processes still there after up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while (left := user.processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
