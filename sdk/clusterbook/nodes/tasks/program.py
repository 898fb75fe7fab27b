"""The node program as it is sent and run: its modules joined into one source, the command
that runs it on a node, and how a node whose clusterbook has the same modules runs its own
bytecode of them instead.

A node need have nothing installed: ``python -c STUB SOURCE TASK ARGS`` runs the program
from the source it is given. Compiling that source costs a node 13 ms of CPU at every start,
so the stub first looks for clusterbook in the node's Python (without importing it), joins
the modules it finds there the way :func:`source` joins them here, and when that is the
source it was sent, loads those modules (:func:`load`), from the bytecode Python keeps for
them. Another version of clusterbook there, or none, and the source is compiled.

Plain stdlib, loaded on nodes by its path alone: it imports none of its package's modules.
"""

import os
import sys
from types import ModuleType

#: The package's modules in the order they are joined: each imports only those before it
#: (the package's ``__init__`` holds its docstring alone, and is neither sent nor run).
MODULES = ("common", "cpus", "probe", "procs", "files", "install", "commands")
#: The module joined last, which holds ``main``: the program's entry.
ENTRY_MODULE = "session"
#: The package's directory, here: ``python [-S] ENTRY TASK [ARGS]`` runs the program from its
#: files (its ``__main__``), as the guard does and a task under ``srun``.
ENTRY = os.path.dirname(os.path.abspath(__file__))
#: The name its modules are loaded under by :func:`load` (never clusterbook's own package).
PACKAGE = "clusterbook_node_tasks"


def _without_own_imports(text: str) -> str:
    """``text`` without its ``from .module import ...`` statements: in the joined source,
    every module's names are in one namespace already. They are the last block of a
    module's imports (where isort puts them), ended by its first blank line."""
    start = text.find("\nfrom .") + 1
    if not start:
        return text
    return text[:start] + text[text.index("\n\n", start) + 1 :]


def source(directory: str = ENTRY) -> str:
    """The program's modules in ``directory`` (a clusterbook's ``nodes/tasks``) as one
    source, run as ``__main__``: the same text wherever the same modules are."""
    parts = []
    for name in (*MODULES, ENTRY_MODULE):
        with open(os.path.join(directory, name + ".py"), encoding="utf-8") as f:
            parts.append(_without_own_imports(f.read()))
    parts.append('\nif __name__ == "__main__":\n    main(sys.argv)\n')
    return "\n\n".join(parts)


def load(directory: str = ENTRY, name: str = PACKAGE) -> ModuleType:
    """The program's modules in ``directory`` imported as the package ``name``, each from the
    bytecode Python keeps for it (as any import), without importing clusterbook: its entry
    module. Each is loaded by its path, in order, so that no import searches for one; the
    package's ``__init__`` (its docstring alone) is not run."""
    from importlib.util import module_from_spec, spec_from_file_location

    package = ModuleType(name, "The node program (clusterbook.nodes.tasks), loaded by path.")
    package.__path__ = [directory]
    sys.modules[name] = package
    module = package
    for part in (*MODULES, ENTRY_MODULE):
        spec = spec_from_file_location(f"{name}.{part}", os.path.join(directory, f"{part}.py"))
        if spec is None or spec.loader is None:
            raise ImportError(f"no node program in {directory}")
        module = module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


# How a node runs the program: ``python -c STUB SOURCE ARGS...`` (see the module's docstring).
STUB = """\
import sys
def _run(source, argv):
    try:
        from importlib.machinery import SourceFileLoader
        from importlib.util import find_spec, module_from_spec, spec_from_loader
        here = find_spec("clusterbook").submodule_search_locations[0] + "/nodes/tasks"
        loader = SourceFileLoader("clusterbook_node_program", here + "/program.py")
        program = module_from_spec(spec_from_loader(loader.name, loader))
        loader.exec_module(program)
        same = program.source(here) == source
    except Exception:
        same = False
    if same:
        program.load(here).main(argv)
    else:
        sys.argv = argv
        exec(compile(source, "<clusterbook node tasks>", "exec"), {"__name__": "__main__"})
_run(sys.argv[1], ["-c", *sys.argv[2:]])
"""

_sent: list[str] = []  # the source, read once on the head


def command(python: str, *args: str) -> list[str]:
    """The command that runs the node program with ``args`` (``session``, or a task and its
    JSON, ``-`` for stdin) with ``python`` on a node."""
    if not _sent:
        _sent.append(source())
    return [python, "-c", STUB, _sent[0], *args]
