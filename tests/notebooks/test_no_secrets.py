"""Nothing secret leaks into a notebook: no rendezvous token, no private key, in any output,
stored widget state or repr.

The secrets are the files a cluster makes under ``~/.clusterbook`` (the kernel's home is a
fresh directory, so every one of them is the notebook's), read while the notebook runs. The
scan looks for each in the forms it could take; the tests at the end show it finds a secret
that is printed, shown in a widget, or marked as a private key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.notebooks.conftest import NAMES, NOTEBOOKS

#: Tutorials that start no cluster where they say so: tutorial 8 starts its Slurm cluster only
#: where Slurm answers (elsewhere it shows the batch job, a dry run).
STARTS_NONE_WHERE = {"08-schedulers.ipynb": "(no Slurm: nothing submitted)"}


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_no_secret_in_an_executed_notebook(
    name: str, executed: Callable[[str], Any], runner: ModuleType
) -> None:
    run = executed(name)
    source = (NOTEBOOKS / name).read_text(encoding="utf-8")
    said = "".join(runner.stream(c) for c in run.nb.cells if c.cell_type == "code")
    started = name not in STARTS_NONE_WHERE or STARTS_NONE_WHERE[name] not in said
    if started and any(word in source for word in ("Cluster.", "%cluster", "%%mpirun")):
        assert run.secrets, f"{name} starts clusters, yet no secret of theirs was found to check"
    assert runner.find_leaks(run.nb, run.secrets) == []


LEAKY = [
    "import clusterbook as cb\n\ncluster = cb.Cluster.local(workers=1, slots=1).start()",
    "from pathlib import Path\n\n"
    "(token,) = Path.home().glob('.clusterbook/clusters/*/token')\n"
    "print('the token is', token.read_text())",
    "import base64\n\nimport ipywidgets\n\n"
    "ipywidgets.HTML(base64.b64encode(bytes.fromhex(token.read_text())).decode())",
    "cluster.stop()",
]


@pytest.mark.mpi
def test_the_scan_finds_a_token_that_is_printed_or_shown(
    runner: ModuleType, openmpi_python: str, tmp_path: Path
) -> None:
    import nbformat

    source = tmp_path / "src" / "leaky.ipynb"
    source.parent.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in LEAKY])
    nbformat.write(nb, source)
    run = runner.execute(source, tmp_path / "run", probe=False)
    tokens = sorted(path for path in run.secrets if path.endswith("/token"))
    # The rendezvous token, and the control token in the cluster's run directory.
    (token,) = [path for path in tokens if path.startswith(".clusterbook/clusters/")]
    (control,) = [path for path in tokens if path.startswith(".local/state/clusterbook/runs/")]
    assert run.secrets[control]  # harvested like the other: a leak of it would be found
    assert runner.find_leaks(run.nb, run.secrets) == [
        f"cell 1 outputs: the content of ~/{token}",
        f"cell 2 outputs: the content of ~/{token}",  # the widget's text repr
        f"widget state and notebook metadata: the content of ~/{token}",
    ]


def test_the_scan_finds_a_private_key(runner: ModuleType, tmp_path: Path) -> None:
    import nbformat

    from clusterbook.ssh.keys import generate_keypair

    home = tmp_path / "home"
    keys = home / ".clusterbook" / "clusters" / "c1"
    keys.mkdir(parents=True)
    pair = generate_keypair(keys, "c1")
    secrets: dict[str, set[str]] = {}
    runner.harvest(home, secrets)
    (key,) = secrets
    assert key == str(pair.private_path.relative_to(home))
    body = pair.private_path.read_text().splitlines()[2]

    def notebook(text: str) -> Any:
        cell = nbformat.v4.new_code_cell("print(x)")
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        return nbformat.v4.new_notebook(cells=[cell])

    assert runner.find_leaks(notebook(f"...{body}..."), secrets) == [
        f"cell 0 outputs: the content of ~/{key}"
    ]
    assert runner.find_leaks(notebook("-----BEGIN OPENSSH PRIVATE KEY-----"), {}) == [
        "cell 0 outputs: a private key ('PRIVATE KEY-----')"
    ]
    assert runner.find_leaks(notebook(pair.public_line), secrets) == []


def test_the_scan_finds_an_engine_sets_key(runner: ModuleType, tmp_path: Path) -> None:
    import json

    import nbformat

    home = tmp_path / "home"
    security = home / "runs" / "r1" / "ipyparallel" / "controller-1" / "security"
    security.mkdir(parents=True)
    key = "0f" * 32
    for name in ("ipcontroller-client.json", "ipcontroller-engine.json"):
        (security / name).write_text(json.dumps({"key": key, "location": "127.0.0.1"}))
    (security.parent / "job.json").write_text(json.dumps({"argv": ["python"], "np": 2}))
    secrets: dict[str, set[str]] = {}
    runner.harvest(home, secrets)
    assert sorted(Path(k).name for k in secrets) == [
        "ipcontroller-client.json",
        "ipcontroller-engine.json",
    ]
    cell = nbformat.v4.new_code_cell("rc")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"key={key}")]
    leaks = runner.find_leaks(nbformat.v4.new_notebook(cells=[cell]), secrets)
    assert len(leaks) == 2
    assert all(leak.startswith("cell 0 outputs: the content of ~/runs/") for leak in leaks)
