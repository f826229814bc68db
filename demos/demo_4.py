"""Demo 4: selecting rows of full-dataset inputs with ``batch=``.

The whole data set goes into a Data object once; each call selects the rows to
use with ``batch`` (an int n for the first n rows, a slice, a list or an int
array of indices), before the rows are split among the ranks.  A *minibatch*
input (``minibatch=True``) holds only the rows of the current batch: its k-th
row goes with the k-th selected row of the full inputs.  Results, also when
computed in slices (``num_slices``), are checked against plain PyTensor on the
same rows.
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def main():
    parser = argparse.ArgumentParser(description="Synkhronos demo 4: batch selection")
    parser.add_argument("--n", type=int, default=None, help="number of ranks (default: all cores)")
    parser.add_argument("--gpu", action="store_true", help="use GPU workers")
    args = parser.parse_args()

    n = synk.fork(args.n, use_gpu=args.gpu)
    floatX = pytensor.config.floatX
    x = pt.matrix("x")  # full data set
    t = pt.vector("t")  # minibatch targets
    v = pytensor.shared(np.arange(1, 4, dtype=floatX), name="v")
    err = x.dot(v) - t
    outputs = [pt.mean(err ** 2), (pt.max(err), "max"), (err, None)]
    f_pt = pytensor.function([x, t], [pt.mean(err ** 2), pt.max(err), err])
    f = synk.function(inputs=[x, t], outputs=outputs)
    synk.distribute()

    rng = np.random.default_rng(0)
    n_data = 20 * n + 3
    x_dat = synk.data(rng.standard_normal((n_data, 3)).astype(floatX))
    t_dat = synk.data(var=t, minibatch=True)  # filled with each batch's targets below

    batches = [
        5 * n + 1,  # the first rows
        slice(3, 3 + 6 * n + 1),
        [4, 0, 17, 3, 3, 9, 2],
        rng.permutation(n_data)[:8 * n + 1],  # a shuffled minibatch
    ]
    for batch in batches:
        rows = np.arange(n_data)[:batch] if isinstance(batch, int) else np.arange(n_data)[batch]
        t_dat.set_value(rng.standard_normal(len(rows)), force_cast=True)  # k-th target: k-th row
        mse, top, errs = f_pt(x_dat[rows], t_dat.data)
        desc = "array of %d indices" % len(batch) if isinstance(batch, np.ndarray) else str(batch)
        for num_slices in (1, 2):
            r = f(x_dat, t_dat, batch=batch, num_slices=num_slices)
            print("batch=%-22s num_slices=%d: mse %.4f  max err %.4f  rows per rank %s"
                  % (desc, num_slices, r[0], r[1], [len(e) for e in r[2]]))
            assert np.allclose(r[0], mse)
            assert np.allclose(r[1], top)
            assert np.allclose(np.concatenate(r[2]), errs)

    synk.close()
    print("\nAll demo_4 assertions passed.")


if __name__ == "__main__":
    main()
