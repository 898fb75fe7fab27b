"""The node program run from its files: ``python [-S] .../clusterbook/nodes/tasks TASK [ARGS]``
(:data:`.program.ENTRY`), as the guard runs ``reap`` and a node runs a task under ``srun``.
With ``-S`` nothing of site-packages is importable, so nothing of clusterbook's is imported
but these modules, loaded under a package name of their own (:func:`.program.load`)."""

import os
import sys
from collections.abc import Callable


def _entry() -> Callable[[list[str]], None]:
    if __package__:  # python -m clusterbook.nodes.tasks
        from . import session

        return session.main
    from importlib.util import module_from_spec, spec_from_file_location

    here = os.path.dirname(os.path.abspath(__file__))
    spec = spec_from_file_location("clusterbook_node_program", os.path.join(here, "program.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"no node program in {here}")
    program = module_from_spec(spec)
    spec.loader.exec_module(program)
    entry: Callable[[list[str]], None] = program.load(here).main
    return entry


_entry()(sys.argv)
