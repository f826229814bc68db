"""The NCCL communicator and stream of a GPU rank: joining and leaving the
communicator, waiting for the stream (in the master, without hanging on a failed
worker), keeping queued collectives' inputs alive, and NCCL groups."""

import contextlib

from ..._common.waiting import poll_until
from ._dlpack import cupy_exporter, jax_importer, untimed_event

__all__ = ["StreamMixin"]

# Bytes of inputs of queued collectives the host may hold before it waits for
# the GPU.  Large all-reduces ran closer to raw NCCL with fewer calls queued
# (see the docs page "Benchmarks", *Design decisions*).
_INFLIGHT_BYTES = 128 << 20


class StreamMixin:
    """NCCL communicator and stream lifetime of ``GpuDevice``."""

    # -------------------------------------------------------------------- NCCL
    def init_comm(self, n_parallel, rank, uid):
        """Join the NCCL communicator (blocks until every rank has joined)."""
        import cupy
        from cupy.cuda import nccl

        self.n_parallel, self.rank = n_parallel, rank
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._comm = nccl.NcclCommunicator(n_parallel, uid, rank)
        self._warm_up()

    def _warm_up(self):
        """Build the DLPack bridges and load the CuPy kernels the collectives use,
        now, while no NCCL kernel runs: loading a kernel (and the bridges' probes,
        which wait on the host) can wait for the GPU's running kernels, and a
        collective stuck on a silent rank would then hang this process in CUDA,
        where no stall check can run."""
        import cupy

        self._import = jax_importer()
        self._export = cupy_exporter(self._stream)
        copies = cupy.cuda.Stream(non_blocking=True)
        self._copier = copies, cupy_exporter(copies)
        with self._stream:
            x = cupy.full((2,), 1, dtype=cupy.float32)
            (x * x.dtype.type(2)).astype(cupy.float64)
            cupy.zeros(2, dtype=cupy.float32)
            cupy.ascontiguousarray(cupy.concatenate([x, x]))
        self._stream.synchronize()

    @staticmethod
    def new_uid():
        from cupy.cuda import nccl

        return nccl.get_unique_id()

    def close(self, abort=False):
        """Leave the communicator; ``abort`` when a collective may be stuck."""
        self._updated_by.clear()
        self._set_since.clear()
        self._pinned_kept.clear()
        self._sharding_seen.clear()
        self._staging.clear()
        pool, self._gather_pool = self._gather_pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        self._inflight.clear()
        self._own.clear()
        self._copier = None
        self._held = 0
        if self._comm is not None:
            try:
                if abort:
                    self._comm.abort()
                else:
                    self._comm.destroy()
            except Exception:
                pass
            self._comm = None

    def synchronize(self, shareds):
        """Wait until every queued computation and collective on this GPU is done.

        ``shareds`` (every shared variable of the session) is not looked at:
        only the values written since the last ``synchronize`` can still be
        queued (see ``_unsynced_vars``), and JAX's wait costs the host a fraction
        of a microsecond per array, however long ago it was done.  The NCCL
        stream's wait covers every collective's outputs."""
        import jax

        del shareds
        # One native wait for the list, not one per array.
        jax.block_until_ready([var.container.storage[0] for var in self._unsynced_vars()])
        if self._stream is not None:
            self._stream.synchronize()
        self._inflight.clear()
        self._held = 0

    # The values that JAX may still be computing or copying: updates of the
    # functions called since the last ``synchronize`` (``after_updates``) and
    # values put on the GPU (``set_value``).  Kept as functions and variables,
    # not arrays: one dict entry per call, whatever its number of updates.
    def after_updates(self, core):
        self._updated_by[id(core)] = core

    def _put(self, var):
        self._set_since[id(var)] = var

    def _unsynced_vars(self):
        """Variables whose values were written since the last ``synchronize``;
        forgotten as they are returned."""
        found = dict(self._set_since)
        for core in self._updated_by.values():
            found.update((id(var), var) for var, _ in core.updates)
        self._updated_by.clear()
        self._set_since.clear()
        return found.values()

    def _retire(self, *arrays, nbytes=None):
        """Keep ``arrays`` alive until the NCCL stream has passed this point.  If
        more than ``_INFLIGHT_BYTES`` are held so, wait for the oldest: the host
        may run far ahead of the GPU, and each queued call holds its inputs.
        ``nbytes``: their size where the caller knows it.  Returns the event
        recorded at this point."""
        queue = self._inflight
        while queue and queue[0][0].done:
            self._held -= queue.popleft()[2]
        if nbytes is None:
            nbytes = sum(a.nbytes for a in arrays)
        mark = self._mark()
        queue.append((mark, arrays, nbytes))
        self._held += nbytes
        while self._held > _INFLIGHT_BYTES and len(queue) > 1:
            event, _, old = queue.popleft()
            self._wait_for(event)
            self._held -= old
        return mark

    def _mark(self):
        """An (untimed) event recorded on the NCCL stream now."""
        return untimed_event(self._stream)

    def _wait(self):
        """Wait for the NCCL stream (see ``_wait_for``)."""
        self._wait_for(self._mark())

    def _wait_for(self, event):
        """Wait for ``event``; the master keeps checking the workers' replies
        meanwhile (``wait_hook``), so a worker's failure does not hang it."""
        if self.wait_hook is None:
            event.synchronize()
            return
        if event.done:  # a value computed long ago: one query, nothing to set up
            return
        # Poll alone at first: a short wait (a tiny call's outputs) should not
        # pay for a sleep.
        poll_until(lambda: event.done, self.wait_hook)

    @staticmethod
    def _grouped(count):
        """A context that queues the NCCL calls made inside as one launch when
        there are several (``count``): one kernel for a call's variables instead
        of one each, with the host's work between them.  Nothing inside may read
        their results.  For one call, a context that does nothing (every
        collective enters one: no generator to build)."""
        return _NcclGroup() if count > 1 else _NO_GROUP


class _NcclGroup:
    """NCCL's groupStart/groupEnd as a context (see ``GpuDevice._grouped``)."""

    def __enter__(self):
        from cupy.cuda import nccl

        nccl.groupStart()

    def __exit__(self, *exc):
        from cupy.cuda import nccl

        nccl.groupEnd()
        return False


_NO_GROUP = contextlib.nullcontext()
