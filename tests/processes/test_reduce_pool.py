"""Large outputs and collectives are reduced by the master's threads, chunk by
chunk (``reduce.ChunkPool``): the results must be those of one pass, to the bit,
for every reduce mode, dtype, rank count and size across the thresholds; and a
function's large outputs through a session equal numpy's on the same rows."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import synkhronos as synk
from synkhronos._common import reduce
from synkhronos._common.reduce import ChunkPool, reduce_values

OPS = ("avg", "sum", "prod", "max", "min")
DTYPES = ("float32", "float64", "int32", "int64")


@pytest.fixture(scope="module")
def pool():
    p = ChunkPool(threads=reduce.MIN_THREADS)
    yield p
    p.close()


def _values(rng, n, shape, dtype):
    if dtype.startswith("int"):
        return [rng.integers(-50, 50, shape).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


@settings(max_examples=150, deadline=None)
@given(op=st.sampled_from(OPS), dtype=st.sampled_from(DTYPES), ranks=st.integers(2, 5),
       size=st.integers(1, 70), cols=st.sampled_from([1, 3]), weighted=st.booleans(), seed=st.integers(0, 99))
def test_chunks_give_the_one_pass_result_to_the_bit(pool, op, dtype, ranks, size, cols, weighted, seed):
    """Thresholds made tiny (8 elements a chunk, 64 bytes) so that sizes cross
    them: below, at and above a chunk, one element past, many chunks.  Both
    paths also equal a plain numpy model."""
    rng = np.random.default_rng(seed)
    values = _values(rng, ranks, (size, cols), dtype)
    weights = [int(w) for w in rng.integers(1, 9, ranks)] if weighted else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reduce, "CHUNK_ELEMENTS", 8)
        mp.setattr(reduce, "PARALLEL_BYTES", 64)
        want = reduce_values(values, op, weights)
        got = reduce_values(values, op, weights, pool)
        assert pool.takes(values, op) == (values[0].nbytes >= 64)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(want, _numpy_model(values, op, weights), rtol=1e-5, atol=1e-6)


def _numpy_model(values, op, weights):
    """The reduction in float64 numpy, one stacked array: what both paths must equal."""
    stacked = np.stack(values).astype("float64")
    if op == "avg" and weights is None and values[0].dtype.kind == "i":
        return np.trunc(stacked.sum(axis=0) / len(values))  # truncated toward zero, as collectives give it
    if op == "avg":
        w = np.ones(len(values)) if weights is None else np.asarray(weights, "float64")
        return np.tensordot(w, stacked, axes=1) / w.sum()
    return {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](stacked, axis=0)


@pytest.mark.parametrize("elements", [reduce.PARALLEL_BYTES // 4 - 1, reduce.PARALLEL_BYTES // 4,
                                      3 * reduce.CHUNK_ELEMENTS + 1])
def test_real_thresholds(pool, elements):
    """At the thresholds as shipped: one element short of the parallel size goes
    the one-pass way, the rest by chunks, and both give the same."""
    rng = np.random.default_rng(elements)
    values = _values(rng, 3, (elements,), "float32")
    assert pool.takes(values, "avg") == (elements * 4 >= reduce.PARALLEL_BYTES)
    np.testing.assert_array_equal(reduce_values(values, "avg", [3, 1, 2], pool),
                                  reduce_values(values, "avg", [3, 1, 2]))


def test_mixed_shapes_and_one_thread_take_the_one_pass_path():
    a, b = np.ones((1 << 19,), "float32"), np.ones((1 << 18, 2), "float32")
    assert not ChunkPool(threads=4).takes([a, b], "sum")
    assert not ChunkPool(threads=reduce.MIN_THREADS - 1).takes([a, a], "sum")
    assert not ChunkPool(threads=4).takes([a, a], None)
    with pytest.raises(ValueError, match="one shape"):
        reduce_values([a, b], "sum", pool=ChunkPool(threads=4))


def test_large_outputs_of_a_session_equal_numpy():
    """A 1 MiB output per rank (the pool's threshold) under each mode, rows
    split unevenly (7 rows on 2 ranks), and an all_reduce of a 2 MiB shared
    variable, through a pool of MIN_THREADS threads whatever the machine's cores."""
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((7, 1 << 18)).astype("float32")
    synk.fork(2, use_gpu=False)
    rt = synk._session.runtime.current()
    rt.reduce_pool.close()
    rt.reduce_pool = ChunkPool(threads=reduce.MIN_THREADS)
    try:
        x = pt.matrix("x", dtype="float32")
        per_rank = x.sum(axis=0) * 1  # one row-sum per rank
        f = synk.function([x], [(per_rank, "sum"), (per_rank, "max"), (x.mean(axis=0), "avg"),
                                (per_rank, "avg")])
        s = pytensor.shared(np.zeros(1 << 19, "float32"))
        g = synk.function([x], (x.sum(), "sum"), updates=[(s, s + x[0, 0])])
        synk.distribute()
        got = f(synk.data(xv))
        assert rt.reduce_pool._executor is not None, "the pool reduced the outputs"
        halves = [xv[:4], xv[4:]]  # the master's rank takes the first, larger share
        sums = [h.sum(axis=0) for h in halves]
        np.testing.assert_allclose(got[0], sums[0] + sums[1], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[1], np.maximum(sums[0], sums[1]), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[2], xv.mean(axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[3], (4 * sums[0] + 3 * sums[1]) / 7, rtol=1e-5, atol=1e-5)
        g(synk.data(xv))
        synk.all_reduce(s, op="sum")
        want = np.full(1 << 19, np.float32(xv[0, 0]) + np.float32(xv[4, 0]))
        for v in synk.gather(s):
            np.testing.assert_allclose(v, want, rtol=1e-6)
    finally:
        synk.close()
    assert rt.reduce_pool._executor is None, "close() stopped the pool's threads"
