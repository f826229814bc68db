"""Arrays aligned for XLA's CPU client (``_common.aligned``): every shape and
dtype a shared variable holds keeps its values, shape and dtype, is a fresh
C-contiguous writable array, and (where it has data) starts on a 64-byte
boundary; and a JAX function reads such an array in place, where it copies a
16-byte aligned one."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from synkhronos._common.aligned import ALIGNMENT, aligned_copy, aligned_empty

DTYPES = st.sampled_from(["float64", "float32", "int64", "int32", "int16", "uint8", "bool", "complex128"])


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_aligned_copy_keeps_the_values_in_aligned_memory(data):
    dtype = data.draw(DTYPES)
    value = data.draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7)))
    sliced = data.draw(st.booleans()) and value.ndim > 0 and value.shape[0] > 1
    if sliced:  # a strided view, as a rank's share of rows may be
        value = value[::2]
    out = aligned_copy(value)
    assert out.shape == value.shape and out.dtype == value.dtype
    assert out.flags.c_contiguous and out.flags.writeable
    np.testing.assert_array_equal(out, value)
    assert not np.shares_memory(out, value)
    if out.nbytes:
        assert out.ctypes.data % ALIGNMENT == 0


@pytest.mark.parametrize("nbytes", [63, 64, 65, 65536 - 8, 65536 + 8, 128 * 1024 + 8, (4 << 20) + 8,
                                    (32 << 20) + 8])
def test_aligned_across_the_allocators_size_thresholds(nbytes):
    """Past glibc's mmap threshold (128 KiB by default, raised as the process
    frees large blocks) an array comes from its own pages, with a header before
    the data; the alignment must hold on both sides of every such size."""
    n = nbytes // 8
    value = np.arange(n, dtype=np.float64)
    for _ in range(3):  # fresh blocks and reused ones
        out = aligned_copy(value)
        assert out.ctypes.data % ALIGNMENT == 0
        np.testing.assert_array_equal(out, value)
        del out


def test_aligned_copy_casts_to_the_dtype_asked_for():
    out = aligned_copy([1.7, -2.2, 3.0], "int32")
    assert out.dtype == np.int32 and out.tolist() == [1, -2, 3]
    assert aligned_empty(5, "float64").shape == (5,)


def test_jax_reads_an_aligned_array_in_place():
    """The reason for the alignment: JAX takes an aligned numpy array as it is
    on the CPU (``device_put``, as for a jitted function's argument); one 16
    bytes off, it copies."""
    jax = pytest.importorskip("jax")
    cpu = jax.devices("cpu")[0]
    aligned = aligned_copy(np.arange(4096, dtype=np.float32))  # (float32: whatever JAX's 64-bit mode)
    raw = np.empty(4096 * 4 + ALIGNMENT + 16, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT + 16
    off = raw[start:start + 4096 * 4].view(np.float32)
    off[...] = aligned
    here, copied = jax.device_put(aligned, cpu), jax.device_put(off, cpu)
    assert here.unsafe_buffer_pointer() == aligned.ctypes.data
    assert copied.unsafe_buffer_pointer() != off.ctypes.data
