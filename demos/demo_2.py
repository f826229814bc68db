"""Demo 2: synkhronos.Data, the inputs of Synkhronos functions.

A Data object holds a numpy array in OS shared memory that every worker maps.
Like a PyTensor variable it has a fixed dtype and ndim, while its shape may
change.  Shows the properties, numpy-style indexing, reallocation with
``set_value(..., oversize=)``, ``set_length``, ``set_shape``, ``free_memory``,
``force_cast``, ``condition_data`` and ``Function.build_inputs``; after each
change the workers compute on the new values, checked against plain PyTensor.
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def show(d):
    print("  %r: dtype=%s ndim=%d shape=%s size=%d alloc_size=%d minibatch=%s name=%s"
          % (d, d.dtype, d.ndim, d.shape, d.size, d.alloc_size, d.minibatch, d.name))


def main():
    parser = argparse.ArgumentParser(description="Synkhronos demo 2: Data objects")
    parser.add_argument("--n", type=int, default=None, help="number of ranks (default: all cores)")
    parser.add_argument("--gpu", action="store_true", help="use GPU workers")
    args = parser.parse_args()

    n = synk.fork(args.n, use_gpu=args.gpu)
    floatX = pytensor.config.floatX
    x = pt.matrix("x")
    y = pt.vector("y")
    f_pt = pytensor.function([x, y], pt.sum(x.dot(y)))
    f = synk.function(inputs=[x], bcast_inputs=[y], outputs=(pt.sum(x.dot(y)), "sum"))
    synk.distribute()

    def check(x_d, y_d):  # the workers see the current values of the Data
        assert np.allclose(f(x_d, y_d), f_pt(x_d.data, y_d.data))

    rng = np.random.default_rng(0)
    x_dat = rng.standard_normal((4 * n, 3)).astype(floatX)
    x_d = synk.data(var=x)  # dtype, ndim and name from the variable; no memory yet
    print("Empty Data:")
    show(x_d)
    assert x_d.data is None and x_d.shape is None and x_d.size == 0 and x_d.alloc_size == 0
    assert (x_d.dtype, x_d.ndim, x_d.name, x_d.minibatch) == (floatX, 2, "x", False)

    x_d.set_value(x_dat, oversize=1.5)  # allocate 1.5x the memory needed
    y_d = synk.data(np.ones(3, dtype=floatX), name="y")
    print("After set_value(oversize=1.5):")
    show(x_d)
    assert x_d.shape == x_dat.shape and x_d.size == x_dat.size and x_d.alloc_size == int(1.5 * x_dat.size)
    check(x_d, y_d)

    # Numpy-style reading and writing, in place in shared memory.
    x_d[0] = 7
    x_d[1:3, 1] = [-1, -2]
    assert len(x_d) == len(x_dat) and np.all(x_d[0] == 7) and np.allclose(x_d[1:3, 1], [-1, -2])
    assert np.allclose(np.asarray(x_d)[3:], x_dat[3:])
    check(x_d, y_d)

    alloc = x_d.alloc_size
    x_d.set_value(x_dat[:-1])  # fits in the allocation: no reallocation
    assert x_d.alloc_size == alloc and x_d.shape == (len(x_dat) - 1, 3)
    check(x_d, y_d)
    big = rng.standard_normal((8 * n + 1, 3)).astype(floatX)
    x_d.set_value(big, oversize=2)  # too large: reallocates, workers follow
    print("After set_value of a larger array (oversize=2):")
    show(x_d)
    assert x_d.alloc_size == 2 * big.size and np.array_equal(x_d.data, big)
    check(x_d, y_d)

    x_d.set_length(5 * n)  # keeps the rows that remain
    assert x_d.shape == (5 * n, 3) and np.array_equal(x_d.data, big[:5 * n])
    check(x_d, y_d)
    x_d.set_shape((2 * n, 6))  # same memory, new shape
    y6 = synk.data(np.arange(6, dtype=floatX))
    print("After set_length(%d) and set_shape((%d, 6)):" % (5 * n, 2 * n))
    show(x_d)
    check(x_d, y6)

    x_d.free_memory()  # releases the memory in the master and the workers
    assert x_d.data is None and x_d.alloc_size == 0
    x_d.set_value(x_dat)
    check(x_d, y_d)

    # dtype is fixed: float64 values need force_cast to go into float32 Data.
    x64 = x_dat.astype("float64") + 0.5
    if floatX == "float32":
        try:
            x_d.set_value(x64)
            raise AssertionError("expected TypeError")
        except TypeError as e:
            print("set_value(float64 array) without force_cast:", e)
    cond = x_d.condition_data(x64, force_cast=True)  # what set_value would store
    assert cond.dtype == floatX and np.allclose(cond, x64)
    x_d.set_value(x64, force_cast=True)
    assert x_d.dtype == floatX and np.allclose(x_d.data, x64)
    check(x_d, y_d)

    # build_inputs: Data for every input of a function, given as if calling it.
    x_b, y_b = f.build_inputs(x_dat, np.ones(3, dtype=floatX), minibatch=[True, False])
    print("From build_inputs:")
    show(x_b)
    assert x_b.minibatch and not y_b.minibatch and x_b.name == "x"
    check(x_b, y_b)

    synk.close()
    print("\nAll demo_2 assertions passed.")


if __name__ == "__main__":
    main()
