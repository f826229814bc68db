"""Graphs as users' model libraries build them: layers as ``OpFromGraph``
subclasses (pytensor-ml's ``LayerOp`` is one) whose gradients were taken, inputs
with static shapes, Ops that only cloudpickle can copy, and one that nothing can."""

import threading

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.builders import OpFromGraph
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

import synkhronos as synk


class DenseLayer(OpFromGraph):
    """A layer as model libraries write one: an OpFromGraph subclass with props."""

    __props__ = ("n_out",)

    def __init__(self, *args, n_out, **kwargs):
        self.n_out = n_out
        super().__init__(*args, **kwargs)


def dense(x, w, b):
    xi, wi, bi = pt.matrix("xi"), pt.matrix("wi"), pt.vector("bi")
    return DenseLayer([xi, wi, bi], [pt.tanh(xi @ wi + bi)], n_out=3)(x, w, b)


@pytest.fixture(scope="module")
def session():
    synk.close()
    synk.fork(2, use_gpu=False)
    yield
    synk.close()


def test_layers_with_gradients_distribute_and_train_like_pytensor(session):
    rng = np.random.default_rng(0)
    w0, b0 = rng.standard_normal((4, 3)), rng.standard_normal(3)
    w, b = pytensor.shared(w0.copy(), name="w"), pytensor.shared(b0.copy(), name="b")
    x, y = pt.matrix("x"), pt.matrix("y")
    loss = ((dense(x, w, b) - y) ** 2).mean()
    grads = pytensor.grad(loss, [w, b])  # caches the layer's gradient Op (a closure) in it
    step = [(p, p - 0.1 * g) for p, g in zip([w, b], grads)]
    f = synk.function([x, y], outputs=loss, updates=step)
    synk.distribute()
    plain = pytensor.function([x, y], [loss, *grads])
    x_np, y_np = rng.standard_normal((30, 4)), rng.standard_normal((30, 3))
    wp, bp = w0.copy(), b0.copy()
    for _ in range(3):
        w.set_value(wp), b.set_value(bp)
        want, gw, gb = plain(x_np, y_np)
        got = f(synk.data(x_np), synk.data(y_np))
        synk.all_reduce(w, op="avg"), synk.all_reduce(b, op="avg")  # ranks' halves: equal rows
        wp, bp = wp - 0.1 * gw, bp - 0.1 * gb
        np.testing.assert_allclose(got, want, rtol=1e-12)
        np.testing.assert_allclose(w.get_value(), wp, rtol=1e-12)
        np.testing.assert_allclose(synk.gather(b, nd_up=1)[1], bp, rtol=1e-12)


def test_an_input_with_a_fixed_row_count_is_refused_at_function(session):
    x = pt.tensor("batch", shape=(100, 64))
    with pytest.raises(ValueError, match=r"'?batch'? has a fixed number of rows \(shape=\(100, 64\)\).*"
                                         r"shape=\(None, 64\)"):
        synk.function([x], outputs=(x.sum(), "sum"))
    ok = pt.tensor("rows", shape=(None, 64))  # the fix it names; broadcast inputs may be fixed
    w = pt.tensor("w", shape=(64, 2))
    synk.function([ok], bcast_inputs=[w], outputs=(ok.dot(w).sum(), "sum"))


class _Scaled(Op):
    """An Op holding a lambda: the standard pickler cannot copy it, cloudpickle can."""

    def __init__(self):
        self.fn = lambda v: 2 * v

    def make_node(self, x):
        x = pt.as_tensor(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = self.fn(inputs[0])


class _Locked(_Scaled):
    """An Op holding a lock: neither pickler can copy it."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


def test_an_op_holding_a_lambda_travels_by_cloudpickle(session):
    x = pt.vector("x")
    f = synk.function([x], outputs=(_Scaled()(x).sum(), "sum"), name="scaled")
    synk.distribute()
    assert f(synk.data(np.arange(7.0))) == 42.0


def test_a_blockwise_graph_travels(session):
    """Batched linear algebra: once PyTensor's Python implementation of a
    Blockwise has run (here in the plain function, first), its Op holds a closure
    that only cloudpickle copies."""
    a, b = pt.tensor3("a"), pt.matrix("b")
    out = pt.linalg.solve(a, b[..., None])[..., 0].sum(axis=0)
    rng = np.random.default_rng(3)
    a_np = rng.standard_normal((9, 3, 3)) + 4 * np.eye(3)
    b_np = rng.standard_normal((9, 3))
    want = pytensor.function([a, b], out, mode="FAST_COMPILE")(a_np, b_np)
    np.testing.assert_allclose(want, np.linalg.solve(a_np, b_np[..., None])[..., 0].sum(axis=0), rtol=1e-12)
    f = synk.function([a, b], outputs=(out, "sum"), mode="FAST_COMPILE")
    synk.distribute()
    np.testing.assert_allclose(f(synk.data(a_np), synk.data(b_np)), want, rtol=1e-12)


def test_an_op_that_cannot_pickle_is_named_and_the_session_goes_on(session):
    x = pt.vector("x")
    bad = synk.function([x], outputs=(_Locked()(x).sum(), "sum"), name="locked")
    good = synk.function([x], outputs=(x.sum(), "sum"), name="plain")
    with pytest.raises(TypeError, match=r"distribute\(\): function 'locked' cannot be sent to the workers: "
                                        r"neither pickle nor cloudpickle can copy its Op .*class _Locked of "
                                        r"module test_graph_libraries.*lock"):
        synk.distribute()
    assert good(synk.data(np.arange(5.0))) == 10.0  # distributed beside it
    for _ in range(2):  # every call names the cause
        with pytest.raises(TypeError, match="'locked' cannot be sent.*lock") as info:
            bad(synk.data(np.ones(4)))
        assert "lock" in str(info.value.__cause__)
    later = synk.function([x], outputs=(x.max(), "max"), name="later")
    synk.distribute()  # not poisoned
    assert later(synk.data(np.arange(5.0))) == 4.0
