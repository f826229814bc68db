"""Collectives on shared variables over NCCL: NCCL's data types and reduce
operations, inputs as CuPy views of JAX arrays, outputs imported back into JAX,
and ``all_reduce``, ``reduce``, ``broadcast``, ``gather``, ``all_gather``."""

import functools
import math
import weakref

import numpy as np

from ._dlpack import cupy_exporter, jax_importer

__all__ = ["CollectivesMixin"]

_NCCL_DTYPE_NAMES = ("float16", "float32", "float64", "int8", "uint8", "int32", "uint32",
                     "int64", "uint64")
_NCCL_TYPES = {}  # dtype, as given -> NCCL data type, filled on use


def _nccl_dtype(nccl, dtype):
    """NCCL's data type for ``dtype`` (a name or numpy dtype).  Cached as given:
    ``np.dtype(dtype).name`` alone costs microseconds, twice per variable and call."""
    try:
        return _NCCL_TYPES[dtype]
    except KeyError:
        pass
    name = np.dtype(dtype).name
    if name not in _NCCL_DTYPE_NAMES:
        raise TypeError("NCCL has no data type for %s; use nccl=False for the shared-memory "
                        "path" % dtype)
    _NCCL_TYPES[dtype] = getattr(nccl, "NCCL_" + name.upper())
    return _NCCL_TYPES[dtype]


