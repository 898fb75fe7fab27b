"""The user's clusterbook config: named cluster profiles, a kind of cluster and its options
kept in a file under a name.

The file is ``profiles.toml`` in the user's clusterbook config directory: ``$CLUSTERBOOK_CONFIG``
if set, else ``$XDG_CONFIG_HOME/clusterbook``, else ``~/.config/clusterbook``. Each profile is a
table ``[profiles.NAME]`` holding what ``Cluster.from_spec`` takes: ``kind`` and that kind's
arguments, and the options every cluster takes::

    [profiles.lab]
    kind = "ssh"
    hosts = ["node1:8", "node2:8"]
    user = "alice"
    idle_timeout = "30m"
    env = { OMP_NUM_THREADS = "1" }

    [profiles.laptop]
    kind = "local"
    workers = 2
    slots = 2

The file says which hosts a cluster logs in to and which programs it runs there, so it must be
the user's own as a cluster's run directory must be (:mod:`clusterbook.fs.private`): owned by
this user and writable by no one else, in a directory that is, below directories no one else
can move it out of. Any other file is refused, never read.

Reading and checking the file's layout is here; whether a profile's keys and values make a
cluster is the cluster's own check (:mod:`clusterbook.cluster.profile`).
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterbook.errors import ProfileError, UnknownProfileError, UnsafePathError
from clusterbook.fs.private import ancestor_problem, own_problem, path_facts, stat_facts
from clusterbook.names import NAME_RULE, is_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before the standard library took it in
    import tomli as tomllib

__all__ = [
    "CONFIG_ENV",
    "FILE_NAME",
    "Profile",
    "Profiles",
    "config_dir",
    "find_profile",
    "parse_profiles",
    "read_profiles",
]

#: The variable that names the config directory instead of the default one.
CONFIG_ENV = "CLUSTERBOOK_CONFIG"
#: The profiles file, in the config directory.
FILE_NAME = "profiles.toml"

_WHERE = f"${CONFIG_ENV}, else $XDG_CONFIG_HOME/clusterbook, else ~/.config/clusterbook"
_EXAMPLE = '[profiles.laptop]\nkind = "local"\nworkers = 2'


@dataclass(frozen=True, slots=True)
class Profile:
    """One profile: its ``name``, the ``spec`` it holds (``kind`` and the options, as
    ``Cluster.from_spec`` takes them) and the ``path`` of its file."""

    name: str
    spec: Mapping[str, Any]
    path: Path

    @property
    def kind(self) -> str:
        """The kind of cluster the profile makes (``"local"``, ``"ssh"``, ...)."""
        kind: str = self.spec["kind"]
        return kind


@dataclass(frozen=True, slots=True)
class Profiles:
    """The profiles of one file (``path``; none when there is no such file), by name, in
    the order the file has them."""

    path: Path
    by_name: Mapping[str, Profile]
    exists: bool = True

    def find(self, name: object) -> Profile:
        """The profile called ``name``; :class:`UnknownProfileError` lists those there are."""
        if isinstance(name, str) and name in self.by_name:
            return self.by_name[name]
        known = tuple(self.by_name)
        add = f"add a table [profiles.{name}]" if is_name(name) else f"name one {NAME_RULE}"
        if not self.exists:
            there = (
                f"there is no profiles file {self.path} (the config directory is {_WHERE}). "
                f"Write one, with a table per profile, like:\n{_EXAMPLE}"
            )
        elif not known:
            there = f"{self.path} holds no profile. Add one, like:\n{_EXAMPLE}"
        else:
            close = difflib.get_close_matches(str(name), known, n=1)
            mean = f" Did you mean {close[0]!r}?" if close else ""
            there = (
                f"the profiles in {self.path} are {', '.join(map(repr, known))}.{mean} Use "
                f"one of those, or {add} to the file."
            )
        raise UnknownProfileError(
            f"No profile {name!r}: {there}", path=self.path, profile=str(name), known=known
        )


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's clusterbook config directory: ``$CLUSTERBOOK_CONFIG``, else
    ``$XDG_CONFIG_HOME/clusterbook``, else ``~/.config/clusterbook`` (``environ``: the
    variables to read instead of this process's)."""
    env = os.environ if environ is None else environ
    if given := env.get(CONFIG_ENV):
        return Path(os.path.abspath(os.path.expanduser(given)))
    xdg = env.get("XDG_CONFIG_HOME", "")
    # The XDG spec: a relative XDG_CONFIG_HOME is invalid and ignored.
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".config"
    return base / "clusterbook"


