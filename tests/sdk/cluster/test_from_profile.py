"""``Cluster.from_profile``: a profile's spec with the overrides given, checked as any spec is,
every complaint naming the profile, its file and the key; and a real local cluster made from
one. The config directory is given (``config_dir=``), never patched in."""

from __future__ import annotations

from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.cluster.profile import profile_spec
from clusterbook.config import FILE_NAME, find_profile
from clusterbook.errors import ProfileError, UnknownProfileError


def write(directory: Path, text: str) -> Path:
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / FILE_NAME
    path.write_text(text)
    return path


PROFILES = """
[profiles.small]
kind = "local"
workers = 2
slots = 1
idle_timeout = "30m"
env = { A = "1", B = "2" }

[profiles.lab]
kind = "ssh"
hosts = ["node1:4"]
usr = "alice"

[profiles.zero]
kind = "local"
workers = 0

[profiles.later]
kind = "local"
life_span = "soon"

[profiles.nowhere]
kind = "cloud"
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    directory = tmp_path / "config"
    write(directory, PROFILES)
    return directory


def test_a_profile_makes_its_cluster_with_its_options(config: Path) -> None:
    cluster = cb.Cluster.from_profile("small", config_dir=config)
    assert cluster.kind == "local"
    assert [n.slots for n in cluster.nodes] == [1, 1]
    assert cluster._options.idle_timeout == 1800.0
    assert dict(cluster._options.env) == {"A": "1", "B": "2"}


def test_overrides_replace_the_profile_s_keys_whole(config: Path) -> None:
    cluster = cb.Cluster.from_profile(
        "small", config_dir=config, name="mine", slots=3, env={"C": "3"}
    )
    assert cluster.name == "mine"  # a cluster option named like from_profile's own argument
    assert [n.slots for n in cluster.nodes] == [3, 3]
    assert dict(cluster._options.env) == {"C": "3"}
    assert cluster._options.idle_timeout == 1800.0  # what was not overridden stays


def test_the_spec_a_detached_supervisor_gets_is_the_merged_one(config: Path) -> None:
    spec = profile_spec(find_profile("small", config), {"workers": 1})
    assert spec == {
        "kind": "local",
        "workers": 1,
        "slots": 1,
        "idle_timeout": "30m",
        "env": {"A": "1", "B": "2"},
    }


def test_a_key_the_kind_does_not_take_is_named_with_the_closest(config: Path) -> None:
    with pytest.raises(ProfileError) as caught:
        cb.Cluster.from_profile("lab", config_dir=config)
    message = str(caught.value)
    assert f"Profile 'lab' ({config / FILE_NAME}) makes a cluster of kind 'ssh'" in message
    assert "which takes no 'usr'; did you mean 'user'?" in message
    assert "That kind takes hosts, user, identity" in message
    assert "Rename or remove 'usr' (under [profiles.lab])" in message
    assert caught.value.profile == "lab"
    assert caught.value.path == str(config / FILE_NAME)


def test_a_key_given_that_the_kind_does_not_take_says_it_was_given(config: Path) -> None:
    with pytest.raises(ProfileError, match=r"Rename or remove 'hosts' \(given in the call\)"):
        cb.Cluster.from_profile("small", config_dir=config, hosts=["a"])


def test_a_bad_value_names_the_profile_the_file_the_key_and_the_fix(config: Path) -> None:
    with pytest.raises(ProfileError) as caught:
        cb.Cluster.from_profile("zero", config_dir=config)
    path = config / FILE_NAME
    assert str(caught.value) == (
        f"Profile 'zero' ({path}, key 'workers'): workers must be >= 1, got 0. Fix workers "
        f"under [profiles.zero] in {path}, or override it in the call."
    )
    said = r"key 'life_span'\): life_span must be a duration > 0, got 'soon'"
    with pytest.raises(ProfileError, match=said):
        cb.Cluster.from_profile("later", config_dir=config)


def test_a_bad_value_its_message_does_not_name_is_found_by_the_value(tmp_path: Path) -> None:
    config = tmp_path / "config"
    write(config, '[profiles.odd]\nkind = "local"\nenv = { "NO SPACES" = "1" }\n')
    with pytest.raises(ProfileError) as caught:
        cb.Cluster.from_profile("odd", config_dir=config)
    assert "key 'env'): Environment variable name 'NO SPACES' is invalid" in str(caught.value)
    assert "Fix env under [profiles.odd]" in str(caught.value)


def test_a_bad_value_given_names_it_as_given(config: Path) -> None:
    with pytest.raises(ProfileError) as caught:
        cb.Cluster.from_profile("small", config_dir=config, idle_timeout="later")
    assert "key 'idle_timeout'): idle_timeout must be a duration" in str(caught.value)
    assert "got 'later'" in str(caught.value)
    assert "Fix the value given for idle_timeout (it overrides the profile's)." in str(caught.value)


def test_an_unknown_kind_lists_the_known_ones(config: Path) -> None:
    with pytest.raises(ProfileError) as caught:
        cb.Cluster.from_profile("nowhere", config_dir=config)
    assert "key 'kind'): Unknown cluster kind 'cloud'; the known kinds are" in str(caught.value)


def test_a_profile_keeps_its_kind(config: Path) -> None:
    with pytest.raises(ProfileError, match="a profile keeps its kind"):
        cb.Cluster.from_profile("small", config_dir=config, kind="ssh")


def test_a_missing_profile_lists_those_there_are(config: Path) -> None:
    with pytest.raises(UnknownProfileError, match="are 'small', 'lab', 'zero', 'later'"):
        cb.Cluster.from_profile("big", config_dir=config)


def test_the_config_directory_comes_from_the_environment(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERBOOK_CONFIG", str(config))
    assert cb.Cluster.from_profile("small").kind == "local"


@pytest.mark.mpi
def test_a_local_cluster_from_a_profile_runs_a_job(tmp_path: Path, openmpi_python: str) -> None:
    config = tmp_path / "config"
    write(
        config,
        f'[profiles.two]\nkind = "local"\nworkers = 2\nslots = 1\npython = "{openmpi_python}"\n'
        'env = { GREETING = "from the profile" }\n',
    )
    with cb.Cluster.from_profile("two", config_dir=config, run_dir=tmp_path / "run") as cluster:
        assert [n.name for n in cluster.nodes] == ["local-0", "local-1"]
        job = cluster.mpirun(
            ["python", "-c", "import os; print(os.environ['GREETING'])"], timeout=120
        )
        result = job.wait()
    assert result.ok, result.summary()
    assert job.logs().line.tolist() == ["from the profile"] * 2
