"""``synkhronos.pymc._packed``: a batched evaluation packed into one matrix of
points and one of results gives, per point, the unpacked graph's results, for
any number of points and any parameter shapes (scalars, vectors, matrices);
graphs it cannot pack (a shape not static, mixed dtypes) are left alone."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pymc")  # synkhronos.pymc needs it

from synkhronos.pymc._packed import packed_graph  # noqa: E402

_SHAPES = st.lists(st.sampled_from([(), (1,), (3,), (2, 3)]), min_size=1, max_size=3)


def _graph(shapes, dtype):
    """Stacked parameters of ``shapes`` and batched outputs: a log-density per
    point (a sum over everything) and a result per parameter of its shape."""
    stacked = [pt.tensor(dtype=dtype, shape=(None,) + s, name="p%d" % i) for i, s in enumerate(shapes)]
    flat = [s.reshape((s.shape[0], -1)) for s in stacked]
    logp = sum((f ** 2).sum(axis=1) for f in flat)
    grads = [2 * s + i for i, s in enumerate(stacked)]
    return stacked, [logp] + grads


@settings(max_examples=25, deadline=None)
@given(shapes=_SHAPES, k=st.integers(1, 5), dtype=st.sampled_from(["float64", "float32"]),
       seed=st.integers(0, 2**16))
def test_packed_results_are_the_unpacked_graphs(shapes, k, dtype, seed):
    stacked, outputs = _graph(shapes, dtype)
    points, packed, packing = packed_graph(stacked, outputs)
    rng = np.random.default_rng(seed)
    per_point = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(k)]
    plain = pytensor.function(stacked, outputs, mode="FAST_COMPILE")
    want = plain(*[np.stack([p[i] for p in per_point]) for i in range(len(shapes))])
    got = pytensor.function([points], packed, mode="FAST_COMPILE")(packing.points(per_point, len(shapes)))
    assert got.dtype == np.dtype(dtype) and got.shape[0] == k
    results = packing.results(got)
    for j in range(k):
        assert len(results[j]) == len(outputs)
        for w, g in zip(want, results[j]):
            assert g.shape == w[j].shape
            np.testing.assert_array_equal(g, w[j])


def test_graphs_it_cannot_pack_are_left_alone():
    stacked, outputs = _graph([(3,)], "float64")
    loose = pt.tensor(dtype="float64", shape=(None, None), name="free")
    assert packed_graph([loose], [loose.sum(axis=1)]) is None, "a shape not static"
    count = pt.tensor(dtype="int64", shape=(None,), name="count")
    assert packed_graph(stacked + [count], outputs) is None, "a discrete parameter"
    assert packed_graph(stacked, outputs + [outputs[0].astype("float32")]) is None, "mixed dtypes"
