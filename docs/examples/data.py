"""``synk.Data``: function inputs in OS shared memory, readable by every rank.

A Data object has a fixed dtype and number of dimensions, like a PyTensor
variable, and wraps a numpy array in shared memory.  Read and write it like an
array; change its values, length or shape with its methods, which every rank
sees before the next call.
"""

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk

synk.fork(2)
x = pt.matrix("x", dtype="float32")
f = synk.function([x], outputs=(x.sum(axis=0), "sum"))
synk.distribute()

x_dat = synk.data(np.ones((4, 3), dtype="float32"), name="x")
print(x_dat.name, x_dat.dtype, x_dat.ndim, x_dat.shape, len(x_dat))
x_dat[1] = 2                                   # writes go to shared memory
assert np.allclose(f(x_dat), [5, 5, 5])

x_dat.set_value(np.arange(12, dtype="int16").reshape(6, 2))  # new shape; int16 fits float32
assert x_dat.shape == (6, 2) and x_dat.dtype == "float32"
try:
    x_dat.set_value(np.arange(4))              # int64 does not fit float32 exactly
except TypeError as e:
    print("refused:", e)                       # ...unless force_cast=True
else:
    raise AssertionError("int64 was accepted")
assert np.allclose(f(x_dat), [30, 36])

big = synk.data(var=x, shape=(100, 2), oversize=1.5)  # room to grow without reallocating
assert big.alloc_size == 300
big.set_length(120)                            # still fits: no new segment
big[:] = 1
assert np.allclose(f(big), [120, 120])

# Built from the function's own inputs, in the dtypes it expects.
x_in = f.build_inputs(np.zeros((3, 2)), force_cast=True)  # one input: one Data
assert x_in.dtype == "float32"

# condition_data shows what set_value would store, without storing it.
assert x_dat.condition_data(np.zeros((2, 2), dtype="int8")).dtype == np.float32
try:
    synk.data(np.zeros(3, dtype=object))       # pointers cannot be shared between processes
except TypeError as e:
    print("refused:", e)
else:
    raise AssertionError("object dtype was accepted")

big.free_memory()                              # the only way to shrink the allocation
synk.close()
print("All assertions passed.")
