"""Function outputs reduced over NCCL: each rank's outputs of static shape are
reduced into the master on the GPUs, then copied to the host there."""

import math

import numpy as np

from ..._common.reduce import identity
from ._collectives import _nccl_dtype

__all__ = ["OutputsMixin"]

# Outputs up to this size are reduced into GPU buffers kept for reuse and copied
# to page-locked host buffers kept likewise, queued on the NCCL stream right
# behind their reduction: the master then waits once for both.  (A call's
# outputs are taken before the next call is queued, and the stream orders each
# copy before the next reduction into the same buffer.)  Larger ones land in
# fresh GPU memory and are copied after that wait, into fresh host memory
# (page-locking memory costs more than copying a large output once).
_PINNED_MAX_BYTES = 1 << 20
_PINNED_KEPT = 64  # buffer pairs kept at most (each an output's position, shape and dtype)
_SHARDINGS_KEPT = 64  # outputs' shardings remembered at most (see _on_nccl_gpu)


class _Reduced:
    """The master's handle on one call's reduced outputs (``take_outputs``)."""

    __slots__ = ("device", "hosts", "done")

    def __init__(self, device, hosts, done):
        self.device = device  # CuPy arrays, kept until their copies are done
        self.hosts = hosts  # per output: its page-locked copy, or None (copied after)
        self.done = done  # event on the NCCL stream after the reduction and the copies


