"""The node program: what runs on each node (and on the head for itself), plain stdlib.

Its modules (not this docstring) are sent as one source (:mod:`.program`: ``python -c STUB
SOURCE TASK ARGS``), so that nothing has to be on the node first; a node whose installed
clusterbook has the same modules runs them from its own bytecode instead. Each step prints
one JSON object, or a node's session (:mod:`.session`) runs steps one after another.
Importable too: the head names what it shares with the nodes from here (:mod:`.common`), and
the tests run the tasks.

- ``probe``: facts about the node (hostname, Python, cores, mpi4py and its MPI, launcher,
  what ``nvidia-smi -L`` says of its GPUs) (:mod:`.probe`).
- ``install``: write the cluster's files atomically with their modes under
  ``~/.clusterbook/clusters/ID`` and add the cluster's key to ``~/.ssh/authorized_keys``.
- ``status``: write the cluster's status file (``status.json``: ``ready``) in its directory,
  and, where a worker of a training job serves this host (``clusterbook worker serve``),
  the copy that worker waits on, in its own directory.
- ``cleanup``: stop the cluster's processes, remove its key lines and its directory (and,
  given a ``status``, leave it, ``done``, for the worker that serves this host).
- ``release`` (the node's agent, when it has lost the head): stop the cluster's jobs here and
  remove what ``install`` put here, unless another node sharing this home is still in it.
  (These four: :mod:`.install`.)
- ``kill``: stop the processes of one job; ``hold``: stop (SIGSTOP) the processes of one
  failed job, for inspection (``clean="none"``) (:mod:`.procs`).
- ``run``: run a command (``cluster.run_on_nodes``); ``spawn``: start the node's agent,
  detached; ``tail``: the end of its log; ``free_port`` (:mod:`.commands`).
- ``put_*``: write files at the paths they have on the head (what it created is removed at
  ``cleanup``); ``gather_*``: hand over the files ranks wrote in a directory (and the
  directories in it), then remove them. ``put_files`` and ``gather_files`` move the bytes raw,
  in frames that follow the request or precede the reply; the head uses those (``put_chunk``
  and ``gather_chunk`` take one base64 piece in the JSON, for a caller that has no frames)
  (:mod:`.files`).
- ``reap`` (local only): the guard that stops a Python process's jobs when it dies
  (:mod:`.procs`; run as ``python -S .../clusterbook/nodes/tasks reap``).

Rules that keep the one source sound (``tests/sdk/nodes/tasks/test_program.py`` checks them):
only the standard library and each other are imported, each other with one-line or
parenthesised ``from .module import name`` statements at the top level, which the source
leaves out (every module's names are one namespace there), so no two modules define the same
top-level name; a module imports only those before it in :data:`.program.MODULES`; and
nothing runs at import but definitions.
"""
