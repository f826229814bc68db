"""Data held on the ranks: ``scatter`` once, then select rows with ``batch_s=``.

A data set scattered into a shared variable stays on each rank (in GPU memory
on GPU workers), so a call moves no input rows at all.  ``batch_s`` selects rows
of each rank's own part, after the scatter: one selection for every rank, or a
list with one selection per rank.
"""

import numpy as np
import pytensor

import synkhronos as synk

synk.fork(2)
data_np = np.arange(20, dtype="float32").reshape(10, 2)
d = pytensor.shared(np.zeros((1, 2), dtype="float32"), name="d")
f = synk.function([], outputs=(d.sum(), "sum"), sliceable_shareds=[d])
synk.distribute()

synk.scatter(d, data_np)               # rank 0 gets rows 0-4, rank 1 rows 5-9
print("lengths per rank:", synk.get_lengths(d))
assert synk.get_lengths(d) == [5, 5]
assert np.allclose(f(), data_np.sum())

# The same selection on every rank: local rows 0 and 2, i.e. global 0, 2, 5, 7.
assert np.allclose(f(batch_s=[0, 2]), data_np[[0, 2, 5, 7]].sum())
# One selection per rank.
assert np.allclose(f(batch_s=[[0, 1], [4]]), data_np[[0, 1, 9]].sum())
# Slices accumulate over num_slices calls of the underlying function.
assert np.allclose(f(batch_s=slice(1, 5), num_slices=2), data_np[[1, 2, 3, 4, 6, 7, 8, 9]].sum())
synk.close()
print("All assertions passed.")