class OutputsMixin:
    """Output reduction of ``GpuDevice``."""

    @property
    def reduces_outputs(self):
        """Whether function outputs of static shape are reduced into the master
        over NCCL: then no rank waits to copy its outputs to the host, which
        makes a tiny call much cheaper (see the docs page "Benchmarks", *Design
        decisions*).  Not on one rank, where there is nothing to reduce."""
        return bool(self.n_parallel and self.n_parallel > 1)

    # ------------------------------------------------------ function outputs
    def reduce_outputs(self, outputs, specs, weight, root):
        """Queue the reduction of one call's outputs into rank ``root`` over NCCL.

        ``specs`` gives ``(shape, dtype, mode)`` per output.  For ``avg`` each
        rank sends its output times ``weight`` (its rows) and ``take_outputs``
        divides by the total, as the host path weights it.  ``outputs`` None
        (this rank had no rows, or failed) sends identity values, as does an
        output of an unexpected shape, which then raises ValueError after.

        Returns
        -------
        On ``root``, the handle ``take_outputs`` takes; else None.
        """
        import cupy
        from cupy.cuda import nccl

        problems, keep, results, hosts = [], [], [], []
        held = 0  # bytes in keep (counted here: a JAX array's nbytes costs microseconds)
        root_here = self.rank == root
        stream = self._stream
        with self._grouped(len(specs)), stream:
            for k, (shape, dtype, mode) in enumerate(specs):
                size, before, sent = math.prod(shape), len(keep), None
                nbytes = size * np.dtype(dtype).itemsize
                if outputs is not None:
                    try:
                        sent = self._output_pointer(outputs[k], shape, dtype, mode, weight, keep)
                    except Exception as exc:  # still take part: the other ranks wait for this one
                        problems.append("output %d on rank %d: %s" % (k, self.rank, exc))
                if sent is None:
                    x = cupy.full(shape, identity(mode, dtype), dtype=dtype)
                    keep.append(x)
                    sent = x.data.ptr
                held += (len(keep) - before) * nbytes
                out = None
                if root_here:
                    out, host = self._landing(k, shape, dtype, nbytes)
                    results.append(out)
                    hosts.append(host)
                # avg: the (weighted) parts are summed here and divided on the host.
                self._comm.reduce(sent, sent if out is None else out.data.ptr, size,
                                  _nccl_dtype(nccl, dtype), self._op("sum" if mode == "avg" else mode),
                                  root, stream.ptr)
        if root_here:
            self._queue_host_copies(results, hosts)
        done = self._retire(*keep, nbytes=held)  # (recorded after the copies: one event marks both)
        self._raise(problems)
        return _Reduced(results, hosts, done) if root_here else None

    def _output_pointer(self, value, shape, dtype, mode, weight, keep):
        """The device address of a rank's output as NCCL sends it (weighted for
        avg, in ``dtype``); what lives there goes to ``keep`` (held until the
        NCCL stream has passed).

        A JAX array that is already computed is sent from where it is: no
        DLPack export (tens of microseconds, which a tiny call pays on every
        rank), and no stream to order after XLA's, since nothing is left to
        write it.  Otherwise a CuPy view ordered after XLA's writes."""
        import cupy
        import jax

        if tuple(np.shape(value)) != shape:
            raise ValueError("shape %s, but the graph says %s" % (tuple(np.shape(value)), shape))
        if isinstance(value, jax.Array):
            as_is = value.dtype == dtype and (mode != "avg" or weight == 1)
            if as_is and value.is_ready() and self._on_nccl_gpu(value):
                keep.append(value)
                return value.unsafe_buffer_pointer()
            x = self._to_cupy(value)
        else:  # a function the user compiled for the CPU
            x = cupy.asarray(np.asarray(value))
        keep.append(x)
        if x.dtype != dtype:
            x = x.astype(dtype)
            keep.append(x)
        if mode == "avg" and weight != 1:
            x = x * x.dtype.type(weight)
            keep.append(x)
        return x.data.ptr

    def _jax_device(self):
        """The GPU JAX computes on by default in this process, the one NCCL uses
        (a worker sees only it; a master that started JAX before ``fork()`` may
        see others)."""
        if self._gpu is None:
            import jax

            self._gpu = jax.local_devices()[0]
        return self._gpu

    def _on_nccl_gpu(self, value):
        """Whether JAX array ``value`` lives on the GPU NCCL uses.  Remembered by
        its sharding (a jitted function's outputs share one): JAX's ``device``
        property takes microseconds, paid by every rank on every call."""
        sharding = value.sharding
        seen = self._sharding_seen.get(id(sharding))
        if seen is None or seen[0] is not sharding:
            if len(self._sharding_seen) >= _SHARDINGS_KEPT:
                self._sharding_seen.clear()
            seen = self._sharding_seen[id(sharding)] = (sharding, value.device == self._jax_device())
        return seen[1]

    def _landing(self, k, shape, dtype, nbytes):
        """Where output ``k`` (``nbytes`` long) lands on root: ``(GPU array,
        page-locked host array or None)``, the pair kept for the next call's
        output ``k`` of the same shape and dtype when it is small
        (``_PINNED_MAX_BYTES``), else a fresh GPU array, copied to the host
        after the wait."""
        import cupy

        key = (k, shape, dtype)
        kept = self._pinned_kept.get(key)
        if kept is not None:
            return kept
        if not 0 < nbytes <= _PINNED_MAX_BYTES:
            return cupy.empty(shape, dtype), None
        import cupyx

        if len(self._pinned_kept) >= _PINNED_KEPT:
            self._pinned_kept.clear()
        kept = self._pinned_kept[key] = (cupy.empty(shape, dtype), cupyx.empty_pinned(shape, dtype))
        return kept

    def _queue_host_copies(self, results, hosts):
        """Queue on the NCCL stream the copies of reduced outputs ``results``
        into their page-locked ``hosts`` (None: copied after the wait)."""
        from cupy.cuda import runtime

        for r, host in zip(results, hosts):
            if host is not None:
                runtime.memcpyAsync(host.ctypes.data, r.data.ptr, r.nbytes, runtime.memcpyDeviceToHost,
                                    self._stream.ptr)

    def take_outputs(self, reduced):
        """Host copies (fresh arrays) of the reduced outputs of ``reduced``,
        the handle ``reduce_outputs`` returned on root."""
        self._wait_for(reduced.done)
        return [r.get() if host is None else host.copy() for r, host in zip(reduced.device, reduced.hosts)]
