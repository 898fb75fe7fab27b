"""The script a ``%%mpirun`` cell runs as on every rank, run here by this Python: values
pushed and pulled (signed), imports from the working directory, the cell's own traceback."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

from clusterbook_widgets.mpirun_cell import build_script
from clusterbook_widgets.pulled import signed


def run_script(
    tmp_path: Path, cell: str, rank: int = 1, **kw: object
) -> subprocess.CompletedProcess:
    script = tmp_path / "cell.py"
    script.write_text(build_script(cell, filename="<mpirun cell 7>", **kw))  # type: ignore[arg-type]
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": str(rank)}
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )


def test_script_pushes_and_pulls(tmp_path: Path) -> None:
    push = tmp_path / "push.pkl"
    push.write_bytes(pickle.dumps({"x": [1, 2], "word": "hi"}))
    (tmp_path / "pull").mkdir()
    tricky = "s = '''a\\\\b\"\"\" \u00e9'''\n"  # quotes, a backslash, non-ASCII: kept as they are
    cell = tricky + "import os\ny = (x, word, s, os.environ['OMPI_COMM_WORLD_RANK'])\nprint(y)\n"
    key = os.urandom(32)
    done = run_script(
        tmp_path, cell, push_file=str(push), pull="y", pull_dir=str(tmp_path / "pull"), pull_key=key
    )
    assert done.returncode == 0, done.stderr
    value = ([1, 2], "hi", 'a\\b""" \u00e9', "1")
    assert done.stdout == f"{value}\n"
    written = (tmp_path / "pull" / "rank-1.pkl").read_bytes()
    assert written == signed(key, 1, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    assert not list((tmp_path / "pull").glob("*.part"))


def test_script_imports_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "mymod.py").write_text("VALUE = 42\n")
    sub = tmp_path / "cells"
    sub.mkdir()
    script = sub / "cell.py"
    script.write_text(build_script("import mymod\nprint(mymod.VALUE)\n", filename="<c>"))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=30
    )
    assert done.stdout == "42\n", done.stderr


def test_script_traceback_is_the_cells_own(tmp_path: Path) -> None:
    t0 = time.monotonic()
    done = run_script(tmp_path, "a = 1\nraise ValueError(f'boom {a}')\n", error_grace=0.4)
    assert time.monotonic() - t0 >= 0.4  # other ranks failing alike get time to report
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines == [
        "Traceback (most recent call last):",
        '  File "<mpirun cell 7>", line 2, in <module>',
        "    raise ValueError(f'boom {a}')",
        "ValueError: boom 1",
    ]


def test_script_pull_of_an_undefined_name_fails(tmp_path: Path) -> None:
    (tmp_path / "pull").mkdir()
    done = run_script(
        tmp_path, "z = 1\n", pull="y", pull_dir=str(tmp_path / "pull"), pull_key=b"k" * 32
    )
    assert done.returncode == 1
    assert "--pull y: name 'y' is not defined on rank 1" in done.stderr
    assert not list((tmp_path / "pull").iterdir())


def test_script_of_an_empty_cell_runs(tmp_path: Path) -> None:
    done = run_script(tmp_path, "")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
