"""Synkhronos functions: reduce modes, ``batch=``, ``num_slices=`` and uneven splits.

Every result is checked against the plain PyTensor function on the same rows.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

synk.fork(2)
x = pt.matrix("x")
w = pytensor.shared(np.arange(3, dtype="float32"), name="w")
err = x.dot(w)
f = synk.function(
    inputs=[x],
    outputs=[pt.mean(err),             # "avg" (the default): weighted by each rank's rows
             (pt.sum(err), "sum"),
             (pt.max(err), "max"),
             (err, None)],             # None: one result per rank
)
f_pt = pytensor.function([x], [pt.mean(err), pt.sum(err), pt.max(err), err])
synk.distribute()

rng = np.random.default_rng(0)
x_np = rng.standard_normal((101, 3)).astype("float32")   # 101 rows: ranks get 51 and 50
x_dat = synk.data(x_np)

mean, total, top, per_rank = f(x_dat)
mean_pt, total_pt, top_pt, err_pt = f_pt(x_np)
assert np.allclose(mean, mean_pt)        # the weighted average is the whole-data mean
assert np.allclose(total, total_pt) and np.allclose(top, top_pt)
print("rows per rank:", [len(e) for e in per_rank])
assert np.allclose(np.concatenate(per_rank), err_pt)

# batch= selects rows before they are split: an int (the first rows), a slice,
# or a list / array of indices (each rank gathers its own rows in parallel).
idx = rng.permutation(101)[:40]
for batch, rows in [(10, np.arange(10)), (slice(20, 61), np.arange(20, 61)), (idx, idx)]:
    for num_slices in (1, 3):                   # each rank computes its share in pieces
        r = f(x_dat, batch=batch, num_slices=num_slices)
        expected = f_pt(x_np[rows])
        assert all(np.allclose(a, b) for a, b in zip(r[:3], expected[:3]))

# output_subset computes only some outputs, as in PyTensor.
(only_max,) = f(x_dat, output_subset=[2])
assert np.allclose(only_max, top_pt)

# The plain PyTensor function, in the master only.
assert np.allclose(f.as_theano(x_np)[0], mean_pt)
print("output modes:", f.output_modes)
synk.close()
print("All assertions passed.")
