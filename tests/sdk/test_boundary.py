"""The core never imports the Jupyter stack; the notebook layer loads only on request."""

from __future__ import annotations

import subprocess
import sys

CHECK = """\
import sys
import clusterbook, clusterbook.cli, clusterbook.cluster
c = clusterbook.Cluster.local(workers=1, slots=1)
repr(c)
bad = sorted(m for m in sys.modules
             if m.split(".")[0] in {"IPython", "ipywidgets", "ipyparallel", "traitlets",
                                    "ipykernel", "clusterbook_widgets"})
print(",".join(bad))
"""


def test_core_imports_no_jupyter_module():
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_importing_the_core_does_not_import_pandas():
    # pandas costs ~0.3 s; the CLI and rank-side imports should not pay it up front.
    code = "import sys, clusterbook; print('pandas' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


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
