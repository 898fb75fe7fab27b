"""``clusterbook export mpijob``: a command as a Kubeflow MPIJob manifest, printed as YAML (see
:mod:`clusterbook.export.mpijob`)."""

from __future__ import annotations

import argparse
import sys

from clusterbook.cli.job import (
    add_env_option,
    add_recovery_options,
    command,
    duration_arg,
    env_args,
    recovery_args,
)

__all__ = ["add_export"]


def add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``export`` and its ``mpijob`` to the ``clusterbook`` parser's subcommands."""
    from clusterbook.export.checks import SSH_AUTH_MOUNT_PATH

    export = sub.add_parser("export", help="write a job for another scheduler to run")
    kinds = export.add_subparsers(title="formats")
    mpijob = kinds.add_parser(
        "mpijob",
        help="a Kubeflow MPIJob (kubeflow.org/v2beta1) manifest, as YAML",
        description="Print a Kubeflow MPIJob that runs CMD as N ranks on worker pods of IMG, "
        "its launcher pod running 'clusterbook run' (per-rank output in its log); submit it "
        "with: kubectl apply -f FILE.",
        usage="clusterbook export mpijob --image IMG -n N [options] -- CMD [ARG ...]",
    )
    mpijob.add_argument(
        "--image",
        required=True,
        metavar="IMG",
        help="container image with clusterbook, its MPI, mpi4py, sshd and the program",
    )
    mpijob.add_argument(
        "-n", "-np", "--np", type=int, required=True, metavar="N", help="number of ranks"
    )
    mpijob.add_argument("--workers", type=int, metavar="W", help="worker pods (default: N / slots)")
    mpijob.add_argument(
        "--slots", type=int, default=1, metavar="S", help="ranks per worker pod (default 1)"
    )
    mpijob.add_argument(
        "--mpi", choices=["openmpi", "mpich"], default="openmpi", help="the image's MPI"
    )
    mpijob.add_argument(
        "--name", default="clusterbook", help="the MPIJob's name (default clusterbook)"
    )
    mpijob.add_argument("--namespace", metavar="NS", help="its namespace (default: kubectl's)")
    mpijob.add_argument(
        "--timeout",
        type=duration_arg("--timeout"),
        metavar="D",
        help="stop each attempt after D (seconds or text like 90s, 30m)",
    )
    add_recovery_options(mpijob)
    mpijob.add_argument("--wdir", metavar="DIR", help="the ranks' working directory in the image")
    add_env_option(mpijob)
    mpijob.add_argument(
        "--retention",
        metavar="D",
        help="keep the finished job this long, like 7d (ttlSecondsAfterFinished)",
    )
    mpijob.add_argument(
        "--clean",
        choices=["running", "all", "none"],
        default="running",
        help="pods deleted when the job ends (cleanPodPolicy; default running)",
    )
    mpijob.add_argument(
        "--ssh-auth-mount-path",
        default=SSH_AUTH_MOUNT_PATH,
        metavar="DIR",
        help=f"where the job's ssh key is mounted (default {SSH_AUTH_MOUNT_PATH})",
    )
    mpijob.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="CMD", help="program and arguments"
    )
    mpijob.set_defaults(func=_export_mpijob)


def _export_mpijob(args: argparse.Namespace) -> int:
    from clusterbook.export.mpijob import render_mpijob, to_yaml

    cmd = command(args.cmd, "clusterbook export mpijob --image IMG -n 2 -- python train.py")
    how = recovery_args(args)
    manifest = render_mpijob(
        cmd,
        np=args.np,
        image=args.image,
        name=args.name,
        namespace=args.namespace,
        workers=args.workers,
        slots_per_worker=args.slots,
        mpi=args.mpi,
        timeout=args.timeout,
        env=env_args(args.env),
        cwd=args.wdir,
        retention=args.retention,
        clean=args.clean,
        ssh_auth_mount_path=args.ssh_auth_mount_path,
        retries=how["retries"],
        backoff=how["backoff"],
        retry_on=how["retry_on"],
        deadline=how["deadline"],
        restarts=how["restarts"],
    )
    sys.stdout.write(to_yaml(manifest))
    return 0
