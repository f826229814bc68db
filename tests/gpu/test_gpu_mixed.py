"""``fork(precision="bf16")`` on GPU ranks: XLA's bfloat16 products and convolutions give
the numbers of the numpy emulation (tests/processes/test_mixed.py) within one bfloat16 step, and
really differ from float32."""

import numpy as np
import pytensor
import pytest
from test_mixed import BF16_ULP, _graphs

import synkhronos as synk
from synkhronos._graph.bf16 import round_to_bf16


@pytest.fixture
def bf16_gpus():
    yield synk.fork(2, use_gpu=True, precision="bf16")
    synk.close()


def _within_one_step(got, want):
    return bool(np.all(np.abs(got - want) <= BF16_ULP * np.abs(want) + 1e-6))


def test_bf16_products_and_convolutions_on_gpu_ranks(bf16_gpus):
    rng = np.random.default_rng(4)
    x, w, img, k, conv = _graphs(rng)
    f = synk.function([x], outputs=(x.dot(w), None))
    c = synk.function([img], outputs=(conv, None))
    conv_pt = pytensor.function([img], conv, mode="FAST_COMPILE")  # the master's CPU, for the reference
    synk.distribute()
    xv = rng.standard_normal((6, 8)).astype("float32")
    iv = rng.standard_normal((4, 2, 5, 5)).astype("float32")
    wv, kv = w.get_value(), k.get_value()
    got = np.concatenate(f(synk.data(xv)))
    assert _within_one_step(got, round_to_bf16(round_to_bf16(xv) @ round_to_bf16(wv)))
    assert not np.allclose(got, xv @ wv, rtol=1e-4)
    k.set_value(round_to_bf16(kv))
    want_conv = round_to_bf16(np.asarray(conv_pt(round_to_bf16(iv))))
    k.set_value(kv)
    assert _within_one_step(np.concatenate(c(synk.data(iv))), want_conv)
