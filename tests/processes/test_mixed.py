"""``fork(precision="bf16")``: matrix products and convolutions with bfloat16 inputs and
results, float32 elsewhere, on CPU workers (numpy emulation, or JAX with
``mode="JAX"``); plain PyTensor functions unchanged; a training run that tracks float32."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos._graph.bf16 import Bf16Op, round_to_bf16
from synkhronos.extensions import nnet, train, updates

BF16_ULP = 2.0 ** -7  # bfloat16 keeps 8 significant bits: neighbours differ by <= 2**-7 relative


@pytest.fixture(autouse=True, scope="module")
def _float32():
    """The module's graphs in float32 (bf16 rounds float32 products only; a float64
    graph is left as it is)."""
    before = pytensor.config.floatX
    pytensor.config.floatX = "float32"
    yield
    pytensor.config.floatX = before


def test_rounding_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000).astype("float32") * 10.0 ** rng.integers(-30, 30, 10000),
                        np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45,
                                  1.00390625, 1.01171875], dtype="float32")])  # ties round to even
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = round_to_bf16(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.fixture
def bf16_session():
    yield synk.fork(2, use_gpu=False, precision="bf16")
    synk.close()


def _graphs(rng):
    x = pt.matrix("x")
    w = pytensor.shared(rng.standard_normal((8, 4)).astype("float32"), name="w")
    img = pt.tensor4("img")
    k = pytensor.shared(rng.standard_normal((3, 2, 3, 3)).astype("float32"), name="k")
    conv = nnet.conv2d(img, k, padding=1)
    return x, w, img, k, conv


def test_products_and_convolutions_round_like_numpy_emulation(bf16_session):
    rng = np.random.default_rng(1)
    x, w, img, k, conv = _graphs(rng)
    # The numpy emulation is PyTensor's own linkers' (JAX's bf16 is the next test's).
    f = synk.function([x], outputs=(x.dot(w), None), mode="FAST_COMPILE")
    c = synk.function([img], outputs=[(conv, None), (pytensor.grad(conv.sum(), k), "sum")],
                      mode="FAST_COMPILE")
    wrapped = [n.op for n in c._core.plain.maker.fgraph.apply_nodes if isinstance(n.op, Bf16Op)]
    assert {type(op.op).__name__ for op in wrapped} == {"Conv2d", "Conv2dGradWeight"}
    plain = pytensor.function([x], x.dot(w))  # not a Synkhronos function: untouched
    assert not any(isinstance(n.op, Bf16Op) for n in plain.maker.fgraph.apply_nodes)
    synk.distribute()

    xv = rng.standard_normal((6, 8)).astype("float32")
    iv = rng.standard_normal((4, 2, 5, 5)).astype("float32")
    wv, kv = w.get_value(), k.get_value()
    want = round_to_bf16(round_to_bf16(xv) @ round_to_bf16(wv))
    got = np.concatenate(f(synk.data(xv)))
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(got, xv @ wv, rtol=1e-4)  # really rounded
    np.testing.assert_allclose(plain(xv), xv @ wv, rtol=1e-6)

    conv_pt = pytensor.function([img], conv)
    grad_pt = pytensor.function([img], pytensor.grad(conv.sum(), k))
    k.set_value(round_to_bf16(kv))  # the master's copy, for the references only
    want_conv = round_to_bf16(conv_pt(round_to_bf16(iv)))
    k.set_value(kv)
    got_conv, got_grad = c(synk.data(iv))
    np.testing.assert_array_equal(np.concatenate(got_conv), want_conv)
    # The weight gradient: each rank's own, rounded, then summed in float32.
    per_rank = [round_to_bf16(grad_pt(round_to_bf16(part))) for part in (iv[:2], iv[2:])]
    np.testing.assert_allclose(got_grad, per_rank[0] + per_rank[1], rtol=1e-6)


def test_jax_mode_on_cpu_workers_is_within_one_bf16_step(bf16_session):
    pytest.importorskip("jax")
    rng = np.random.default_rng(2)
    x, w, img, k, conv = _graphs(rng)
    f = synk.function([x], outputs=(x.dot(w), None), mode="JAX")
    c = synk.function([img], outputs=(conv, None), mode="JAX")
    conv_pt = pytensor.function([img], conv)
    synk.distribute()
    xv = rng.standard_normal((6, 8)).astype("float32")
    iv = rng.standard_normal((4, 2, 5, 5)).astype("float32")
    want = round_to_bf16(round_to_bf16(xv) @ round_to_bf16(w.get_value()))
    got = np.concatenate(f(synk.data(xv)))
    assert np.all(np.abs(got - want) <= BF16_ULP * np.abs(want) + 1e-6)
    kv = k.get_value()
    k.set_value(round_to_bf16(kv))
    want_conv = round_to_bf16(conv_pt(round_to_bf16(iv)))
    k.set_value(kv)
    got_conv = np.concatenate(c(synk.data(iv)))
    assert np.all(np.abs(got_conv - want_conv) <= BF16_ULP * np.abs(want_conv) + 1e-6)
    assert not np.allclose(got_conv, conv_pt(iv), rtol=1e-5)


def _train_losses(precision, steps=60):
    synk.fork(2, use_gpu=False, precision=precision)
    try:
        rng = np.random.default_rng(3)
        x, y = pt.matrix("x"), pt.matrix("y")
        w1 = pytensor.shared((rng.standard_normal((16, 32)) * 0.3).astype("float32"), name="w1")
        w2 = pytensor.shared((rng.standard_normal((32, 4)) * 0.3).astype("float32"), name="w2")
        loss = nnet.softmax_cross_entropy(pt.tanh(x.dot(w1)).dot(w2), y)
        step = train.make_train_step([x, y], loss, [w1, w2], rule=updates.adam, learning_rate=0.01)
        synk.distribute()
        xv = rng.standard_normal((256, 16)).astype("float32")
        yv = np.eye(4, dtype="float32")[(xv @ rng.standard_normal((16, 4))).argmax(axis=1)]
        xd, yd = synk.data(xv), synk.data(yv)
        return np.array([float(step(xd, yd, batch=rng.permutation(256)[:64])) for _ in range(steps)])
    finally:
        synk.close()


def test_bf16_training_tracks_float32():
    fp32, bf16 = _train_losses("highest"), _train_losses("bf16")
    assert fp32[-10:].mean() < 0.3 * fp32[:5].mean()  # it learns
    assert not np.array_equal(fp32, bf16)  # bf16 really changes the numbers...
    assert np.max(np.abs(bf16 - fp32) / fp32) < 0.02  # ...and tracks float32 within 2% at every step


def test_status_line_says_bf16_is_emulated(caplog):
    caplog.set_level("INFO", logger="synkhronos")
    synk.fork(2, use_gpu=False, precision="bf16")
    synk.close()
    assert "bf16 matrix products and convolutions emulated with numpy (slow)" in caplog.text


def test_bad_precision_is_named():
    with pytest.raises(ValueError, match="precision must be 'highest' .* 'tf32' or 'bf16', got 'fp16'"):
        synk.fork(2, use_gpu=False, precision="fp16")


def _emulated(mode_name="py"):
    """A bf16 mode that runs every op's ``perform``: the numpy emulation."""
    from pytensor.compile.mode import Mode

    from synkhronos._graph.bf16 import bf16_mode

    return bf16_mode(Mode(linker=mode_name, optimizer="fast_run"))


