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
"""

import logging

import numpy as np

__all__ = ["PinningMixin", "PIN_MIN_BYTES", "address_of"]

logger = logging.getLogger("synkhronos")

PIN_MIN_BYTES = 1 << 20
_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context of the process


def address_of(segment):
    """The address of ``segment``'s mapping in this process."""
    return np.frombuffer(segment.mmap, dtype=np.uint8).ctypes.data


class PinningMixin:
    """``pin_host`` of ``GpuDevice``."""

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
