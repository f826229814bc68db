"""``_unlooped``: a Blockwise of ``Join`` or ``LogSumExp`` (what a mixture's
log-density holds) becomes the Op itself along shifted axes; shapes that the
vectorized graph takes once per point (a categorical's ``p[arange(n), y]``)
become one; and the batched graph gives each point's values, gradient
included."""

import functools

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytensor.graph.replace import vectorize_graph

pytest.importorskip("pymc")  # synkhronos.pymc needs it

from synkhronos._graph.editing import rewritten  # noqa: E402
from synkhronos.pymc._unlooped import shape_unlooping, unlooping  # noqa: E402
from synkhronos.pymc._vectorized import _looped  # noqa: E402

PLAIN = pytensor.compile.mode.Mode(linker="py", optimizer=None)


def _mixture_like(w, y, axis):
    """A log-density shaped like a mixture's: components joined along ``axis``
    (one of them the same for every point), then their log-sum-exp."""
    fixed = pt.zeros_like(y)[:, None] + 1.5  # no parameter: unbatched when vectorized
    joined = pt.join(axis, y[:, None] * w[0], fixed, y[:, None] - w[None, 1:])
    return pt.logsumexp(joined, axis=1).sum() + (joined * joined).sum()


def _batched(axis):
    w, y = pt.vector("w", dtype="float64"), pt.vector("y", dtype="float64")
    single = _mixture_like(w, y, axis)
    stacked = pt.matrix("W", dtype="float64")
    batched = vectorize_graph(single, replace={w: stacked})
    return (w, y, single), (stacked, batched)


def test_a_mixtures_join_and_log_sum_exp_lose_their_loop():
    """Vectorized as PyTensor does it, the graph keeps a Blockwise (a loop
    over the points); rewritten, none is left."""
    _, (_, batched) = _batched(1)
    assert _looped([batched]), "PyTensor now batches this graph itself: the rewrite may go"
    assert _looped(rewritten([batched], *unlooping())) == []


@functools.cache
def _functions(axis):
    """The rewritten batched graph's values and gradient (as ``_differentiated``
    takes it, after the batching), and one point's, compiled once per axis."""
    (w, y, single), (stacked, batched) = _batched(axis)
    (out,) = rewritten([batched], *unlooping())
    assert _looped([out]) == []
    batched_fn = pytensor.function([stacked, y], [out, pt.grad(out.sum(), stacked)], mode=PLAIN)
    one_fn = pytensor.function([w, y], [single, pt.grad(single, w)], mode=PLAIN)
    return batched_fn, one_fn


# (At least one row: a rank with none does not run the graph, and PyTensor's
# own batched graph of this one, looped or not, fails its broadcast check at 0.)
@settings(max_examples=25, deadline=None)
@given(points=st.integers(1, 4), rows=st.integers(1, 6), comps=st.integers(2, 4),
       axis=st.sampled_from([1, -1]), seed=st.integers(0, 2**16))
def test_the_unlooped_graph_gives_each_points_value_and_gradient(points, rows, comps, axis, seed):
    batched_fn, one_fn = _functions(axis)
    rng = np.random.default_rng(seed)
    wv, yv = rng.uniform(-2, 2, (points, comps)), rng.uniform(-2, 2, rows)
    got, got_grad = batched_fn(wv, yv)
    for k in range(points):
        want, want_grad = one_fn(wv[k], yv)
        np.testing.assert_allclose(got[k], want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_grad[k], want_grad, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ shapes
def _categorical_like(w, x, y):
    """A categorical log-density over rows, as PyMC writes one: the class
    probabilities of each row picked by ``p[arange(rows), y]``, where ``rows``
    is a shape of a value computed from the parameter."""
    eta = pt.concatenate([pt.zeros((x.shape[0], 1)), x @ w], axis=1)
    p = pt.special.softmax(eta, axis=1)
    return pt.log(p[pt.arange(p.shape[0]), y]).sum()


@functools.cache
def _categorical_functions():
    w, x, y = pt.matrix("w", dtype="float64"), pt.matrix("x", dtype="float64"), pt.vector("y", dtype="int64")
    single = _categorical_like(w, x, y)
    stacked = pt.tensor3("W", dtype="float64")
    batched = vectorize_graph(single, replace={w: stacked})
    assert _looped(rewritten([batched], *unlooping())), "PyTensor now batches this graph itself"
    (out,) = rewritten([batched], *shape_unlooping())
    assert _looped([out]) == []
    batched_fn = pytensor.function([stacked, x, y], [out, pt.grad(out.sum(), stacked)], mode=PLAIN)
    one_fn = pytensor.function([w, x, y], [single, pt.grad(single, w)], mode=PLAIN)
    return batched_fn, one_fn


@settings(max_examples=25, deadline=None)
@given(points=st.integers(1, 4), rows=st.integers(1, 6), features=st.integers(1, 3),
       classes=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_shapes_taken_once_per_point_become_one_and_each_point_keeps_its_values(points, rows, features,
                                                                              classes, seed):
    batched_fn, one_fn = _categorical_functions()
    rng = np.random.default_rng(seed)
    wv = rng.uniform(-2, 2, (points, features, classes - 1))
    xv, yv = rng.uniform(-2, 2, (rows, features)), rng.integers(0, classes, rows)
    got, got_grad = batched_fn(wv, xv, yv)
    for k in range(points):
        want, want_grad = one_fn(wv[k], xv, yv)
        np.testing.assert_allclose(got[k], want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_grad[k], want_grad, rtol=1e-12, atol=1e-12)
