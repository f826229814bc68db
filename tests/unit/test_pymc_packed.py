"""``synkhronos.pymc._packed``: a batched evaluation packed into one matrix of
points and one of results gives, per point, the unpacked graph's results, for
any number of points and any parameter shapes (scalars, vectors, matrices); so
does one point packed into one vector, its shapes static or given; a point of
another shape is refused, naming the parameter; graphs it cannot pack (a shape
not known, mixed dtypes) are left alone."""

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


def _one_point(shapes, dtype, static=True):
    """One point's parameters of ``shapes`` (their types' shapes left open
    unless ``static``) and outputs as ``_graph``'s."""
    params = [pt.tensor(dtype=dtype, shape=s if static else (None,) * len(s), name="p%d" % i)
              for i, s in enumerate(shapes)]
    logp = sum((p ** 2).sum() for p in params)
    return params, [logp] + [2 * p + i for i, p in enumerate(params)]


@settings(max_examples=25, deadline=None)
@given(shapes=_SHAPES, static=st.booleans(), dtype=st.sampled_from(["float64", "float32"]),
       seed=st.integers(0, 2**16))
def test_one_packed_point_gives_the_unpacked_graphs_results(shapes, static, dtype, seed):
    params, outputs = _one_point(shapes, dtype, static)
    point, packed, packing = packed_graph(params, outputs, batched=False, shapes=shapes)
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(s).astype(dtype) for s in shapes]
    want = pytensor.function(params, outputs, mode="FAST_COMPILE")(*values)
    got = pytensor.function([point], packed, mode="FAST_COMPILE")(packing.point(values))
    assert got.dtype == np.dtype(dtype) and got.ndim == 1
    results = packing.result(got)
    assert len(results) == len(outputs)
    for w, g in zip(want, results):
        assert g.shape == w.shape and g.dtype == w.dtype
        # (PyTensor 2.38 squares a float32 scalar read from the vector a rounding apart)
        np.testing.assert_allclose(g, w, rtol=2.5e-7 if dtype == "float32" else 0)


def test_shapes_not_static_are_packed_as_given_and_other_shapes_refused():
    params, outputs = _one_point([(3,), (2, 3)], "float64", static=False)
    assert packed_graph(params, outputs, batched=False) is None, "no shapes given"
    _, _, packing = packed_graph(params, outputs, batched=False, shapes=[(3,), (2, 3)], names=["u", "w"])
    with pytest.raises(ValueError, match=r"'w' has shape \(3, 2\).*built for \(2, 3\)"):
        packing.point([np.zeros(3), np.zeros((3, 2))])
    stacked, outs = _graph([(3,)], "float64")
    loose = [pt.tensor(dtype="float64", shape=(None, None), name="g")]
    _, _, batched = packed_graph(loose, [loose[0].sum(axis=1), 2 * loose[0]], shapes=[(4,)])
    assert batched.param_shapes == [(4,)] and batched.out_shapes == [(), (4,)]
