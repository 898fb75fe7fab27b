"""Notebooks run the way Binder runs them: as an unprivileged user (uid 1000, no sudo), in a
home of its own, with no sshd and no Slurm of the system's (how the account is made and its
programs run: :mod:`tests.users`). The uid is Binder's (repo2docker's ``NB_UID``), which may
already be someone's there: the account shares it (``useradd -o``).

Not as root (a laptop), the current user is already such a user: notebooks run as it.
"""

from __future__ import annotations

from tests.users import LocalUser, make_user

UID = GID = 1000


def make_binder_user() -> LocalUser:
    """The user notebooks run as: a new uid 1000 account as root, else the current user."""
    return make_user(
        UID,
        GID,
        prefix="cbbinder",
        comment="clusterbook tests, a Binder user",
        imports="clusterbook, mpi4py, nbclient",
    )
