"""Python functions as jobs: ``cluster.submit(fn, *args)`` runs a function on every rank and
hands back what each returned; ``cluster.executor()`` is a ``concurrent.futures.Executor`` on a
cluster; ``cluster.map`` sweeps items over a pool of ranks that stays up.

``payload`` pickles a call (what cannot be pickled is named), ``rank`` is the program each
rank runs, ``values`` reads back what the ranks left, ``submit`` runs a call as a job of any
:class:`~clusterbook.cluster.handle.ClusterHandle`, ``executor`` runs calls as futures, and
``methods`` gives both to ``Cluster`` and to an attached handle. ``sweep``, ``schedule``,
``results``, ``tracebacks``, ``pool`` and ``worker`` are ``cluster.map``'s.
"""