def parse_profiles(text: str, path: Path) -> dict[str, Profile]:
    """The profiles in ``text``, the TOML of the file at ``path`` (pure: ``path`` only names
    it); :class:`ProfileError` for what is not TOML, or not laid out as profiles."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(
            f"The profiles file {path} is not valid TOML: {exc}. Fix that line; each profile "
            f"is a table like:\n{_EXAMPLE}",
            path=path,
        ) from None
    other = [key for key in data if key != "profiles"]
    if other:
        raise ProfileError(
            f"The profiles file {path} has {', '.join(map(repr, other))} at its top level, "
            "where it holds only the table 'profiles'; put each profile under "
            f"[profiles.NAME], like:\n{_EXAMPLE}",
            path=path,
        )
    tables = data.get("profiles", {})
    if not isinstance(tables, dict):
        raise ProfileError(
            f"'profiles' in {path} is {tables!r}, not a table of profiles; write each profile "
            f"as a table [profiles.NAME], like:\n{_EXAMPLE}",
            path=path,
        )
    return {name: _profile(name, spec, path) for name, spec in tables.items()}


def _profile(name: str, spec: object, path: Path) -> Profile:
    """One table of the file as a profile, once its name and kind are checked."""
    where = f"[profiles.{name}] in {path}"
    if not is_name(name):
        raise ProfileError(
            f"The profile name {name!r} in {path} is not a name: a profile's name is "
            f"{NAME_RULE}; rename the table [profiles.{name}].",
            path=path,
            profile=name,
        )
    if not isinstance(spec, dict):
        raise ProfileError(
            f"profiles.{name} in {path} is {spec!r}, not a table; write it as a table "
            f'[profiles.{name}] with kind = "local", "ssh", "slurm", ... and its options.',
            path=path,
            profile=name,
        )
    kind = spec.get("kind")
    if not isinstance(kind, str) or not kind:
        said = "has no kind" if kind is None else f"has kind = {kind!r}, not a name"
        raise ProfileError(
            f"Profile {name!r} ({where}) {said}; say which kind of cluster it makes, like "
            'kind = "local", "ssh", "elastic" or "slurm".',
            path=path,
            profile=name,
        )
    return Profile(name, dict(spec), path)


def read_profiles(directory: str | os.PathLike[str] | None = None) -> Profiles:
    """The profiles in ``profiles.toml`` of ``directory`` (default :func:`config_dir`); none
    when there is no such file. A file, or a directory of it or above it, that another user
    could have written is an :class:`UnsafePathError`, and the file is not read."""
    path = (config_dir() if directory is None else Path(directory)) / FILE_NAME
    if not os.path.lexists(path):
        return Profiles(path, {}, exists=False)
    real = Path(os.path.realpath(path))
    for ancestor in real.parents:
        problem = (
            own_problem(path_facts(ancestor), os.geteuid(), "directory")
            if ancestor == real.parent
            else ancestor_problem(path_facts(ancestor), os.geteuid())
        )
        if problem is not None:
            raise _unsafe(path, str(ancestor), problem)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ProfileError(
            f"Cannot read the profiles file {path}: {exc.strerror}; make it a file you can "
            f"read, or name another config directory with {CONFIG_ENV}.",
            path=path,
        ) from None
    with open(fd, "rb") as f:  # the file checked is the one read, whatever is renamed since
        problem = own_problem(stat_facts(str(real), os.fstat(f.fileno())), os.geteuid(), "file")
        if problem is not None:
            raise _unsafe(path, str(real), problem)
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"The profiles file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8.",
            path=path,
        ) from None
    return Profiles(path, parse_profiles(text, path))


def _unsafe(path: Path, culprit: str, problem: str) -> UnsafePathError:
    what = "The profiles file" if culprit == os.path.realpath(path) else "The directory"
    named = f"{culprit} (of {path})" if culprit != str(path) else culprit
    return UnsafePathError(
        f"{what} {named} {problem}; another user could then choose the hosts your clusters "
        f"log in to and the programs they run. Refusing to read it: run `chmod go-w "
        f"{culprit}` if it is yours and only you should write it, else keep your profiles "
        f"in a directory of your own (set {CONFIG_ENV}=DIR).",
        path=culprit,
    )


def find_profile(name: object, directory: str | os.PathLike[str] | None = None) -> Profile:
    """The profile called ``name`` in ``directory``'s file (default :func:`config_dir`);
    :class:`UnknownProfileError` lists the profiles there are."""
    return read_profiles(directory).find(name)