def _layer_graph(rng):
    """relu(x.w + b) (a product, a broadcast bias, a ReLU), its column sums (a
    reduction), its product with a full-size float32 matrix, and a comparison."""
    x = pt.matrix("x")
    w = pytensor.shared(rng.standard_normal((8, 4)).astype("float32"), name="w")
    b = pytensor.shared(rng.standard_normal(4).astype("float32"), name="b")
    v = pytensor.shared(rng.standard_normal((6, 4)).astype("float32"), name="v", shape=(6, 4))
    h = pt.maximum(x.dot(w) + b, 0)
    return x, w, b, v, [h, h.sum(axis=0), h * v, pt.gt(h, 0.5)]


def test_activations_are_stored_in_bf16_statistics_and_mixed_values_in_float32():
    from synkhronos._graph.bf16 import Bf16Load, Bf16Store

    rng = np.random.default_rng(5)
    x, w, b, v, outs = _layer_graph(rng)
    f = pytensor.function([x], outs, mode=_emulated())
    kinds = [type(n.op) for n in f.maker.fgraph.apply_nodes]
    assert kinds.count(Bf16Store) == 2  # the biased product and its ReLU
    assert kinds.count(Bf16Load) >= 1
    xv = rng.standard_normal((6, 8)).astype("float32")
    r = round_to_bf16
    pre = r(r(r(xv) @ r(w.get_value())) + b.get_value())  # product, then the bias, each stored
    h = r(np.maximum(pre, 0))
    got_h, got_sum, got_hv, got_gt = f(xv)
    np.testing.assert_array_equal(got_h, h)
    np.testing.assert_allclose(got_sum, h.sum(axis=0), rtol=1e-6)  # a float32 sum of the stored values
    np.testing.assert_array_equal(got_hv, h * v.get_value())  # a full-size float32 input: float32 result
    assert not np.array_equal(got_hv, r(got_hv))  # ...not rounded
    np.testing.assert_array_equal(got_gt, h > 0.5)
    plain = pytensor.function([x], outs)  # not a Synkhronos bf16 function: untouched
    assert not any(isinstance(n.op, (Bf16Store, Bf16Load, Bf16Op)) for n in plain.maker.fgraph.apply_nodes)


