"""Execute notebooks with nbclient in a kernel of the test venv, and read what they left.

Each notebook runs in a copy of ``notebooks/`` (so files it writes stay out of the checkout),
in a kernel whose ``HOME`` is a fresh directory: every secret a cluster makes (rendezvous token
files, private keys under ``~/.clusterbook``) and every run directory is then under that
directory. While the notebook runs, a harvester reads those secrets, so the test can look for
them in the executed notebook after the cluster has deleted its files; every process whose
command line names that directory must be gone once the kernel has shut down.

:func:`execute` runs nbclient in this process; :func:`execute_as` runs it (this module, as a
program) as the Binder user of :mod:`tests.notebooks.binder`, and reads back what it wrote.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nbformat
from nbclient import NotebookClient

from tests.notebooks import filetrace

if TYPE_CHECKING:
    from tests.users import LocalUser

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PRIVATE_KEY_MARK = "PRIVATE KEY-----"
CELL_TIMEOUT = 120  # seconds, per cell

# Appended to every notebook under test: what the kernel runs, and the repr of everything a
# user could print (every variable, every cluster and job still in memory, also those the
# magics made), so that a secret in any repr ends up in the outputs that are scanned.
PROBE = """\
import gc as _gc
import sys as _sys
import types as _types
import weakref as _weakref

import os as _os

print("kernel python:", _sys.executable)
print("kernel user:", _os.getuid(), _os.getgid(), sorted(_os.getgroups()), _os.path.expanduser("~"))
for _name, _value in list(globals().items()):
    if not _name.startswith("_") and not isinstance(
        _value, (_types.ModuleType, type, _types.FunctionType)
    ):
        print(f"{_name} = {_value!r}"[:20000])
if "clusterbook" in _sys.modules:
    import clusterbook as _cb

    for _obj in _gc.get_objects():
        if type(_obj) in (_weakref.ProxyType, _weakref.CallableProxyType):
            continue  # e.g. a closed progress bar's: asking it anything raises
        if isinstance(_obj, _cb.Cluster):
            print(repr(_obj), repr(_obj.snapshot()), _obj.join_command, sep="\\n")
            print(_obj.status().to_string())
        elif isinstance(_obj, _cb.Job):
            print(repr(_obj), repr(_obj.plan), repr(_obj.wait(timeout=60)), sep="\\n")
            print(_obj.logs().to_string())
"""


@dataclass
class Executed:
    """A notebook after execution, with the secrets its clusters made while it ran and the
    widget state as it was after each cell (the stored state is the last one: a live widget
    shown early has changed by the end)."""

    name: str
    nb: nbformat.NotebookNode
    home: Path
    secrets: dict[str, set[str]] = field(default_factory=dict)  # file -> needles
    changed: set[str] = field(default_factory=set)  # paths its processes wrote (see filetrace)
    states: dict[int, dict[str, Any]] = field(default_factory=dict)  # cell index -> models


def kernel_env(home: Path) -> dict[str, str]:
    """The environment of a kernel (or a Jupyter server) whose home is ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "XDG_"))}
    env.pop("CLUSTERBOOK_RUN_ROOT", None)
    env["HOME"] = str(home)
    env["PYTHONNOUSERSITE"] = "1"  # only the venv's packages, whatever the home holds
    return env


# -- secrets ---------------------------------------------------------------------------------


def secret_needles(text: str) -> set[str]:
    """What would give away the secret file whose content is ``text``: a token in the forms
    it takes (hex as stored, base64 and repr of its bytes), or each body line of a PEM key."""
    needles: set[str] = set()
    if PRIVATE_KEY_MARK in text:
        body = [line.strip() for line in text.splitlines() if line and "-----" not in line]
        needles.update(line for line in body if len(line) >= 16)
        return needles
    token = text.strip()
    if len(token) >= 16:
        needles.add(token)
        try:
            raw = bytes.fromhex(token)
        except ValueError:
            return needles
        needles.add(base64.b64encode(raw).decode())
        needles.add(repr(raw)[2:-1])  # bytes' repr, without b'...'
    return needles


def harvest(home: Path, into: dict[str, set[str]]) -> None:
    """Read every secret file under ``home`` (``~/.clusterbook`` and the run directories):
    rendezvous tokens (files named ``token``), private keys, and the keys of ipyparallel
    engine sets (``ipcontroller-*.json``)."""
    # os.walk skips directories that vanish while it reads (a cluster stopping meanwhile).
    for directory, _, files in os.walk(home):
        for name in files:
            path = Path(directory, name)
            try:
                if path.stat().st_size > 64 * 1024:
                    continue
                text = path.read_text(errors="replace")
            except OSError:
                continue
            engines = name.startswith("ipcontroller-") and name.endswith(".json")
            if engines:
                text = _ipp_key(text)  # an engine set's connection file: its key
            is_secret = engines or name == "token" or PRIVATE_KEY_MARK in text
            if is_secret and (needles := secret_needles(text)):
                into.setdefault(str(path.relative_to(home)), set()).update(needles)


