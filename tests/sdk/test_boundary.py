"""The core never imports the Jupyter stack; the notebook layer loads only on request."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

#: What a notebook brings, which a plain interpreter never loads: the Jupyter stack, and the
#: notebook side of tqdm (``tqdm.auto`` picks it where IPython runs).
NOTEBOOK_MODULES = (
    "IPython",
    "ipykernel",
    "ipyparallel",
    "ipywidgets",
    "comm",
    "jupyter_client",
    "traitlets",
    "zmq",
    "tqdm.auto",
    "tqdm.autonotebook",
    "tqdm.notebook",
)

LOADED = """
loaded = sorted(m for m in sys.modules
                if any(m == n or m.startswith(n + ".") for n in {names!r}))
print(",".join(loaded))
"""

CHECK = """\
import sys
import clusterbook, clusterbook.cli.main, clusterbook.cluster.facade, clusterbook.rendezvous.agent
c = clusterbook.Cluster.local(workers=1, slots=1)
repr(c)
"""


def _loaded_after(code: str, names: tuple[str, ...]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + LOADED.format(names=names)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_core_imports_no_jupyter_module():
    assert _loaded_after(CHECK, (*NOTEBOOK_MODULES, "clusterbook_widgets")) == []


def test_torch_is_imported_only_by_what_uses_it():
    # torch is optional: clusterbook.torch imports it when a store or a handler is made.
    assert _loaded_after(CHECK + "import clusterbook.torch\n", ("torch",)) == []


BARS = """\
import sys
import clusterbook as cb
from clusterbook.testing import FakeProvider

cluster = cb.Cluster(FakeProvider(nodes=2))
cluster.start(progress=True)
cluster.wait_ready(5, progress=True)
cluster.stop()
"""


def test_bars_drawn_outside_a_notebook_import_no_notebook_module():
    # The core asks the Jupyter layer whether a notebook watches (it may load to answer), and
    # the answer here, no, costs none of the notebook's modules.
    assert _loaded_after(BARS, NOTEBOOK_MODULES) == []


WAITS = """\
import sys
import threading
from clusterbook.waiting import each, pause, wait_until

done = threading.Event()
done.set()
assert wait_until(done.wait, 1.0)
pause(0.01)
assert list(each([1, 2])) == [1, 2]
"""


def test_waits_outside_a_notebook_import_no_notebook_module():
    # A job's wait asks the Jupyter layer for a pump (it may load to answer); outside a
    # notebook's kernel the answer, none, costs none of the notebook's modules.
    assert _loaded_after(WAITS, NOTEBOOK_MODULES) == []


def test_importing_the_core_does_not_import_pandas():
    # pandas costs ~0.3 s; the CLI and rank-side imports should not pay it up front.
    code = "import sys, clusterbook; print('pandas' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


AGENT_IMPORTS = """\
import sys
import clusterbook.cli.main, clusterbook.rendezvous.agent, clusterbook.rendezvous.backends.tcp
print(",".join(sorted(m for m in sys.modules
                      if m in {"clusterbook.cluster.facade", "clusterbook.launch.job", "pandas",
                               "paramiko", "clusterbook.providers.ssh.provider"})))
"""


def test_a_node_agent_imports_only_what_it_runs():
    # Every node of an SSH cluster starts an agent; on a node with few cores the whole
    # SDK (cluster, launch, paramiko) would add ~80 ms of CPU to each bootstrap.
    out = subprocess.run(
        [sys.executable, "-c", AGENT_IMPORTS],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == ""


def test_the_public_names_resolve_on_first_use():
    import clusterbook

    for name in clusterbook.__all__:
        assert getattr(clusterbook, name) is not None, name
        assert name in dir(clusterbook)
    from clusterbook import Cluster
    from clusterbook.cluster.facade import Cluster as Defined

    assert Cluster is Defined
    with pytest.raises(AttributeError, match="Clustr"):
        clusterbook.Clustr  # noqa: B018 - the typo is the test


def test_load_ext_clusterbook_loads_the_notebook_layer():
    code = (
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'clusterbook')\n"
        "import sys; print('clusterbook_widgets' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("True")


SDK = Path(__file__).resolve().parents[2] / "sdk" / "clusterbook"


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_no_module_of_the_core_imports_the_jupyter_layer():
    # Not at import time, not inside a function: the Jupyter layer plugs in (entry points).
    offenders = {}
    for path in sorted(SDK.rglob("*.py")):
        found = [
            m
            for m in _imports(ast.parse(path.read_text()))
            if m.split(".")[0] == "clusterbook_widgets"
        ]
        if found:
            offenders[str(path.relative_to(SDK))] = found
    assert offenders == {}
    assert len(list(SDK.rglob("*.py"))) > 40  # the walk did see the package


def test_whether_a_notebook_watches_is_answered_by_the_jupyter_layer_alone():
    # The core asks clusterbook_widgets.notebook (through the entry points); it never looks
    # for a notebook's kernel itself.
    asking = sorted(
        str(path.relative_to(SDK))
        for path in SDK.rglob("*.py")
        if "ZMQInteractiveShell" in path.read_text()
    )
    assert asking == []
    widgets = SDK.parents[1] / "widgets" / "clusterbook_widgets"
    answering = [p.name for p in widgets.rglob("*.py") if "ZMQInteractiveShell" in p.read_text()]
    assert answering == ["notebook.py"]


def test_the_facade_never_probes_its_provider():
    # Every member the cluster uses is in the provider contract: no getattr/hasattr on it.
    tree = ast.parse((SDK / "cluster/facade.py").read_text())
    probes = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"getattr", "hasattr"}
    ]
    assert probes == []


def test_the_jupyter_layer_imports_no_ipywidgets_until_a_widget_is_made():
    code = (
        "import sys, clusterbook_widgets\n"
        "before = 'ipywidgets' in sys.modules\n"
        "clusterbook_widgets.Throttle\n"
        "middle = 'ipywidgets' in sys.modules\n"
        "clusterbook_widgets.ClusterWidget\n"
        "print(before, middle, 'ipywidgets' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False", "True"]
