"""An exception inside a worker reaches the master with the worker's rank and
traceback, and the session stays usable.

Here rank 1 gets the rows that fail a check inside the graph.
"""

import numpy as np
import pytensor.tensor as pt
from pytensor.raise_op import Assert

import synkhronos as synk

synk.fork(2)
x = pt.vector("x")
checked = Assert("rows must be positive")(x, pt.all(x > 0))
f = synk.function([x], outputs=(checked.sum(), "sum"))
synk.distribute()

x_dat = synk.data(np.array([1, 2, 3, -4], dtype="float32"))   # rank 1 gets [3, -4]
try:
    f(x_dat)
except synk.WorkerError as e:
    print("rank", e.rank, "raised", e.exc_type)
    assert e.rank == 1 and "rows must be positive" in str(e)
else:
    raise AssertionError("the worker's exception did not reach the master")

x_dat[3] = 4                                                  # fix the data: the session goes on
assert f(x_dat) == 10
synk.close()
print("All assertions passed.")
