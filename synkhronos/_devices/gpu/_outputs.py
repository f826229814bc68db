"""Function outputs reduced over NCCL: each rank's outputs of static shape are
reduced into the master on the GPUs, then copied to the host there."""

import math

import numpy as np

from ..._common.reduce import identity
from ._collectives import _nccl_dtype

__all__ = ["OutputsMixin"]

# Outputs up to this size are copied to page-locked host buffers kept for reuse,
# queued on the NCCL stream right behind their reduction: the master then waits
# once for both.  Larger ones are copied after that wait, into fresh host memory
# (page-locking memory costs more than copying a large output once).
_PINNED_MAX_BYTES = 1 << 20
_PINNED_KEPT = 64  # buffers kept at most (each an output's position, shape and dtype)


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

        problems, keep, results = [], [], []
        root_here = self.rank == root
        stream = self._stream
        with self._grouped(len(specs)), stream:
            for k, (shape, dtype, mode) in enumerate(specs):
                sent = None
                if outputs is not None:
                    try:
                        sent = self._output_pointer(outputs[k], shape, dtype, mode, weight, keep)
                    except Exception as exc:  # still take part: the other ranks wait for this one
                        problems.append("output %d on rank %d: %s" % (k, self.rank, exc))
                if sent is None:
                    x = cupy.full(shape, identity(mode, dtype), dtype=dtype)
                    keep.append(x)
                    sent = x.data.ptr
                out = cupy.empty(shape, dtype) if root_here else None
                # avg: the (weighted) parts are summed here and divided on the host.
                self._comm.reduce(sent, sent if out is None else out.data.ptr, math.prod(shape),
                                  _nccl_dtype(nccl, dtype), self._op("sum" if mode == "avg" else mode),
                                  root, stream.ptr)
                results.append(out)
        hosts = self._queue_host_copies(results) if root_here else None
        done = self._retire(*keep)  # (recorded after the copies: one event marks both)
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
            if as_is and value.is_ready() and value.device == self._jax_device():
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

    def _queue_host_copies(self, results):
        """Queue on the NCCL stream the copies of small reduced outputs
        ``results`` into page-locked host buffers; per output, its buffer or
        None (copied after the wait)."""
        from cupy.cuda import runtime

        hosts = []
        for k, r in enumerate(results):
            host = self._pinned(k, r.shape, r.dtype) if 0 < r.nbytes <= _PINNED_MAX_BYTES else None
            if host is not None:
                runtime.memcpyAsync(host.ctypes.data, r.data.ptr, r.nbytes, runtime.memcpyDeviceToHost,
                                    self._stream.ptr)
            hosts.append(host)
        return hosts

    def _pinned(self, k, shape, dtype):
        """A page-locked host array for output ``k`` of ``shape`` and ``dtype``,
        kept for the next call's (the master copies out of it before then)."""
        import cupyx

        key = (k, shape, dtype)
        host = self._pinned_kept.get(key)
        if host is None:
            if len(self._pinned_kept) >= _PINNED_KEPT:
                self._pinned_kept.clear()
            host = self._pinned_kept[key] = cupyx.empty_pinned(shape, dtype)
        return host

    def take_outputs(self, reduced):
        """Host copies (fresh arrays) of the reduced outputs of ``reduced``,
        the handle ``reduce_outputs`` returned on root."""
        self._wait_for(reduced.done)
        return [r.get() if host is None else host.copy() for r, host in zip(reduced.device, reduced.hosts)]
