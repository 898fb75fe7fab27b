"""``clusterbook worker serve``: this host as a worker of the SageMaker training job or MPIJob
it runs in, until the job's leader is done with it (see
:mod:`clusterbook.providers.environment.worker`)."""

from __future__ import annotations

import argparse
import signal
import sys

__all__ = ["add_serve"]


def add_serve(worker_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` to the ``clusterbook worker`` parser's subcommands."""
    from clusterbook.providers.environment.worker import DEFAULT_LEASE, DEFAULT_WAIT

    serve = worker_sub.add_parser(
        "serve",
        help="serve this host to the leader of its training job until the leader is done",
        description="On a host of a SageMaker training job or a Kubeflow MPIJob that does not "
        "lead it: start a user-level sshd that lets in the home's ~/.ssh/authorized_keys (and "
        "an MPIJob's key), then wait until the cluster of the job's leader says it is done "
        "with this host (exit 0), or the leader is gone (exit 1, saying why).",
    )
    serve.add_argument(
        "--port",
        type=int,
        help="sshd's port (default: the one the leader's clusterbook uses: 22 in a SageMaker "
        "job, 2222 in an MPIJob)",
    )
    serve.add_argument(
        "--lease",
        type=float,
        default=DEFAULT_LEASE,
        metavar="S",
        help="seconds to wait for the leader's word once its cluster's agent here stopped "
        f"(default {DEFAULT_LEASE:g})",
    )
    serve.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT,
        metavar="S",
        help=f"seconds to wait for the leader's cluster to reach this host "
        f"(default {DEFAULT_WAIT:g})",
    )
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from clusterbook.providers.environment.worker import serve_worker

    def say(text: str) -> None:
        print(f"clusterbook: {text}", flush=True)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # serve_worker stops sshd on the way out

    signal.signal(signal.SIGTERM, stop)
    cluster = serve_worker(port=args.port, lease=args.lease, wait=args.wait, on_ready=say)
    print(f"clusterbook: the leader is done with this host (cluster {cluster})", file=sys.stderr)
    return 0
