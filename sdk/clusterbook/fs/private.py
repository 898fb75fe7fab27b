"""Whether a cluster's directory is this user's alone, in the spirit of OpenSSH's StrictModes.

A cluster's run directory holds what drives it: its record (``cluster.json``: state, the
head's pid, where it takes requests), its secret (``token``) and its control socket. Whoever
can write there can replace any of them, and whoever can write a directory above it can move
it away and put another in its place. So (as OpenSSH's ``safe_path()`` asks of ``~/.ssh``):

- the run directory, the run root and the record are owned by this user and writable by no
  one else;
- every directory above them is owned by this user or root, and writable by no one else
  unless it is sticky (``/tmp``: there no one else can rename or remove what is ours).

Group write is harmless where the group is this user's own private group (its primary group,
with no other member), as Debian's OpenSSH allows it. A shared directory is refused, not
made private: what others could already put there, or link from there, stays theirs, and
another user's access to a directory they share is not clusterbook's to take away.

The rules are pure functions of what ``lstat`` says (:class:`Facts`); :func:`check_run_dir`
gathers the facts and raises :class:`~clusterbook.errors.UnsafePathError`.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from clusterbook.errors import UnsafePathError

__all__ = ["Facts", "ancestor_problem", "check_run_dir", "own_problem", "path_facts", "stat_facts"]

_ELSEWHERE = "under a directory only you can write; none: one is made under your home"


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rules look at of one path: its owner, its mode, whether its group is its
    owner's private group."""

    path: str
    uid: int
    mode: int  # st_mode, the file type included
    private_group: bool = False


def _writers(facts: Facts) -> str | None:
    """Who else may write ``facts.path``: "other users", "its group", or None."""
    if facts.mode & stat.S_IWOTH:
        return "other users"
    if facts.mode & stat.S_IWGRP and not facts.private_group:
        return "its group"
    return None


def own_problem(facts: Facts, uid: int, kind: str) -> str | None:
    """Why ``facts`` is not private to ``uid`` as a path of the cluster's own must be (the
    run directory, the run root, the record), or None. ``kind`` is "directory" or "file"."""
    wanted = stat.S_ISDIR if kind == "directory" else stat.S_ISREG
    if not wanted(facts.mode):
        return f"is not a {kind}{' (a symbolic link)' if stat.S_ISLNK(facts.mode) else ''}"
    if facts.uid != uid:
        return f"is owned by {_user(facts.uid)}, not by you ({_user(uid)})"
    if writers := _writers(facts):
        return f"is writable by {writers} (mode {_mode(facts.mode)})"
    return None


def ancestor_problem(facts: Facts, uid: int) -> str | None:
    """Why a directory above the cluster's lets someone else move it, or None."""
    if facts.uid not in (0, uid):
        return f"is owned by {_user(facts.uid)}, who can move what is in it"
    if (writers := _writers(facts)) and not facts.mode & stat.S_ISVTX:
        return (
            f"is writable by {writers} and not sticky (mode {_mode(facts.mode)}): they can "
            "move what is in it"
        )
    return None


def check_run_dir(run_dir: Path, root: Path | None = None) -> None:
    """Raise :class:`UnsafePathError` unless ``run_dir`` (its real path), the record in it
    (if there is one), ``root`` (if given and there) and every directory above them are
    private to this user (see the module's docstring)."""
    uid = os.geteuid()
    real = Path(os.path.realpath(run_dir))
    _check(path_facts(real), uid, "directory", "run directory", run_dir)
    for ancestor in real.parents:
        _check_ancestor(path_facts(ancestor), uid, real)
    record = real / "cluster.json"
    if os.path.lexists(record):
        _check(path_facts(record), uid, "file", "record", Path(run_dir) / "cluster.json")
    if root is not None and os.path.lexists(root):
        real_root = Path(os.path.realpath(root))
        _check(path_facts(real_root), uid, "directory", "run root", root)
        for ancestor in real_root.parents:
            _check_ancestor(path_facts(ancestor), uid, real_root)


def _check(facts: Facts, uid: int, kind: str, what: str, given: Path) -> None:
    problem = own_problem(facts, uid, kind)
    if problem is None:
        return
    named = facts.path if str(given) == facts.path else f"{facts.path} (from {given})"
    fix = (
        f"run `chmod go-w {facts.path}` if only you should write it, or give the cluster "
        f"another run_dir ({_ELSEWHERE})"
        if facts.uid == uid
        else f"give the cluster a run_dir of your own ({_ELSEWHERE})"
    )
    raise UnsafePathError(
        f"The cluster's {what} {named} {problem}; another user could then change what the "
        f"cluster does or learn its secret. Refusing to use it: {fix}.",
        path=facts.path,
        owner=facts.uid,
        mode=stat.S_IMODE(facts.mode),
    )


def _check_ancestor(facts: Facts, uid: int, below: Path) -> None:
    problem = ancestor_problem(facts, uid)
    if problem is None:
        return
    raise UnsafePathError(
        f"The directory {facts.path} above the cluster's directory {below} {problem}, so "
        f"another user could put a directory of theirs in its place. Run `chmod go-w "
        f"{facts.path}` (or `chmod +t`: sticky) if that is yours to change, or give the "
        f"cluster another run_dir ({_ELSEWHERE}).",
        path=facts.path,
        owner=facts.uid,
        mode=stat.S_IMODE(facts.mode),
    )


def path_facts(path: Path) -> Facts:
    """The :class:`Facts` of ``path`` as ``lstat`` sees it (a link is a link)."""
    return stat_facts(str(path), os.lstat(path))


def stat_facts(path: str, info: os.stat_result) -> Facts:
    """The :class:`Facts` of what ``info`` (``stat``, ``lstat`` or ``fstat``) says of ``path``."""
    # Only asked where it decides something: group-writable, and not writable by all anyway.
    shared = info.st_mode & stat.S_IWGRP and not info.st_mode & stat.S_IWOTH
    private = bool(shared) and _private_group(info.st_gid, info.st_uid)
    return Facts(path, info.st_uid, info.st_mode, private)


def _private_group(gid: int, uid: int) -> bool:
    """Whether ``gid`` is the private group of ``uid``: its primary group, no one else's,
    and with no other member (only asked of a group-writable path)."""
    try:
        owner = pwd.getpwuid(uid)
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False
    if owner.pw_gid != gid or any(m != owner.pw_name for m in members):
        return False
    return all(p.pw_gid != gid or p.pw_uid == uid for p in pwd.getpwall())


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _mode(mode: int) -> str:
    return f"{stat.S_IMODE(mode):04o}"
