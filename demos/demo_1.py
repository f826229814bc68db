"""Demo 1: Synkhronos functions and the reduce operations on their outputs.

Builds one function with an input scattered among the ranks (``x``) and one
broadcast whole to every rank (``y``), and outputs reduced over the ranks with
"avg" (the default), "sum", "max", "min", "prod" and None (one result per rank).
Every result is checked against plain ``pytensor.function`` on the same data,
also when computing in slices (``num_slices``) and for an ``output_subset``.
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def check(result, expected):
    assert np.allclose(result, expected), (result, expected)


def main():
    parser = argparse.ArgumentParser(description="Synkhronos demo 1: functions and reductions")
    parser.add_argument("--n", type=int, default=None, help="number of ranks (default: all cores)")
    parser.add_argument("--gpu", action="store_true", help="use GPU workers")
    args = parser.parse_args()

    n = synk.fork(args.n, use_gpu=args.gpu)
    x = pt.matrix("x")
    y = pt.vector("y")
    z = x.dot(y)  # one value per row of x
    outputs = [
        pt.mean(z),  # "avg" by default
        (pt.sum(z), "sum"),
        (pt.max(z), "max"),
        (pt.min(z), "min"),
        (pt.prod(1 + 0.01 * z), "prod"),
        (z, None),  # no reduction: a list of per-rank results
    ]
    f_pt = pytensor.function([x, y], [pt.mean(z), pt.sum(z), pt.max(z), pt.min(z), pt.prod(1 + 0.01 * z), z])
    f = synk.function(inputs=[x], bcast_inputs=[y], outputs=outputs)
    synk.distribute()
    print("Output reduce operations:", f.output_modes)

    rng = np.random.default_rng(0)
    x_dat = rng.standard_normal((10 * n + 1, 5)).astype(pytensor.config.floatX)  # uneven split
    y_dat = rng.standard_normal(5).astype(pytensor.config.floatX)
    x_synk, y_synk = synk.data(x_dat), synk.data(y_dat)
    expected = f_pt(x_dat, y_dat)

    for num_slices in (1, 3):
        r = f(x_synk, y_synk, num_slices=num_slices)
        print("\nnum_slices=%d: avg %.4f, sum %.4f, max %.4f, min %.4f, prod %.4f"
              % ((num_slices,) + tuple(float(v) for v in r[:5])))
        print("  None-reduced output: %d arrays of lengths %s" % (len(r[5]), [len(v) for v in r[5]]))
        for res, exp in zip(r[:5], expected[:5]):
            check(res, exp)
        assert len(r[5]) == n
        check(np.concatenate(r[5]), expected[5])

    r = f(x_synk, y_synk, output_subset=[1, 3])
    print("\noutput_subset=[1, 3] (sum, min):", [float(v) for v in r])
    check(r[0], expected[1])
    check(r[1], expected[3])

    check(f.as_pytensor(x_synk, y_synk)[0], expected[0])  # master only, plain PyTensor

    synk.close()
    print("\nAll demo_1 assertions passed.")


if __name__ == "__main__":
    main()