def test_jax_keeps_bf16_inside_and_returns_float32():
    pytest.importorskip("jax")
    from synkhronos._graph.bf16 import bf16_mode

    rng = np.random.default_rng(6)
    x, w, b, v, outs = _layer_graph(rng)
    f = pytensor.function([x], outs, mode=bf16_mode("JAX"))
    em = pytensor.function([x], outs, mode=_emulated())
    xv = rng.standard_normal((6, 8)).astype("float32")
    got, want = f(xv), em(xv)
    assert [np.asarray(g).dtype for g in got] == [np.dtype("float32")] * 3 + [np.dtype("bool")]
    for g, e in zip(got[:3], want[:3]):
        g = np.asarray(g)
        assert np.all(np.abs(g - e) <= 2 * BF16_ULP * np.abs(e) + 1e-5)


def test_parameters_keep_float32_through_a_bf16_update():
    """A step smaller than a bfloat16 step of the parameters must still move them:
    the update mixes in the full-size float32 parameter, so it is float32."""
    from synkhronos._graph.bf16 import Bf16Store

    rng = np.random.default_rng(7)
    x = pt.matrix("x")
    w0 = (1.0 + rng.random((8, 4))).astype("float32")
    w = pytensor.shared(w0.copy(), name="w")
    loss = pt.tanh(x.dot(w)).sum()
    f = pytensor.function([x], loss, updates=[(w, w - 1e-4 * pytensor.grad(loss, w))], mode=_emulated())
    assert any(isinstance(n.op, Bf16Store) for n in f.maker.fgraph.apply_nodes)  # the tanh and the step
    f(rng.standard_normal((16, 8)).astype("float32"))
    w1 = w.get_value()
    assert w1.dtype == np.float32
    moved = w1 != w0
    assert moved.mean() > 0.9  # each weight moved by less than half its bfloat16 step
    assert not np.array_equal(w1, round_to_bf16(w1))


def _pooling_graph(rng):
    """relu(conv(x)) max-pooled (3x3, stride 2: overlapping windows) and
    average-pooled, a loss of both, and its gradient with respect to x."""
    x = pt.tensor4("x")
    w = pytensor.shared(rng.standard_normal((4, 2, 3, 3)).astype("float32"), name="w", shape=(4, 2, 3, 3))
    h = pt.maximum(nnet.conv2d(x, w, padding=1), 0)
    p, a = nnet.max_pool2d(h, 3, stride=2, padding=1), nnet.avg_pool2d(h, 2)
    loss = (p * p).sum() + (a * a).sum()
    return x, [p, a, pytensor.grad(loss, x)]


