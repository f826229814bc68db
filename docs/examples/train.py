"""Data-parallel training: an update rule, one all-reduce per step, and a check
that two ranks take the same steps as one process on the whole batch.

``make_train_step`` builds the gradient function, the all-reduce of the flat
gradient and the update into one callable.  The same model is trained by a
plain PyTensor function with the same rule for comparison.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos.extensions import train, updates

synk.fork(2)
rng = np.random.default_rng(0)


def mlp_params():
    return [pytensor.shared((rng.standard_normal(shape) * 0.3).astype("float32"), name=name)
            for name, shape in [("w1", (8, 16)), ("b1", (16,)), ("w2", (16, 3)), ("b2", (3,))]]


def loss_of(params, x, y):
    w1, b1, w2, b2 = params
    logits = pt.tanh(x.dot(w1) + b1).dot(w2) + b2
    return pt.mean(-pt.log(pt.special.softmax(logits, axis=1))[pt.arange(y.shape[0]), y])


x, y = pt.matrix("x"), pt.ivector("y")
params = mlp_params()
reference = [pytensor.shared(p.get_value().copy()) for p in params]

step = train.make_train_step([x, y], loss_of(params, x, y), params, rule=updates.adam,
                             learning_rate=0.01)
# The same rule in one process: its gradient function writes the flat gradient,
# its update function applies it.
grad_updates, param_updates, _ = updates.adam(loss_of(reference, x, y), reference, learning_rate=0.01)
# (Its grad_updates are (shared, update, "avg") triples for synk.function; PyTensor takes pairs.)
ref_grad = pytensor.function([x, y], loss_of(reference, x, y), updates=[u[:2] for u in grad_updates])
ref_update = pytensor.function([], updates=param_updates)
synk.distribute()

x_np = rng.standard_normal((301, 8)).astype("float32")
y_np = (x_np[:, 0] > 0).astype("int32") + (x_np[:, 1] > 0).astype("int32")
x_dat, y_dat = synk.data(x_np), synk.data(y_np)

for epoch in range(5):
    for batch in np.array_split(rng.permutation(301), 4):      # uneven splits on purpose
        loss = step(x_dat, y_dat, batch=batch)
        ref_loss = ref_grad(x_np[batch], y_np[batch])
        ref_update()
        assert np.allclose(loss, ref_loss, rtol=1e-4, atol=1e-6)
    print("epoch %d  loss %.4f" % (epoch, loss))

for p, r in zip(params, reference):                  # the master's parameters...
    assert np.allclose(p.get_value(), r.get_value(), rtol=1e-4, atol=1e-6)
for rank_value in synk.gather(params[0], nd_up=1):   # ...and every rank's are the same
    assert np.allclose(rank_value, reference[0].get_value(), rtol=1e-4, atol=1e-6)
synk.close()
print("All assertions passed.")