class CollectivesMixin:
    """NCCL collectives of ``GpuDevice`` (queued on the NCCL stream)."""

    # The collectives below only queue work on the NCCL stream and return: DLPack
    # makes that stream wait for XLA's writes to an input, and XLA wait for NCCL's
    # writes to an output, with events on the GPU, not with host synchronisation.
    # Outputs go to fresh buffers, so nothing XLA may still read is overwritten;
    # inputs are kept alive until the stream has passed them.  Every rank is told
    # the shapes by the master; a rank whose own shape differs takes part with a
    # zero stand-in (so no rank waits forever) and raises afterwards.

    def _input(self, var, shape, problems):
        """(CuPy view of ``var``'s value on the NCCL stream, whether it is the
        real value or a stand-in of the expected ``shape``)."""
        import cupy

        value = self._jax_value(var)
        if tuple(value.shape) != tuple(shape):
            problems.append("%s has shape %s on rank %d but the master expected %s"
                            % (var, tuple(value.shape), self.rank, tuple(shape)))
            with self._stream:
                return cupy.zeros(shape, dtype=var.dtype), False
        own = self._own.get(id(var))
        if own is not None and own[0]() is value:
            return own[1], True  # written by this stream: stream order suffices
        return self._to_cupy(value), True

    def _to_cupy(self, value):
        """A CuPy view of JAX array ``value``, ordered on the NCCL stream after
        XLA's writes to it (see ``cupy_exporter``)."""
        if self._export is None:
            self._export = cupy_exporter(self._stream)
        return self._export(value)

    def _outputs(self, outputs, after=None):
        """Make each ``buf`` of ``outputs``' ``(var, buf)``, written on the NCCL
        stream, ``var``'s value.  The buffer is remembered while that value
        lives, so that a following collective on ``var`` reads it on the same
        stream, without a round trip through XLA's stream (on the GPU) and
        DLPack (on the host).  ``after``: an event already recorded on the NCCL
        stream after the buffers' writes, for JAX to wait on (else one is made)."""
        if not outputs:
            return
        if self._import is None:
            self._import = jax_importer()
        with self._stream:  # XLA's stream waits for this one
            values = self._import([buf for _, buf in outputs], after)
        own = self._own
        for (var, buf), value in zip(outputs, values):
            var.container.storage[0] = value
            own[id(var)] = (weakref.ref(value, functools.partial(_forget, own, id(var))), buf)

    def _finish(self, keep, outputs):
        """Close a collective: keep the arrays ``keep`` alive behind one event
        (``_retire``), then make each ``(var, buf)`` of ``outputs`` ``var``'s value.

        The imports into JAX come after every other CUDA call of the collective.
        JAX's import of a buffer that the NCCL stream is still writing makes this
        process's next CUDA call wait about as long as that write.  Imported
        between the variables of a call, it would make their NCCL kernels run
        one at a time, with the host's latency between them; imported last, the
        wait falls on the next collective's first NCCL launch, when the GPU has
        finished this one anyway (see the docs page "Benchmarks", *Design
        decisions*)."""
        self._outputs(outputs, self._retire(*keep))

    @staticmethod
    def check_collective(variables, op=None):
        """Raise TypeError, before any rank starts, for a dtype NCCL cannot move
        (NCCL reduces every dtype it moves under every ``op``)."""
        from cupy.cuda import nccl

        for var in variables:
            _nccl_dtype(nccl, var.dtype)

    @staticmethod
    def _raise(problems):
        if problems:
            raise ValueError("; ".join(problems))

    def _op(self, op):
        """NCCL's reduce operation for ``op``.  ``avg`` is NCCL's own (NCCL 2.10
        and later; CuPy may not name it): the sum scaled by 1/n inside the
        collective's kernel, with integer division for integers (truncated,
        as the shared-memory path truncates), which saves a separate scaling
        kernel over the whole result.

        A communicator of one rank sums instead (the average of one value is
        that value): NCCL before 2.29.7 runs one-rank averages through a kernel
        that leaves the last elements of the result unwritten (NVIDIA/nccl#1950,
        CuPy's NCCL 2.28.9 among them), and sums of one rank are a plain copy.
        The figures behind both choices: the docs page "Benchmarks", *Design
        decisions*."""
        if self._ops is None:
            from cupy.cuda import nccl

            avg = getattr(nccl, "NCCL_AVG", 4) if self.n_parallel != 1 else nccl.NCCL_SUM
            self._ops = {"avg": avg, "sum": nccl.NCCL_SUM,
                         "prod": nccl.NCCL_PROD, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}
        return self._ops[op]

    def all_reduce(self, variables, op, shapes):
        import cupy
        from cupy.cuda import nccl

        problems, keep, outputs = [], [], []
        nccl_op, stream = self._op(op), self._stream
        with self._grouped(len(variables)), stream:  # (entered once: it costs per entry)
            for var, shape in zip(variables, shapes):
                x, real = self._input(var, shape, problems)
                out = cupy.ndarray(x.shape, x.dtype)
                self._comm.allReduce(x.data.ptr, out.data.ptr, x.size, _nccl_dtype(nccl, x.dtype), nccl_op,
                                     stream.ptr)
                keep.append(x)
                if real:
                    outputs.append((var, out))
        self._finish(keep, outputs)
        self._raise(problems)

    def reduce(self, variables, op, root, in_place, shapes):
        """Reduce into ``root``; returns host results there (None elsewhere)."""
        import cupy
        from cupy.cuda import nccl

        problems, outs, keep, outputs = [], [], [], []
        nccl_op, stream = self._op(op), self._stream
        with self._grouped(len(variables)), stream:  # (entered once: it costs per entry)
            for var, shape in zip(variables, shapes):
                x, real = self._input(var, shape, problems)
                out = cupy.ndarray(x.shape, x.dtype) if self.rank == root else x
                self._comm.reduce(x.data.ptr, out.data.ptr, x.size, _nccl_dtype(nccl, x.dtype), nccl_op,
                                  root, stream.ptr)
                keep.append(x)
                if self.rank == root and in_place and real:
                    outputs.append((var, out))
                outs.append(out)
        self._finish(keep, outputs)
        self._raise(problems)
        if self.rank != root or in_place:
            return []
        self._wait()
        return [cupy.asnumpy(out) for out in outs]

    def broadcast(self, variables, root, shapes):
        """Every rank takes ``root``'s values (of ``shapes``)."""
        import cupy
        from cupy.cuda import nccl

        problems, keep, outputs = [], [], []
        stream = self._stream
        with self._grouped(len(variables)), stream:
            for var, shape in zip(variables, shapes):
                if self.rank == root:
                    buf, _ = self._input(var, shape, problems)
                else:
                    buf = cupy.ndarray(shape, var.dtype)
                    outputs.append((var, buf))
                self._comm.bcast(buf.data.ptr, buf.size, _nccl_dtype(nccl, buf.dtype), root, stream.ptr)
                keep.append(buf)
        self._finish(keep, outputs)
        self._raise(problems)

    def gather(self, variables, root, shapes):
        """Root receives every rank's value by point-to-point transfers, sized by
        ``shapes[var][rank]``; returns host arrays per variable, per rank, on root."""
        import cupy
        from cupy.cuda import nccl

        problems, results, keep = [], [], []
        stream = self._stream
        with stream:  # (entered once: it costs per entry)
            for var, per_rank in zip(variables, shapes):
                x, _ = self._input(var, per_rank[self.rank], problems)
                dt = _nccl_dtype(nccl, x.dtype)
                if self.rank == root:
                    bufs = [x if r == root else cupy.empty(per_rank[r], dtype=x.dtype)
                            for r in range(self.n_parallel)]
                    nccl.groupStart()
                    for r, b in enumerate(bufs):
                        if r != root and b.size:
                            self._comm.recv(b.data.ptr, b.size, dt, r, stream.ptr)
                    nccl.groupEnd()
                    results.append(bufs)
                elif x.size:
                    self._comm.send(x.data.ptr, x.size, dt, root, stream.ptr)
                keep.append(x)
        self._retire(*keep)
        self._raise(problems)
        if self.rank != root:
            return []
        self._wait()
        return [[cupy.asnumpy(b) for b in bufs] for bufs in results]

    def all_gather(self, variables, shapes):
        """Every rank's value becomes the concatenation (axis 0) of all ranks'
        values (``shapes[var][rank]``); unequal lengths are padded to the longest
        and trimmed after."""
        import cupy
        from cupy.cuda import nccl

        problems, keep, outputs = [], [], []
        stream = self._stream
        with stream:  # (entered once: it costs per entry)
            for var, per_rank in zip(variables, shapes):
                x, real = self._input(var, per_rank[self.rank], problems)
                dt = _nccl_dtype(nccl, x.dtype)
                rows = sum(s[0] for s in per_rank)
                if len(set(per_rank)) == 1:  # rank-major output is already the concatenation
                    joined = cupy.empty((rows,) + x.shape[1:], dtype=x.dtype)
                    self._comm.allGather(x.data.ptr, joined.data.ptr, x.size, dt, stream.ptr)
                else:
                    sizes = [math.prod(s) for s in per_rank]
                    width = max(sizes)
                    send = cupy.zeros(width, dtype=x.dtype)
                    send[:x.size] = x.reshape(-1)
                    recv = cupy.empty(width * self.n_parallel, dtype=x.dtype)
                    self._comm.allGather(send.data.ptr, recv.data.ptr, width, dt, stream.ptr)
                    parts = [recv[r * width:r * width + sizes[r]].reshape(per_rank[r])
                             for r in range(self.n_parallel)]
                    joined = cupy.ascontiguousarray(cupy.concatenate(parts))
                    keep += [send, recv]
                keep.append(x)
                if real:
                    outputs.append((var, joined))
        self._finish(keep, outputs)
        self._raise(problems)


def _forget(own, key, ref):
    """Weakref callback: drop ``own[key]`` if it still belongs to ``ref``'s value."""
    if own.get(key, (None,))[0] is ref:
        del own[key]
