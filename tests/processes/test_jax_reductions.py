"""A float32 graph stays float32 on JAX ranks where JAX's 64-bit mode is on
(``floatX`` float64, PyTensor's default): PyTensor's JAX backend returns a
float32 sum as float64 (its accumulator's dtype), which turned a float32
network's gradient and its updated weights into float64 from the first step."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _jax64 import jax_x64

import synkhronos as synk

jax = pytest.importorskip("jax")


@pytest.fixture
def x64():
    """floatX float64 and JAX's 64-bit mode, as ``fork()`` sets them then."""
    before = pytensor.config.floatX
    pytensor.config.floatX = "float64"
    with jax_x64():
        yield
    pytensor.config.floatX = before


def _ones_after_a_large_value():
    """A float32 sum that only a float64 accumulator gets right: each 1 added to
    2**24 one at a time in float32 is lost."""
    return np.concatenate([[2.0**24], np.ones(4095)]).astype("float32")


def test_plain_jax_mode_returns_another_dtype(x64):
    """The premise: PyTensor's JAX backend alone gives float64 for a float32 sum."""
    x = pt.vector("x", dtype="float32")
    got = np.asarray(pytensor.function([x], x.sum(), mode="JAX")(_ones_after_a_large_value()))
    if got.dtype == np.float32:
        pytest.skip("this PyTensor's JAX backend keeps the declared dtype")
    assert got.dtype == np.float64


def test_sum_has_its_dtype_and_a_float64_accumulator(x64):
    from synkhronos._graph.jax_reductions import reduction_dtypes_mode

    x = pt.vector("x", dtype="float32")
    xv = _ones_after_a_large_value()
    f = pytensor.function([x], [x.sum(), x.prod(), (x * x).sum(), x.max()], mode=reduction_dtypes_mode("JAX"))
    got = [np.asarray(v) for v in f(xv)]
    assert [v.dtype for v in got] == [np.float32] * 4
    assert got[0] == np.float32(xv.astype("float64").sum()) == 2.0**24 + 4095 + 1  # float32 rounds to even
    want = pytensor.function([x], [x.sum(), x.prod(), (x * x).sum(), x.max()], mode="FAST_COMPILE")(xv)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_float32_training_stays_float32_on_every_rank(x64):
    """Three steps of a float32 softmax regression on 2 JAX ranks, each updating
    its own weights from its own rows: the weights stay float32 on every rank
    and equal plain PyTensor's training on that rank's rows."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((5, 3)).astype("float32")
    xv = rng.standard_normal((40, 5)).astype("float32")
    yv = np.eye(3, dtype="float32")[rng.integers(0, 3, 40)]

    def build(w):
        x, y = pt.matrix("x", dtype="float32"), pt.matrix("y", dtype="float32")
        loss = -(y * pt.log(pt.special.softmax(x @ w, axis=1))).sum(axis=1).mean()
        grad = pytensor.grad(loss, w)
        return [x, y], [loss, grad], [(w, w - np.float32(0.5) * grad)]

    halves = [slice(0, 20), slice(20, 40)]
    plain_w = [pytensor.shared(w0.copy()) for _ in halves]
    plain = []
    for pw in plain_w:
        ins, outs, updates = build(pw)
        plain.append(pytensor.function(ins, outs, updates=updates, mode="FAST_COMPILE"))
    synk.fork(2, use_gpu=False)
    try:
        w = pytensor.shared(w0.copy())
        ins, (loss, grad), updates = build(w)
        f = synk.function(ins, [(loss, "avg"), (grad, "avg")], updates=updates, mode="JAX")
        synk.distribute()
        x_d, y_d = synk.data(xv), synk.data(yv)
        for _ in range(3):
            got = f(x_d, y_d)
            want = [p(xv[h], yv[h]) for p, h in zip(plain, halves)]
            assert [np.asarray(v).dtype for v in got] == [np.float32] * 2
            np.testing.assert_allclose(got[0], (want[0][0] + want[1][0]) / 2, rtol=1e-5)
        values = synk.gather(w)
        assert [v.dtype for v in values] == [np.float32] * 2, [v.dtype for v in values]
        for v, p in zip(values, plain_w):
            np.testing.assert_allclose(v, p.get_value(), rtol=1e-5, atol=1e-6)
    finally:
        synk.close()
