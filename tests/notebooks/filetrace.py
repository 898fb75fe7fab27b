"""What a notebook's run changes on the machine: every file or directory its processes create,
write, rename, link or remove, from ``strace -f`` of the run (the runner, its kernel and every
process the kernel starts), each as an absolute path.

strace prints, with ``-y``, the path of every file descriptor: of the directory an ``*at`` call
is relative to (``AT_FDCWD</cwd>``) and of the file an ``open`` returned, so relative names
resolve without following each process's working directory.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

#: The calls that change the file system (``open`` only where its flags write or create).
CALLS = (
    "open,openat,openat2,creat,mkdir,mkdirat,mknod,mknodat,rename,renameat,renameat2,"
    "unlink,unlinkat,rmdir,link,linkat,symlink,symlinkat,truncate"
)
_WRITES = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC")
_LINE = re.compile(r"^\d+\s+(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>.*)$")
_FD_PATH = re.compile(r"^-?\d+<(?P<path>[^>]*)>")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_DIRFD = re.compile(r"(?:AT_FDCWD|-?\d+)<(?P<dir>[^>]*)>")


def argv(log: Path) -> list[str]:
    """The strace command line that traces what follows it into ``log`` (only calls that
    succeeded: a write the kernel refused changed nothing)."""
    strace = shutil.which("strace")
    if strace is None:
        raise FileNotFoundError("strace is not installed (apt-get install strace)")
    return [strace, "-f", "-qq", "-y", "--seccomp-bpf", "-e", "signal=none",
            "-e", "status=successful", "-e", f"trace={CALLS}", "-o", str(log), "--"]  # fmt: skip


def changed(log: Path) -> set[str]:
    """The absolute paths the traced processes changed (a relative name whose directory
    strace could not say is kept as ``?/name``, so that it is seen, not dropped)."""
    found: set[str] = set()
    for line in log.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        call, args, ret = match["call"], match["args"], match["ret"]
        if call.startswith("open") or call == "creat":
            if call != "creat" and not _WRITES.search(args):
                continue
            opened = _FD_PATH.match(ret)
            if opened is not None:
                found.add(opened["path"])
                continue
        found.update(_paths(call, args))
    return found


def _paths(call: str, args: str) -> list[str]:
    """The paths an ``*at`` call or a plain one names, made absolute where strace says how."""
    names = _STRING.findall(args)
    if call.startswith("symlink"):
        names = names[1:]  # what the link points at is not changed
    dirs = [m["dir"] for m in _DIRFD.finditer(args)]
    out = []
    for i, name in enumerate(names):
        if name.startswith("/"):
            out.append(os.path.normpath(name))
        elif call.endswith("at") or call.endswith("at2"):
            base = dirs[i] if i < len(dirs) else "?"
            out.append(os.path.normpath(f"{base}/{name}"))
        else:
            out.append(f"?/{name}")
    return out
