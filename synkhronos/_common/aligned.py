"""Arrays whose data start on a 64-byte boundary, as CPU ranks keep their
shared values.

XLA's CPU client reads a numpy argument in place only where its data are
that aligned; any other it copies on every call.  numpy aligns to 16 bytes,
so a rank's rows in a shared variable were copied at every call of a JAX
function (see the docs page "Benchmarks", *Design decisions*).
"""

import numpy as np

__all__ = ["ALIGNMENT", "aligned_copy", "aligned_empty"]

ALIGNMENT = 64


def aligned_empty(shape, dtype):
    """An uninitialized C-contiguous array of ``shape`` and ``dtype`` whose data
    start on an ``ALIGNMENT``-byte boundary."""
    dtype = np.dtype(dtype)
    shape = tuple(shape) if np.ndim(shape) else (int(shape),)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_copy(value, dtype=None):
    """A copy of ``value`` (as ``dtype``) that nothing else holds, aligned as
    ``aligned_empty``'s."""
    value = np.asarray(value)
    out = aligned_empty(value.shape, value.dtype if dtype is None else dtype)
    np.copyto(out, value, casting="unsafe")
    return out
