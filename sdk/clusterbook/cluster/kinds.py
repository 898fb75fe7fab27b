"""How a cluster of each kind is made: ``Cluster.local``, ``ssh``, ``elastic``, ``slurm``,
``from_hostfile``, ``from_environment``, ``from_profile``, and ``attach`` for one another
process runs.

:class:`ClusterKinds` holds these constructors for :class:`~clusterbook.cluster.facade.Cluster`,
which inherits them: each says what its kind takes and turns it into a spec for
``Cluster.from_spec``; and :meth:`ClusterKinds.job_script`, what a Slurm cluster submits.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from clusterbook.durations import Duration
from clusterbook.gpus import Slots
from clusterbook.spec import read_hostfile

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

    from clusterbook.cluster.handle import Head
    from clusterbook.cluster.local_head import LocalHead
    from clusterbook.cluster.remote.attached import AttachedCluster
    from clusterbook.providers.environment.detect import Runner
from clusterbook.cluster.options import ClusterOptionsArgs, ElasticArgs, SlurmArgs, SSHArgs

__all__ = ["ClusterKinds"]


class ClusterKinds:
    """The constructors of a cluster of each kind (see the module's docstring)."""

    _local: LocalHead  # what the cluster was made of (its provider and options)
    _head: Head  # what runs it: the local head, or a detached cluster's supervisor

    def job_script(self) -> str:
        """A Slurm cluster's batch script, as ``start()`` submits it, its ``sbatch`` options
        as ``#SBATCH`` lines: a dry run, before or after ``start()`` (before, the rendezvous's
        URL and token file, which ``start()`` makes, are placeholders; a detached cluster's
        supervisor, which submitted it, shows it once started). Other kinds submit none: a
        :class:`~clusterbook.errors.ConfigError`."""
        return self._head.job_script()

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Self:
        """A cluster of any registered kind (``Cluster.from_spec``)."""
        raise NotImplementedError

    @classmethod
    def local(
        cls, workers: int = 1, slots: Slots | None = None, **options: Unpack[ClusterOptionsArgs]
    ) -> Self:
        """A cluster of ``workers`` nodes on this machine, ``slots`` ranks each before a job
        counts as oversubscribed (default: the cores this process may use, its CPU affinity
        capped by its cgroup CPU quota, shared among the nodes, a remainder to the first, at
        least one each).

        ``slots="gpus"`` gives each node one slot per GPU: the machine's GPUs (``nvidia-smi
        -L``, counted now) are shared out among the nodes, and a node left with none is a
        :class:`ConfigError`. Whatever the slots, each rank gets one of the GPUs of its
        machine in ``CUDA_VISIBLE_DEVICES`` (see :mod:`clusterbook.gpus`)."""
        return cls.from_spec({"kind": "local", "workers": workers, "slots": slots, **options})

    @classmethod
    def ssh(cls, hosts: Sequence[str] | None = None, **args: Unpack[SSHArgs]) -> Self:
        """A cluster of SSH hosts (``["node1:4", "node2:4"]``: names or addresses, with
        slots; ``"node1:gpus"``: one slot per GPU of the node, counted at ``start()``),
        bootstrapped securely at ``start()`` (arguments: :class:`SSHArgs`).

        Each node needs the head's Python environment (the same Python minor version,
        clusterbook, mpi4py and MPI): at the same path, or where ``node_python`` says.
        ``start()`` connects to every host once (in parallel, retrying until
        ``connect_timeout`` while sshd comes up), checks Python, clusterbook, mpi4py and MPI
        against the head and cores against slots, then installs a per-cluster key pair and
        known_hosts so that the MPI launcher's own ssh (node to node too) checks host keys
        strictly. ``stop()`` removes the key, the files and every process of the cluster.
        With ``discover=`` (a command that prints the hosts, see :class:`SSHArgs`) the hosts
        may be left out: the command's first answer gives them.
        """
        given = {} if hosts is None else {"hosts": hosts}
        return cls.from_spec({"kind": "ssh", **given, **args})

    @classmethod
    def elastic(cls, min_nodes: int, max_nodes: int, **args: Unpack[ElasticArgs]) -> Self:
        """A cluster whose nodes join by themselves (arguments: :class:`ElasticArgs`).

        ``start()`` serves the rendezvous and prints the command nodes join with
        (``clusterbook worker join URL --token-file F``; also :attr:`join_command`).
        ``wait_ready()`` returns once a round completes: ``min_nodes`` joined and the last
        call passed, or ``max_nodes`` joined. Each node says its slots as it joins
        (``--slots N``, default the cores it may use; ``--slots gpus``: one per GPU it has).
        """
        bounds = {"min_nodes": min_nodes, "max_nodes": max_nodes}
        return cls.from_spec({"kind": "elastic", **bounds, **args})

    @classmethod
    def slurm(
        cls,
        nodes: int = 2,
        slots: int | None = None,
        partition: str | None = None,
        time: Duration | None = "1:00:00",
        account: str | None = None,
        sbatch_args: Sequence[str] = (),
        min_nodes: int | None = None,
        **args: Unpack[SlurmArgs],
    ) -> Self:
        """A cluster of ``nodes`` nodes from one Slurm batch job (other arguments:
        :class:`SlurmArgs`).

        ``start()`` submits the job (``sbatch``; its script and output go to :attr:`run_dir`)
        and returns at once; its step runs ``clusterbook worker join`` on every node it gets,
        so the nodes join as those of :meth:`elastic` do, each with its own sshd for MPI.
        ``wait_ready()`` returns once they joined (``min_nodes``: the job may start with fewer,
        ``sbatch --nodes=MIN-MAX``). While the job waits in the queue, ``status()`` shows a
        pending row per node to come, with Slurm's reason. ``slots`` is each node's ranks
        (``--cpus-per-task``; default: whole nodes, ``--exclusive``, one slot per CPU);
        ``partition``, ``time`` (Slurm's ``"1:00:00"``, ``"2-0"``, or ``"30m"``) and
        ``account`` go to sbatch (``time=None``: the partition's default), and so do
        ``sbatch_args`` (last: they win). The time limit is the cluster's ``life_span`` unless
        it is given one. ``stop()`` ends the job
        (``scancel`` if it is still there) and leaves nothing on the nodes. sbatch's refusal (an
        unknown partition, a bad time, no such account) is a :class:`ConfigError` quoting it.
        The nodes must see the head's home directory (the token file) and its Python
        environment at the same path, as the nodes of a Slurm cluster do.
        """
        job = {
            "nodes": nodes,
            "slots": slots,
            "partition": partition,
            "time": time,
            "account": account,
            "sbatch_args": tuple(sbatch_args),
            "min_nodes": min_nodes,
        }
        return cls.from_spec({"kind": "slurm", **job, **args})

    @classmethod
    def from_hostfile(cls, path: str | os.PathLike[str], **args: Unpack[SSHArgs]) -> Self:
        """An SSH cluster (:meth:`ssh`) of the hosts in an Open MPI (``node1 slots=4``,
        ``max_slots=N``) or MPICH (``node1:4``) hostfile: one node per distinct host, the
        slots of its lines added up, comments and blank lines skipped. A line of neither form
        is a :class:`ConfigError` naming the file, the line's number and the line."""
        return cls.ssh(read_hostfile(path), **args)

    @classmethod
    def from_profile(
        cls,
        profile: str,
        /,
        *,
        config_dir: str | os.PathLike[str] | None = None,
        **overrides: Any,
    ) -> Self:
        """The cluster of the profile called ``profile``: a table ``[profiles.NAME]`` of
        ``profiles.toml`` in ``config_dir`` (default: ``$CLUSTERBOOK_CONFIG``, else
        ``$XDG_CONFIG_HOME/clusterbook``, else ``~/.config/clusterbook``), which holds a
        ``kind`` and its options as :meth:`from_spec` takes them (see
        :mod:`clusterbook.config`).

        ``overrides`` replace the profile's options of those names, whole (``env={...}``
        replaces the profile's ``env``; ``name=`` names the cluster). A profile that is not
        there is an :class:`~clusterbook.errors.UnknownProfileError` listing those there are;
        a key or a value its kind does not take, a :class:`~clusterbook.errors.ProfileError`
        naming the profile, the file and the key; a profiles file another user could have
        written, an :class:`~clusterbook.errors.UnsafePathError` (it is not read)."""
        from clusterbook.cluster.profile import from_profile
        from clusterbook.config import find_profile

        return from_profile(find_profile(profile, config_dir), overrides, cls.from_spec)

    @classmethod
    def from_environment(
        cls,
        kind: str | None = None,
        *,
        slots: int | None = None,
        environ: Mapping[str, str] | None = None,
        root: str | os.PathLike[str] | None = None,
        runner: Runner | None = None,
        via: str | None = None,
        **args: Unpack[SSHArgs],
    ) -> Self:
        """An SSH cluster (:meth:`ssh`) of the nodes the system around this process gives: a
        Slurm allocation, a PBS/Torque job, a SageMaker training job or a Kubeflow MPIJob's launcher
        pod (what is read, and in which order: :mod:`clusterbook.providers.environment.detect`).

        ``kind`` reads that system only (default: ``CLUSTERBOOK_ENVIRONMENT``, else the first
        found); ``slots`` gives every node that many instead of what the system says. The system's
        SSH settings (an MPIJob's key and pinned host keys, SageMaker's new containers trusted on
        first use) and MPI flavour are defaults that ``args`` (those of :meth:`ssh`) override.
        ``environ``, ``root`` and ``runner`` stand for this process's variables, ``/`` and the
        commands it runs (``scontrol``). None found:
        :class:`~clusterbook.providers.environment.detect.EnvironmentNotFoundError` saying what was
        looked for; on a SageMaker host other than the first, or an MPIJob worker pod:
        :class:`~clusterbook.providers.environment.detect.WorkerHostError`.

        ``via`` says how jobs start: ``"srun"``, as steps of the Slurm allocation (no ssh:
        Slurm's daemons start the ranks, MPI through its PMI plugin; see
        :mod:`clusterbook.providers.slurm.srun`), ``"ssh"`` (``mpirun`` over ssh), or ``"auto"``
        (None): srun inside a Slurm allocation where ``srun`` is on ``PATH`` and no SSH
        option is given, else ssh."""
        from clusterbook.providers.environment.detect import (
            cluster_spec,
            detect_environment,
            launch_via,
        )

        found = detect_environment(kind, environ=environ, root=root, runner=runner)
        path = (os.environ if environ is None else environ).get("PATH", "")
        how = launch_via(found, via, args, srun_found=shutil.which("srun", path=path) is not None)
        return cls.from_spec(cluster_spec(found, args, slots, via=how))

    @staticmethod
    def attach(
        what: str | os.PathLike[str],
        *,
        identity: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        python: str | None = None,
        connect_timeout: Duration = 10.0,
    ) -> AttachedCluster:
        """A handle on a cluster another kernel or process runs (or ran): ``what`` is its id
        (``clusterbook ls``, ``cb.clusters()``), its name (the newest of that name) or its
        directory. It shows the cluster's status and widget, reads and follows its jobs'
        logs, and stops it. An unknown id is an :class:`UnknownClusterError` listing the
        clusters there are; a directory that is not a cluster's, a :class:`RecordError`.

        A cluster whose head runs on another machine is ``"ssh://user@host/ID"`` (port
        ``host:P``; a directory after the host: ``ssh://host/path/to/dir``). It is reached
        over ssh as :meth:`ssh` reaches hosts: the ssh config, the ssh-agent's keys or
        ``identity``, ``known_hosts`` (default ``~/.ssh/known_hosts``), within
        ``connect_timeout`` seconds; ``python`` is the interpreter with clusterbook there
        (default: ``clusterbook`` on the PATH of its ssh sessions, else ``python3``). Close
        the handle (``close()``, or ``with``) to end that connection.
        """
        from clusterbook.cluster.remote.attached import AttachedCluster

        return AttachedCluster.attach(
            what,
            identity=identity,
            known_hosts=known_hosts,
            ssh_config=ssh_config,
            python=python,
            connect_timeout=connect_timeout,
        )
