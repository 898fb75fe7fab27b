"""The script a ``%%mpirun`` cell runs as on every rank (pure: the cell's text and where its
values go in, the program out). How the ranks' output is shown is decided in
:mod:`clusterbook.launch.fold`; the magic's arguments are parsed in
:mod:`clusterbook_widgets.arguments`.
"""

from __future__ import annotations

from clusterbook_widgets.pulled import MAGIC

__all__ = ["build_script"]


_TEMPLATE = """\
# Written by clusterbook's %%mpirun: the notebook cell below runs on every rank.


def _clusterbook_cell(source, filename, push, pull, pull_dir, pull_key):
    import linecache
    import os
    import pickle
    import sys
    import time
    import traceback

    g = globals()
    del g["_clusterbook_cell"]
    sys.path[0] = ""  # import from the working directory, as the notebook does
    if push is not None:
        with open(push, "rb") as f:
            g.update(pickle.load(f))
    # Tracebacks and stack dumps show the cell's own lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec")
    try:
        exec(code, g)
    except Exception as exc:
        # Without this frame, the traceback is the cell's alone. One write: the rank may be
        # killed any time now, and half a traceback would tell nothing.
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.stderr.flush()
        os.write(2, "".join(tb).encode("utf-8", "backslashreplace"))
        # exit(1) aborts the job: first, other ranks failing the same way get to say so.
        time.sleep({grace!r})
        sys.exit(1)
    if pull is None:
        return
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK")
    if rank is None:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
    if pull not in g:
        print(f"--pull {{pull}}: name {{pull!r}} is not defined on rank {{rank}}", file=sys.stderr)
        sys.exit(1)
    path = os.path.join(pull_dir, f"rank-{{rank}}.pkl")
    # Plain pickle: the kernel takes plain data back, and runs no code of the ranks'.
    try:
        data = pickle.dumps(g[pull], protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        print(
            f"--pull {{pull}}: rank {{rank}}'s value cannot be sent back "
            f"({{type(exc).__name__}}: {{exc}}); pull plain data (numbers, strings, lists, "
            "dicts, numpy arrays)",
            file=sys.stderr,
        )
        sys.exit(1)
    import hashlib
    import hmac

    # Signed with the cell's key, for its rank: the kernel takes no value anyone else wrote.
    mac = hmac.new(bytes.fromhex(pull_key), b"rank %d\\n" % int(rank) + data, hashlib.sha256)
    with open(path + ".part", "wb") as f:
        f.write({magic!r} + mac.digest() + data)
    os.replace(path + ".part", path)


_clusterbook_cell(
    source={source},
    filename={filename!r},
    push={push!r},
    pull={pull!r},
    pull_dir={pull_dir!r},
    pull_key={pull_key!r},
)
"""


def build_script(
    cell: str,
    *,
    filename: str,
    push_file: str | None = None,
    pull: str | None = None,
    pull_dir: str | None = None,
    pull_key: bytes | None = None,
    error_grace: float = 0.25,
) -> str:
    """The Python program that runs ``cell`` on a rank.

    It loads the pickled dict in ``push_file`` (if any) into its globals, runs the cell as
    ``filename`` (so tracebacks and stack dumps show the cell's lines), prints an uncaught
    exception's traceback without the runner's frame and exits 1 ``error_grace`` seconds
    later (so that ranks failing at the same time all report it), and, if ``pull`` is given,
    pickles the rank's value of ``pull`` to ``pull_dir/rank-N.pkl``, signed with ``pull_key``
    (see :mod:`clusterbook_widgets.pulled`). The program holds the key: keep it private.
    """
    if not (pull is None) == (pull_dir is None) == (pull_key is None):
        raise ValueError("pull, pull_dir and pull_key go together")
    # The cell goes in as a literal: no quoting of its text can break the program.
    literal = "(\n" + "".join(f"        {line!r}\n" for line in cell.splitlines(True)) + "    )"
    if not cell:
        literal = "''"
    return _TEMPLATE.format(
        source=literal,
        filename=filename,
        push=push_file,
        pull=pull,
        pull_dir=pull_dir,
        pull_key=None if pull_key is None else pull_key.hex(),
        magic=MAGIC,
        grace=error_grace,
    )