def _ipp_key(text: str) -> str:
    try:
        return str(json.loads(text).get("key") or "")
    except ValueError:
        return ""


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def _places(nb: nbformat.NotebookNode) -> Iterator[tuple[str, str]]:
    for i, cell in enumerate(nb.cells):
        yield f"cell {i} source", "\n".join(_strings(cell.get("source", "")))
        yield f"cell {i} outputs", "\n".join(_strings(cell.get("outputs", [])))
    yield "widget state and notebook metadata", "\n".join(_strings(nb.metadata))


def find_leaks(nb: nbformat.NotebookNode, secrets: dict[str, set[str]]) -> list[str]:
    """Where ``nb`` shows a secret (or anything marked as a private key): one line each."""
    leaks = []
    for where, text in _places(nb):
        folded = text.casefold()
        if PRIVATE_KEY_MARK in text and not where.endswith("source"):
            leaks.append(f"{where}: a private key ({PRIVATE_KEY_MARK!r})")
        for path, needles in sorted(secrets.items()):
            if any(n.casefold() in folded for n in needles):
                leaks.append(f"{where}: the content of ~/{path}")
    return leaks


# -- execution -------------------------------------------------------------------------------


def execute(
    source: Path, workdir: Path, *, probe: bool = True, startup: str | None = None
) -> Executed:
    """Run the notebook ``source`` in a copy of its directory under ``workdir`` and return it
    executed (raises nbclient's CellExecutionError when a cell fails). ``startup`` is code
    the kernel runs first (an IPython startup file in its home). Fails if a process of the
    notebook outlives its kernel."""
    from tests.conftest import wait_gone

    folder = workdir / "notebooks"
    shutil.copytree(source.parent, folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    home = workdir / "home"
    home.mkdir()
    if startup is not None:
        startup_dir = home / ".ipython" / "profile_default" / "startup"
        startup_dir.mkdir(parents=True)
        (startup_dir / "00-tests.py").write_text(startup)
    try:
        done = run_here(folder / source.name, home, probe=probe)
    finally:
        left = wait_gone(str(workdir), timeout=10)
        for p in left:
            p.kill()
    assert not left, f"processes outlived the kernel of {source.name}: {[p.info for p in left]}"
    return done


def run_here(path: Path, home: Path, *, probe: bool = True) -> Executed:
    """Run the notebook at ``path`` (in its folder) with nbclient in this process, in a kernel
    whose home is ``home``; the executed notebook is written beside ``home``."""
    folder, workdir = path.parent, home.parent
    nb = nbformat.read(path, as_version=4)
    if probe:
        nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    done = Executed(path.name, nb, home)
    stop = threading.Event()
    lock = threading.Lock()

    def watch() -> None:
        while not stop.wait(0.02):
            with lock:
                harvest(home, done.secrets)

    watcher = threading.Thread(target=watch, name="secret-harvest", daemon=True)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(folder)}},
        store_widget_state=True,
    )

    def after_cell(cell_index: int, **_: Any) -> None:
        with lock:
            harvest(home, done.secrets)
        done.states[cell_index] = copy.deepcopy(client.widget_state)

    client.on_cell_executed = after_cell
    watcher.start()
    try:
        client.execute(env=kernel_env(home))
    finally:
        stop.set()
        watcher.join()
        harvest(home, done.secrets)
        (workdir / f"executed-{path.name}").write_text(nbformat.writes(nb))
    return done


# -- as the Binder user ----------------------------------------------------------------------


