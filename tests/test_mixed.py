"""``fork(precision="bf16")``: matrix products and convolutions with bfloat16 inputs and
results, float32 elsewhere, on CPU workers (numpy emulation, or JAX with
``mode="JAX"``); plain PyTensor functions unchanged; a training run that tracks float32."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos._mixed import Bf16Op, round_to_bf16
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
    f = synk.function([x], outputs=(x.dot(w), None))
    c = synk.function([img], outputs=[(conv, None), (pytensor.grad(conv.sum(), k), "sum")])
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
