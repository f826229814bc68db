"""Page-locked Data on a GPU rank.

A rank's rows of a ``Data`` input go to its GPU inside each call, as JAX copies
the numpy array it is given.  From pageable memory that copy is staged through
the host, several times slower than the GPU's own transfer from page-locked
memory: on an H200 host, a 128 MB input took 27 ms a call pageable and 2.9 ms
once its memory was page-locked; at 1 MB, 0.25-0.32 ms against 0.14-0.15 (see
the docs page "Benchmarks", *Design decisions*).  So each GPU rank page-locks
(``cudaHostRegister``) the shared memory of every Data segment it maps, once,
and JAX's copy then reads it directly.  A jitted call has read its numpy
arguments when it returns, page-locked or not, so the user may write the Data
once the call is back, as before.

Small segments stay as they are: below ``PIN_MIN_BYTES`` the copy gained
nothing measurable, and locking costs about 0.25 ms a segment.

Rows chosen by an index array (``batch=``) are gathered into a copy, which JAX
would then stage again: from ``PIN_MIN_BYTES`` up they are gathered into a
page-locked buffer instead, one kept per scattered input and reused by its next
call (the call before has read it, as above).  The gather is a copy on the host,
bound by one core's memory traffic: from ``_SPLIT_BYTES`` up it is split over a
few threads (``np.take`` releases the GIL), as many as this rank's share of the
host's cores allows, at most ``_MAX_THREADS``.
"""

import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..._common.selections import take_rows

__all__ = ["PinningMixin", "PIN_MIN_BYTES", "address_of", "page_locked"]

logger = logging.getLogger("synkhronos")

PIN_MIN_BYTES = 1 << 20
_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context of the process
_HOST = 1  # cudaMemoryTypeHost: page-locked host memory (0: pageable)
_SPLIT_BYTES = 8 << 20
_MAX_THREADS = 4


def address_of(segment):
    """The address of ``segment``'s mapping in this process."""
    return np.frombuffer(segment.mmap, dtype=np.uint8).ctypes.data


def page_locked(address):
    """Whether CUDA holds the host memory at ``address`` page-locked (False
    where nothing is mapped there any more)."""
    from cupy.cuda import runtime

    try:
        return runtime.pointerGetAttributes(address).type == _HOST
    except runtime.CUDARuntimeError:
        return False


class PinningMixin:
    """``pin_host`` and ``input_rows`` of ``GpuDevice``."""

    def input_rows(self, k, array, sel):
        """Rows ``sel`` of ``array``, this rank's share of scattered input ``k``:
        a view for a slice; for an index array, a copy, gathered into the
        page-locked buffer kept for input ``k`` from ``PIN_MIN_BYTES`` up (see
        module docstring)."""
        shape = (len(sel),) + array.shape[1:] if isinstance(sel, np.ndarray) else None
        nbytes = 0 if shape is None else math.prod(shape) * array.itemsize
        if nbytes < PIN_MIN_BYTES:
            return take_rows(array, sel)
        if len(sel) and (int(sel.min()) < 0 or int(sel.max()) >= len(array)):
            raise IndexError("batch indices reach outside the %d rows here: %d to %d"
                             % (len(array), int(sel.min()), int(sel.max())))
        buffer = self._staging.get(k)
        if buffer is None or buffer.nbytes < nbytes:
            import cupyx

            self._staging.pop(k, None)  # (its memory back to CuPy's pool first)
            buffer = self._staging[k] = cupyx.empty_pinned((nbytes,), np.uint8)
        out = buffer[:nbytes].view(array.dtype).reshape(shape)
        return self._gather(array, sel, out)

    def _gather(self, array, sel, out):
        """``array[sel]`` into ``out``, split over threads when large (see
        module docstring).  mode="clip" writes into ``out`` directly ("raise"
        buffers it); ``input_rows`` checked the indices."""
        threads = self._gather_threads() if out.nbytes >= _SPLIT_BYTES else 1
        if threads < 2:
            return np.take(array, sel, axis=0, out=out, mode="clip")
        if self._gather_pool is None:
            self._gather_pool = ThreadPoolExecutor(threads, thread_name_prefix="synkhronos-gather")
        bounds = np.linspace(0, len(sel), threads + 1).astype(np.int64)
        parts = [self._gather_pool.submit(np.take, array, sel[a:b], 0, out[a:b], "clip")
                 for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for part in parts:
            part.result()
        return out

    def _gather_threads(self):
        """Threads for a large gather: this rank's share of the cores it may use."""
        ranks = max(1, self.n_parallel or 1)
        return max(1, min(_MAX_THREADS, len(os.sched_getaffinity(0)) // ranks))

    def pin_host(self, segment):
        """Page-lock ``segment``'s mapping in this process (see module
        docstring); returns the function that unlocks it, or None where it was
        left as it is (small, no room in ``/dev/shm``, or CUDA refused)."""
        if segment.nbytes < PIN_MIN_BYTES:
            return None
        try:
            # Locking touches every page: reserve them first, so that a full
            # /dev/shm refuses here rather than inside CUDA (see ``_wire.room``).
            segment.reserve(segment.nbytes)
            from cupy.cuda import runtime

            address = address_of(segment)
            runtime.hostRegister(address, segment.nbytes, _PORTABLE)
        except Exception as exc:  # an input copied from pageable memory is slower, not wrong
            logger.debug("Data segment %s (%d bytes) not page-locked: %s", segment.name, segment.nbytes, exc)
            return None

        def unpin():
            try:
                runtime.hostUnregister(address)
            except Exception:  # CUDA already torn down at exit: the process's end unlocks it
                pass

        return unpin
