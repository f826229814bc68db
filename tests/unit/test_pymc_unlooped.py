"""``_vectorized.unlooped_axes``: a Blockwise of ``Join`` or ``LogSumExp`` (what
a mixture's log-density holds) becomes the Op itself along shifted axes, and
the batched graph gives each point's values, gradient included."""

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
from synkhronos.pymc._vectorized import _looped, _unlooping  # noqa: E402

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
    assert _looped(rewritten([batched], *_unlooping())) == []


@functools.cache
def _functions(axis):
    """The rewritten batched graph's values and gradient (as ``_differentiated``
    takes it, after the batching), and one point's, compiled once per axis."""
    (w, y, single), (stacked, batched) = _batched(axis)
    (out,) = rewritten([batched], *_unlooping())
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