def execute_as(user: LocalUser, source: Path, workdir: Path, *, probe: bool = True) -> Executed:
    """:func:`execute`, with nbclient and the kernel run as ``user`` (see
    :mod:`tests.notebooks.binder`); ``workdir`` must be one the user can reach. Fails if a
    process of the user's outlives the kernel. The run is traced (``strace -f``, as the user:
    the runner, its kernel and what they start): what it changed is ``Executed.changed``."""
    from tests.conftest import wait_gone
    from tests.users import wait_left

    folder = workdir / "notebooks"
    shutil.copytree(source.parent, folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for directory, dirs, files in os.walk(workdir):
        for name in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
            os.chown(name, user.uid, user.gid)
    home = user.new_home(workdir / "home")
    user.mark()
    argv = [sys.executable, "-m", "tests.notebooks.runner", str(folder / source.name), str(home)]
    log, trace = workdir / "runner.log", workdir / "files.trace"
    extra = [] if probe else ["--no-probe"]
    try:
        with log.open("wb") as out:
            done = subprocess.run(
                user.argv([*filetrace.argv(trace), *argv, *extra], REPO),  # as the user
                cwd=REPO,
                env=user.env(home),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=CELL_TIMEOUT * 20,
                check=False,
            )
    finally:
        left = [*wait_left(user, timeout=10), *wait_gone(str(workdir), timeout=1)]
        for p in left:
            p.kill()
    report = workdir / "run.json"
    if done.returncode != 0 or not report.exists():
        text = log.read_text(errors="replace")
        raise AssertionError(f"{source.name} failed as user {user.name}:\n{text[-6000:]}")
    assert not left, f"processes outlived the kernel of {source.name}: {[p.info for p in left]}"
    data = json.loads(report.read_text())
    nb = nbformat.read(workdir / f"executed-{source.name}", as_version=4)
    return Executed(
        source.name,
        nb,
        home,
        secrets={k: set(v) for k, v in data["secrets"].items()},
        states={int(k): v for k, v in data["states"].items()},
        changed=filetrace.changed(trace),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.notebooks.runner NOTEBOOK HOME``: :func:`run_here`, then what it
    found in ``HOME/../run.json`` (the executed notebook is written even if a cell fails)."""
    parser = argparse.ArgumentParser(prog="python -m tests.notebooks.runner")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("home", type=Path)
    parser.add_argument("--no-probe", dest="probe", action="store_false")
    args = parser.parse_args(argv)
    done = run_here(args.notebook, args.home, probe=args.probe)
    report = {
        "secrets": {k: sorted(v) for k, v in done.secrets.items()},
        "states": {str(k): v for k, v in done.states.items()},
    }
    (args.home.parent / "run.json").write_text(json.dumps(report))
    return 0


# -- reading outputs -------------------------------------------------------------------------


def code_cell(
    nb: nbformat.NotebookNode, start: str, *, whole: bool = False
) -> nbformat.NotebookNode:
    """The first code cell whose source starts with ``start`` (is ``start``, if ``whole``)."""
    for cell in nb.cells:
        if cell.cell_type == "code" and (
            cell.source == start if whole else cell.source.startswith(start)
        ):
            return cell
    raise AssertionError(f"no code cell {'is' if whole else 'starts with'} {start!r}")


def stream(cell: nbformat.NotebookNode, name: str = "stdout") -> str:
    """All the text ``cell`` wrote on ``name`` (stdout or stderr)."""
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == name)


def data(cell: nbformat.NotebookNode, mime: str) -> list[Any]:
    """The ``mime`` data of the cell's displays and results, in order."""
    return [o.data[mime] for o in cell.outputs if mime in o.get("data", {})]


def widget_state(nb: nbformat.NotebookNode) -> dict[str, Any]:
    """model id -> the model's stored state ({} when nothing was stored)."""
    stored = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {})
    return {k: v["state"] for k, v in stored.get("state", {}).items()}


def state_after(executed: Executed, cell: nbformat.NotebookNode) -> dict[str, Any]:
    """model id -> the model's state right after ``cell`` ran."""
    (index,) = [i for i, c in enumerate(executed.nb.cells) if c is cell]
    return executed.states[index]


def shown_models(nb: nbformat.NotebookNode, cell: nbformat.NotebookNode | None = None) -> list[str]:
    """Ids of the widgets the notebook's outputs (or one cell's) display."""
    cells = nb.cells if cell is None else [cell]
    return [
        view["model_id"] for c in cells if c.cell_type == "code" for view in data(c, WIDGET_VIEW)
    ]


def widget_html(state: dict[str, Any], model_id: str) -> list[str]:
    """The values of the HTML widgets in the tree of ``model_id``, depth first."""
    model = state[model_id]
    out = []
    if model.get("_model_name") == "HTMLModel":
        out.append(model.get("value", ""))
    for child in model.get("children", []):
        out += widget_html(state, child.removeprefix("IPY_MODEL_"))
    return out


def models_named(state: dict[str, Any], model_id: str, name: str) -> list[dict[str, Any]]:
    """The models of kind ``name`` (e.g. DropdownModel) in the tree of ``model_id``."""
    model = state[model_id]
    found = [model] if model.get("_model_name") == name else []
    for child in model.get("children", []):
        found += models_named(state, child.removeprefix("IPY_MODEL_"), name)
    return found


def kernel_python(executed: Executed) -> str:
    """The interpreter the kernel ran, as the probe cell printed it."""
    text = stream(executed.nb.cells[-1])
    for line in text.splitlines():
        if line.startswith("kernel python: "):
            return line.removeprefix("kernel python: ")
    raise AssertionError(f"the probe printed no interpreter: {text[:500]!r}")


def kernel_user(executed: Executed) -> tuple[int, int, list[int], str]:
    """The kernel's uid, gid, supplementary groups and home, as the probe cell printed them."""
    text = stream(executed.nb.cells[-1])
    for line in text.splitlines():
        if line.startswith("kernel user: "):
            uid, gid, rest = line.removeprefix("kernel user: ").split(" ", 2)
            groups, home = rest.rsplit("] ", 1)
            return int(uid), int(gid), json.loads(groups + "]"), home
    raise AssertionError(f"the probe printed no user: {text[:500]!r}")


if __name__ == "__main__":
    sys.exit(main())
