"""The profiles file: where it is, how it is read and laid out, and which files are refused
(clusterbook.config). The directory is given, never patched in; the environment is a mapping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.config import (
    CONFIG_ENV,
    FILE_NAME,
    config_dir,
    find_profile,
    parse_profiles,
    read_profiles,
)
from clusterbook.errors import ProfileError, UnknownProfileError, UnsafePathError
from tests.users import LocalUser

TWO = """
# a comment
[profiles.laptop]
kind = "local"
workers = 2
life_span = "2h"
env = { OMP_NUM_THREADS = "1" }

[profiles.lab]
kind = "ssh"
hosts = ["node1:4", "node2:4"]
user = "alice"
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config directory of this user's, holding ``TWO``."""
    directory = tmp_path / "config"
    directory.mkdir(mode=0o700)
    (directory / FILE_NAME).write_text(TWO)
    (directory / FILE_NAME).chmod(0o600)
    return directory


# -- where --------------------------------------------------------------------------------------


def test_the_config_directory_is_the_variable_s_then_xdg_s_then_under_home() -> None:
    home = Path.home()
    assert config_dir({}) == home / ".config" / "clusterbook"
    assert config_dir({"XDG_CONFIG_HOME": "/x/cfg"}) == Path("/x/cfg/clusterbook")
    # The XDG spec: a relative XDG_CONFIG_HOME is ignored.
    assert config_dir({"XDG_CONFIG_HOME": "rel"}) == home / ".config" / "clusterbook"
    both = {"XDG_CONFIG_HOME": "/x/cfg", CONFIG_ENV: "/y/mine"}
    assert config_dir(both) == Path("/y/mine")
    assert config_dir({CONFIG_ENV: "~/conf"}) == home / "conf"


# -- reading -------------------------------------------------------------------------------------


def test_profiles_are_read_in_the_file_s_order_with_their_options(config: Path) -> None:
    profiles = read_profiles(config)
    assert profiles.path == config / FILE_NAME
    assert list(profiles.by_name) == ["laptop", "lab"]
    laptop = profiles.by_name["laptop"]
    assert laptop.kind == "local"
    assert dict(laptop.spec) == {
        "kind": "local",
        "workers": 2,
        "life_span": "2h",
        "env": {"OMP_NUM_THREADS": "1"},
    }
    assert cb.profiles(config)["lab"] == {
        "kind": "ssh",
        "hosts": ["node1:4", "node2:4"],
        "user": "alice",
    }


def test_no_file_is_no_profiles_and_a_profile_asked_for_says_where_to_write_it(
    tmp_path: Path,
) -> None:
    assert cb.profiles(tmp_path) == {}
    with pytest.raises(UnknownProfileError) as caught:
        find_profile("lab", tmp_path)
    message = str(caught.value)
    assert f"there is no profiles file {tmp_path / FILE_NAME}" in message
    assert "$CLUSTERBOOK_CONFIG, else $XDG_CONFIG_HOME/clusterbook" in message
    assert '[profiles.laptop]\nkind = "local"' in message
    assert caught.value.known == ()


def test_a_missing_profile_lists_those_there_are_and_the_closest(config: Path) -> None:
    with pytest.raises(UnknownProfileError) as caught:
        find_profile("labb", config)
    message = str(caught.value)
    assert f"the profiles in {config / FILE_NAME} are 'laptop', 'lab'" in message
    assert "Did you mean 'lab'?" in message
    assert "add a table [profiles.labb]" in message
    assert caught.value.known == ("laptop", "lab")
    assert caught.value.profile == "labb"
    assert isinstance(caught.value, LookupError)


# -- the file's layout --------------------------------------------------------------------------


def test_text_that_is_not_toml_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    with pytest.raises(ProfileError) as caught:
        parse_profiles('[profiles.a]\nkind = "local"\nworkers = \n', path)
    assert f"The profiles file {path} is not valid TOML" in str(caught.value)
    assert "line 3" in str(caught.value)
    assert caught.value.path == str(path)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[laptop]\nkind = "local"\n', "has 'laptop' at its top level"),
        ('profiles = "laptop"\n', "'profiles' in"),
        ("[profiles]\nlaptop = 3\n", "profiles.laptop in"),
        ("[profiles.laptop]\nworkers = 2\n", "Profile 'laptop' ([profiles.laptop] in"),
        ("[profiles.laptop]\nkind = 3\n", "has kind = 3, not a name"),
        ('[profiles."my laptop"]\nkind = "local"\n', "The profile name 'my laptop'"),
    ],
)
def test_a_file_not_laid_out_as_profiles_says_how_one_is(
    tmp_path: Path, text: str, said: str
) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profiles(text, tmp_path / FILE_NAME)
    assert said in str(caught.value)
    assert str(tmp_path / FILE_NAME) in str(caught.value)


def test_a_file_that_is_not_utf8_is_said_so(config: Path) -> None:
    (config / FILE_NAME).write_bytes(b'[profiles.a]\nkind = "\xff"\n')
    with pytest.raises(ProfileError, match="is not UTF-8 text"):
        read_profiles(config)


# -- whose file ----------------------------------------------------------------------------------


def test_a_profiles_file_others_can_write_is_refused_unread(config: Path) -> None:
    path = config / FILE_NAME
    path.write_text("this is not TOML, and is never parsed")
    path.chmod(0o602)
    with pytest.raises(UnsafePathError) as caught:
        read_profiles(config)
    message = str(caught.value)
    assert f"The profiles file {path} is writable by other users (mode 0602)" in message
    assert f"chmod go-w {path}" in message
    assert "CLUSTERBOOK_CONFIG=DIR" in message


def test_a_config_directory_others_can_write_is_refused(config: Path) -> None:
    config.chmod(0o777)
    with pytest.raises(UnsafePathError) as caught:
        read_profiles(config)
    assert f"The directory {config} (of {config / FILE_NAME}) is writable by other" in str(
        caught.value
    )


def test_a_directory_above_that_others_can_write_and_is_not_sticky_is_refused(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    mine = shared / "mine"
    mine.mkdir(mode=0o700)
    (mine / FILE_NAME).write_text(TWO)
    with pytest.raises(UnsafePathError, match=f"The directory {shared} .* not sticky"):
        read_profiles(mine)
    shared.chmod(0o1777)  # sticky, as /tmp: no one else can move what is ours out of it
    assert list(read_profiles(mine).by_name) == ["laptop", "lab"]


def test_a_link_to_a_file_of_one_s_own_is_followed(config: Path, tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir(mode=0o700)
    (config / FILE_NAME).rename(dotfiles / "clusterbook.toml")
    (config / FILE_NAME).symlink_to(dotfiles / "clusterbook.toml")
    assert list(read_profiles(config).by_name) == ["laptop", "lab"]
    dotfiles.chmod(0o757)  # where the link leads is what is checked
    with pytest.raises(UnsafePathError, match=f"The directory {dotfiles} "):
        read_profiles(config)


def test_a_profiles_file_of_another_user_is_refused(config: Path, other_user: LocalUser) -> None:
    path = config / FILE_NAME
    os.chown(path, other_user.uid, other_user.gid)
    with pytest.raises(UnsafePathError) as caught:
        read_profiles(config)
    assert f"(uid {other_user.uid}), not by you" in str(caught.value)
    assert str(caught.value).startswith(f"The profiles file {path} is owned by ")