def test_poolings_keep_bf16_storage_and_match_the_emulation():
    """Poolings (``bf16_storage``) read and write bfloat16 like elementwise ops;
    JAX sums their gradients in float32 as the emulation does."""
    pytest.importorskip("jax")
    from synkhronos._graph.bf16 import Bf16Store, bf16_mode

    rng = np.random.default_rng(9)
    x, outs = _pooling_graph(rng)
    em = pytensor.function([x], outs, mode=_emulated())
    stored = {type(n.inputs[0].owner.op).__name__ for n in em.maker.fgraph.apply_nodes
              if isinstance(n.op, Bf16Store) and n.inputs[0].owner is not None}
    assert {"Pool2d", "Pool2dGrad"} <= stored
    f = pytensor.function([x], outs, mode=bf16_mode("JAX"))
    xv = rng.standard_normal((3, 2, 9, 9)).astype("float32")
    for g, e in zip(f(xv), em(xv)):
        g = np.asarray(g)
        assert g.dtype == np.float32
        np.testing.assert_array_equal(round_to_bf16(e), e)  # outputs: stored values, loaded
        assert np.all(np.abs(g - e) <= 2 * BF16_ULP * np.abs(e) + 1e-5)


def test_comparisons_of_stored_values_see_them_stored_under_jax():
    """PyTensor's ReLU gradient is eq(maximum(c, 0), c) * g.  XLA on a CPU keeps a
    convolution's result in float32 inside a fusion; the comparison must still see
    both sides as stored, or the gradient is zero almost everywhere."""
    pytest.importorskip("jax")
    from synkhronos._graph.bf16 import bf16_mode

    rng = np.random.default_rng(10)
    x = pt.tensor4("x")
    w = pytensor.shared(rng.standard_normal((4, 2, 3, 3)).astype("float32"), name="w", shape=(4, 2, 3, 3))
    c = nnet.conv2d(x, w, padding=1)
    grad = pytensor.grad((pt.maximum(c, 0) ** 2).sum(), c)
    xv = rng.standard_normal((3, 2, 9, 9)).astype("float32")
    got = np.asarray(pytensor.function([x], grad, mode=bf16_mode("JAX"))(xv))
    want = pytensor.function([x], grad, mode=_emulated())(xv)
    np.testing.assert_array_equal(got != 0, want != 0)
    assert np.all(np.abs(got - want) <= 2 * BF16_ULP * np.abs(want) + 1e-5)


def test_a_stored_sum_of_three_terms_is_two_stored_adds():
    """Three stored terms are added two at a time, each sum stored: no add of three
    inputs is left, and the result is the numpy model's."""
    from pytensor.compile.mode import Mode
    from pytensor.scalar import Add
    from pytensor.tensor.elemwise import Elemwise

    from synkhronos._graph.bf16 import bf16_mode

    rng = np.random.default_rng(11)
    x = pt.matrix("x")
    ws = [pytensor.shared(rng.standard_normal((8, 4)).astype("float32"), name="w%d" % i) for i in range(3)]
    total = x.dot(ws[0]) + x.dot(ws[1]) + x.dot(ws[2])
    unfused = bf16_mode(Mode(linker="py", optimizer="fast_run")).excluding("fusion")
    f = pytensor.function([x], total, mode=unfused)
    adds = [len(n.inputs) for n in f.maker.fgraph.apply_nodes
            if isinstance(n.op, Elemwise) and isinstance(n.op.scalar_op, Add)]
    assert adds == [2, 2]
    xv = rng.standard_normal((6, 8)).astype("float32")
    r = round_to_bf16
    p = [r(r(xv) @ r(w.get_value())) for w in ws]
    np.testing.assert_array_equal(f(xv), r(r(p[0] + p[1]) + p[2]))
