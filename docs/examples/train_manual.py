"""The original manual's training pattern, by hand: a CNN built with the nnet ops,
gradient on every rank, one all-reduce, then the update.

This is what ``make_train_step`` automates; spelled out, it shows where the one
collective of a step goes.  The result is checked against plain PyTensor.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import nnet, updates

n = synk.fork(2)
rng = np.random.default_rng(1)
x = pt.tensor4("x")                                      # NCHW images of any size
y = pt.matrix("y")                                       # one-hot targets
w = pytensor.shared((rng.standard_normal((4, 1, 3, 3)) * 0.3).astype("float32"), name="w")
v = pytensor.shared((rng.standard_normal((4 * 3 * 3, 2)) * 0.3).astype("float32"), name="v")
h = nnet.max_pool2d(pt.maximum(nnet.conv2d(x, w, padding="same"), 0), 2)   # 6x6 -> 3x3
loss = nnet.softmax_cross_entropy(pt.flatten(h, 2).dot(v), y)

grad_updates, param_updates, grad_shared = updates.sgd(loss, [w, v], learning_rate=0.1)
f_grad = synk.function([x, y], outputs=loss, updates=grad_updates)   # each rank: its mean gradient
f_update = synk.function([], updates=param_updates)                   # each rank: the same update
f_loss = pytensor.function([x, y], loss)
f_grads = pytensor.function([x, y], pytensor.grad(loss, [w, v]))   # for the check below
synk.distribute()

x_np = rng.standard_normal((64, 1, 6, 6)).astype("float32")
y_np = np.eye(2, dtype="float32")[(x_np.mean(axis=(1, 2, 3)) > 0).astype(int)]
x_dat, y_dat = synk.data(x_np), synk.data(y_np)

w0, v0 = w.get_value(), v.get_value()
before = f_loss(x_np, y_np)
g_w, g_v = f_grads(x_np, y_np)              # the gradient of one process on all 64 rows
mean_loss = f_grad(x_dat, y_dat)            # 32 rows on each rank
synk.all_reduce(grad_shared, op="avg")      # one collective for all parameters
f_update()
assert np.allclose(mean_loss, before)

# The same SGD step as one process.
assert np.allclose(w.get_value(), w0 - 0.1 * g_w, atol=1e-6)
assert np.allclose(v.get_value(), v0 - 0.1 * g_v, atol=1e-6)
assert np.allclose(synk.get_value(1, w), w.get_value())   # rank 1 took the same step
print("loss %.4f -> %.4f on %d ranks" % (before, f_loss(x_np, y_np), n))
synk.close()
print("All assertions passed.")
