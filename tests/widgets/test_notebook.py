"""Whether a notebook watches: answered once, in the Jupyter layer, and asked by the core
through the ``clusterbook.jupyter`` entry points; in this process (no kernel) and in a real
kernel."""

from __future__ import annotations

from pathlib import Path

from clusterbook.jupyter import notebook_bars, notebook_prompt
from clusterbook_widgets.notebook import is_notebook_shell, prompt, running_shell, watching
from tests.widgets.kernel import run_cells


def test_a_notebook_kernel_is_told_by_its_shell() -> None:
    class ZMQInteractiveShell:  # ipykernel's shell, by the name it is asked by
        pass

    class TerminalInteractiveShell:
        pass

    assert is_notebook_shell(ZMQInteractiveShell())
    assert not is_notebook_shell(TerminalInteractiveShell())
    assert not is_notebook_shell(None)


def test_nobody_watches_a_process_that_is_no_kernel() -> None:
    assert not is_notebook_shell(running_shell())
    assert not watching()
    assert prompt() is None
    # ... and the core, asking through the entry points, hears the same.
    assert notebook_prompt() is None
    assert notebook_bars() is None


CHECK = """\
import getpass
from clusterbook.jupyter import notebook_bars, notebook_prompt
from clusterbook.ssh.credentials import prompt_where_asked
from clusterbook.views.progress import wanted
from clusterbook_widgets.notebook import watching
from clusterbook_widgets.progress import NotebookBar

print(watching(), notebook_prompt() is getpass.getpass, prompt_where_asked() is getpass.getpass,
      notebook_bars() is NotebookBar, wanted(None))
"""


def test_a_notebook_kernel_is_watched_and_the_core_hears_it(tmp_path: Path) -> None:
    (cell,) = run_cells([CHECK], tmp_path).nb.cells
    assert [o.get("text") for o in cell.outputs] == ["True True True True True\n"]
