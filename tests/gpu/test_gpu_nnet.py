"""conv2d / pooling under JAX on GPU ranks: a CNN gradient on 2 GPUs equals PyTensor
on the CPU (numpy implementation) on the same rows; then the CPU suite's check of
the JAX implementation against numpy, on one GPU (after the fork above, JAX runs
on the master's GPU only)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
from test_nnet import _cnn, _cnn_case

import synkhronos as synk


def test_cnn_gradient_on_two_gpus():
    xv, w1v, w2v = (a.astype("float32") for a in _cnn_case(np.random.default_rng(7)))
    synk.fork(2, use_gpu=True)
    try:
        x = pt.tensor4("x", dtype="float32")
        w1 = pytensor.shared(w1v, shape=w1v.shape)
        w2 = pytensor.shared(w2v, shape=w2v.shape)
        loss = _cnn(x, w1, w2)
        outs = [loss] + pytensor.grad(loss, [w1, w2])
        f = synk.function([x], outputs=outs)
        ref = pytensor.function([x], outs, mode="FAST_COMPILE")
        synk.distribute()
        for num_slices in (1, 3):
            got = f(synk.data(xv), num_slices=num_slices)
            for g, e in zip(got, ref(xv)):
                np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)
    finally:
        synk.close()


from test_nnet import test_jax_implementation_matches_numpy  # noqa: E402,F401  (runs after the fork)
