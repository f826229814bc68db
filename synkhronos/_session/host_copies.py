"""Data on other hosts (MPI launch): each host but the master's holds a copy of
every Data segment a call needs, made by the host's lowest rank (its leader);
the master sends the contents to all leaders at once (``MPI.Ibcast``) whenever
they may differ from its own (see ``_wire.shared_memory.DataMemory.stale_on_hosts``)."""

import functools

from .._wire.protocol import HostData

__all__ = ["HostPublisher"]


class HostPublisher:
    """Keeps the other hosts' copies of Data current.

    Parameters
    ----------
    dispatcher : synkhronos._session.dispatch.Dispatcher
    cluster : synkhronos._session.mpi.Cluster or None
        The ranks of an MPI launch; None: one host, nothing to do.
    """

    def __init__(self, dispatcher, cluster):
        self._dispatcher = dispatcher
        self._cluster = cluster

    def remote(self, rank):
        """Whether worker ``rank`` runs on another host: it cannot map this
        host's memory, so arrays travel to it inline."""
        return self._cluster is not None and self._cluster.remote(rank)

    def publish(self, memories):
        """Bring the other hosts' copies of ``memories`` (``DataMemory`` of Data
        objects) up to date: those whose contents may have changed since they
        last travelled (a writable view handed out since, or still alive)."""
        cluster = self._cluster
        if cluster is None:
            return
        leaders = cluster.remote_leaders()
        if not leaders:
            return
        for mem in memories:
            if not mem.stale_on_hosts():
                continue
            used = mem.used_bytes()
            seg = mem.segment
            self._dispatcher.request(
                HostData(seg.name, seg.nbytes, used.size), ranks=leaders,
                local=functools.partial(cluster.bcast_to_leaders, used, self._dispatcher.check_posted))
            mem.published()
