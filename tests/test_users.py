"""The other local user the security tests run as is truly another user: its own uid, no
group of ours, and no way into what is private to the user running the tests."""

from __future__ import annotations

import os

import pytest

from tests.users import LocalUser


@pytest.mark.root
def test_the_other_user_is_someone_else_and_cannot_read_a_private_file(
    other_user: LocalUser, tmp_path
):
    secret = tmp_path / "secret"
    secret.write_text("mine")
    secret.chmod(0o600)
    tmp_path.chmod(0o755)
    done = other_user.run_python(
        "import os, sys\n"
        "print(os.getuid(), os.getgid(), os.getgroups())\n"
        "try:\n    open(sys.argv[1]).read()\nexcept PermissionError:\n    print('refused')\n",
        str(secret),
    )
    assert done.returncode == 0, done.stderr
    ids, refused = done.stdout.splitlines()
    uid, gid, groups = ids.split(maxsplit=2)
    assert int(uid) == other_user.uid != os.getuid()
    assert int(gid) == other_user.gid != os.getgid()
    assert groups == "[]"
    assert refused == "refused"
