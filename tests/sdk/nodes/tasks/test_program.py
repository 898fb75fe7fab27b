"""The node program as it is sent (its modules joined into one source) and as it is run from
files (a node's installed clusterbook, the guard, a task under srun)."""

from __future__ import annotations

import ast
import json
import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterbook.nodes.tasks import program
from clusterbook.nodes.tasks.common import JOB_ENV
from clusterbook.nodes.tasks.procs import tagged

HERE = Path(program.ENTRY)
JOINED = (*program.MODULES, program.ENTRY_MODULE)


def _tree(name: str) -> ast.Module:
    return ast.parse((HERE / f"{name}.py").read_text(), f"{name}.py")


def _defined(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (not those it imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_every_module_of_the_package_is_joined_in_an_order_its_imports_allow() -> None:
    found = {p.stem for p in HERE.glob("*.py")} - {"__init__", "__main__", "program"}
    assert sorted(found) == sorted(JOINED)
    defined: dict[str, str] = {}  # name -> the module that defines it
    for name in JOINED:
        tree = _tree(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                # Its own imports: at the top level, from a module joined before it, of names
                # that module defines (in the joined source they are simply there).
                assert node in tree.body, f"{name}: {ast.unparse(node)} is not at the top level"
                assert node.level == 1, ast.unparse(node)
                assert node.module in defined.values(), ast.unparse(node)
                for alias in node.names:
                    assert alias.asname is None, f"{name}: {ast.unparse(node)} renames"
                    assert defined.get(alias.name) == node.module, (name, alias.name)
            elif isinstance(node, ast.ImportFrom):
                assert node.module != "__future__", f"{name}: a __future__ import mid-source"
        twice = {n: defined[n] for n in _defined(tree) if n in defined}
        assert twice == {}, f"{name} defines names of other modules again"
        defined.update(dict.fromkeys(_defined(tree), name))
    # The package's own module runs nothing: it is neither sent nor run on the fast path.
    init = _tree("__init__")
    assert len(init.body) == 1
    assert isinstance(init.body[0], ast.Expr)


def test_the_joined_source_is_the_program_with_nothing_else_of_clusterbook() -> None:
    source = program.source()
    tree = ast.parse(source)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    # Run as a node runs it (no site-packages: nothing of clusterbook importable), it does a
    # task, and has imported neither clusterbook nor typing (3 ms of every start).
    check = (
        "import sys; source = sys.stdin.read(); sys.argv = ['-c', 'free_port', '{}'];"
        "exec(compile(source, 'node', 'exec'), {'__name__': '__main__'});"
        "print(sorted(m for m in sys.modules if m.startswith(('clusterbook', 'typing'))))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", check], input=source, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    reply, loaded = done.stdout.splitlines()
    assert isinstance(json.loads(reply)["port"], int)
    assert loaded == "[]"


def _compiled() -> None:
    """The bytecode of the package's modules where Python keeps it (an installed clusterbook
    has it; this checkout may run with PYTHONDONTWRITEBYTECODE)."""
    for path in HERE.glob("*.py"):
        py_compile.compile(str(path), doraise=True)


def _run(argv: list[str], env: dict[str, str]) -> tuple[dict[str, object], list[str]]:
    """The probe's facts and the code objects Python loaded (``-v``) for ``argv``."""
    done = subprocess.run(
        [argv[0], "-v", *argv[1:]], input=b"{}", capture_output=True, check=True, env=env
    )
    facts: dict[str, object] = json.loads(done.stdout.decode().splitlines()[-1])
    said = done.stderr.decode().splitlines()
    return facts, [line for line in said if "code object from" in line]


def test_a_node_with_the_same_modules_runs_their_bytecode_and_another_version_is_compiled(
    tmp_path: Path,
) -> None:
    _compiled()
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = program.command(sys.executable, "probe", "-")
    # This interpreter has clusterbook, and so these very modules: their bytecode is used.
    facts, loaded = _run(argv, env)
    assert facts["python"] == sys.executable
    cache = f"{HERE}/__pycache__/"
    for name in JOINED:
        assert any(cache + f"{name}." in line for line in loaded), (name, loaded)
    # Another version's source (one that differs from the installed modules) is compiled and
    # run; only the program's loader was read from bytecode.
    argv[3] += "\n# another version\n"
    facts, loaded = _run(argv, env)
    assert facts["python"] == sys.executable
    assert [line for line in loaded if cache in line] == [
        line for line in loaded if f"{cache}program." in line
    ]


def _wait_for(check: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_the_entry_runs_the_program_from_its_files_without_site_packages() -> None:
    # As a task under srun runs: python -S ENTRY TASK JSON.
    done = subprocess.run(
        [sys.executable, "-S", program.ENTRY, "free_port", "{}"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout)["port"], int)
    # As the guard runs: python -S ENTRY reap, which kills the jobs still registered when its
    # input ends (the process it guards has died).
    token = f"cb-entry-{os.getpid()}-{time.monotonic_ns()}"
    job = subprocess.Popen(["sleep", "60"], env={**os.environ, JOB_ENV: token})
    guard = subprocess.Popen(
        [sys.executable, "-S", program.ENTRY, "reap"], stdin=subprocess.PIPE, text=True
    )
    try:
        assert _wait_for(lambda: tagged([token]) == [job.pid])
        assert guard.stdin is not None
        guard.stdin.write(f"+ {token}\n+ other\n- other\n")
        guard.stdin.close()
        assert guard.wait(timeout=15) == 0
        assert job.wait(timeout=5) != 0
    finally:
        for proc in (job, guard):
            proc.kill()
            proc.wait()


def test_python_m_runs_the_package_too() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clusterbook.nodes.tasks", "free_port", "{}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout)["port"], int)


@pytest.mark.parametrize(
    "text",
    [
        "x = 1\n",
        '"""doc"""\n\nimport os\n\nfrom .a import (\n    b,\n)\nfrom .c import d\n\n\n'
        "def f():\n    pass\n",
    ],
)
def test_own_imports_are_left_out_of_the_joined_source(text: str) -> None:
    joined = program._without_own_imports(text)
    assert "from ." not in joined
    assert ast.dump(ast.parse(joined)) == ast.dump(
        ast.Module(
            [n for n in ast.parse(text).body if not (isinstance(n, ast.ImportFrom) and n.level)],
            [],
        )
    )
