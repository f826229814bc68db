"""Function outputs reduced over NCCL: each rank's outputs of static shape are
reduced into the master on the GPUs, then copied to the host there."""

import numpy as np

from ..._common.reduce import identity
from ._collectives import _nccl_dtype

__all__ = ["OutputsMixin"]


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
        list of CuPy arrays on ``root`` (for ``take_outputs``), else None.
        """
        import cupy
        from cupy.cuda import nccl

        problems, keep, results = [], [], []
        root_here = self.rank == root
        stream = self._stream
        with self._grouped(len(specs)), stream:
            for k, (shape, dtype, mode) in enumerate(specs):
                x = None
                if outputs is not None:
                    try:
                        x = self._output_buffer(outputs[k], shape, dtype, mode, weight, keep)
                    except Exception as exc:  # still take part: the other ranks wait for this one
                        problems.append("output %d on rank %d: %s" % (k, self.rank, exc))
                if x is None:
                    x = cupy.full(shape, identity(mode, dtype), dtype=dtype)
                out = cupy.empty(x.shape, x.dtype) if root_here else x
                # avg: the (weighted) parts are summed here and divided on the host.
                self._comm.reduce(x.data.ptr, out.data.ptr, x.size, _nccl_dtype(nccl, x.dtype),
                                  self._op("sum" if mode == "avg" else mode), root, stream.ptr)
                keep.append(x)
                results.append(out)
        self._retire(*keep)
        self._raise(problems)
        return results if root_here else None

    def _output_buffer(self, value, shape, dtype, mode, weight, keep):
        """A rank's output as a CuPy array on the NCCL stream (the current one),
        weighted for avg; a view of a JAX array goes to ``keep`` (held until the
        stream passes)."""
        import cupy
        import jax

        if tuple(np.shape(value)) != shape:
            raise ValueError("shape %s, but the graph says %s" % (tuple(np.shape(value)), shape))
        if isinstance(value, jax.Array):
            x = self._to_cupy(value)
            keep.append(x)
        else:  # a function the user compiled for the CPU
            x = cupy.asarray(np.asarray(value))
        if x.dtype != dtype:
            x = x.astype(dtype)
        if mode == "avg" and weight != 1:
            x = x * x.dtype.type(weight)
        return x

    def take_outputs(self, results):
        """Host copies of the reduced outputs ``reduce_outputs`` returned on root."""
        import cupy

        self._wait()
        return [cupy.asnumpy(r) for r in results]
