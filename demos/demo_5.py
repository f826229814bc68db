"""Demo 5: data held in shared variables on the ranks, selected with ``batch_s=``.

A data set is scattered once into a shared variable (rank r holds the r-th
part); the function lists it in ``sliceable_shareds``.  Each call then selects
rows of every rank's own part with ``batch_s``: one slice, list or int array used
on all ranks, or a list with one of those per rank.  (``batch`` selects before
scattering; ``batch_s`` selects after.)  Results, also when computed in slices
(``num_slices``), are checked against plain PyTensor on the same rows.
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def describe(sel):
    if isinstance(sel, slice):
        return "slice(%d, %d)" % (sel.start, sel.stop)
    return "array(%s)" % sel.tolist() if isinstance(sel, np.ndarray) else str(sel)


def main():
    parser = argparse.ArgumentParser(description="Synkhronos demo 5: batch_s on sliceable shareds")
    parser.add_argument("--n", type=int, default=None, help="number of ranks (default: all cores)")
    parser.add_argument("--gpu", action="store_true", help="use GPU workers")
    args = parser.parse_args()

    n = synk.fork(args.n, use_gpu=args.gpu)
    floatX = pytensor.config.floatX
    x_s = pytensor.shared(np.zeros((1, 3), dtype=floatX), name="x_s")  # data, set by scatter
    y = pt.vector("y")
    z = x_s.dot(y)
    outputs = [pt.mean(z), (pt.min(z), "min"), (z, None)]
    rows = pt.matrix("rows")  # plain PyTensor: the same graph on given rows
    f_pt = pytensor.function([rows, y], [pt.mean(z), pt.min(z), z], givens=[(x_s, rows)])
    f = synk.function(inputs=[], bcast_inputs=[y], outputs=outputs, sliceable_shareds=[x_s])
    synk.distribute()

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((6 * n + 1, 3)).astype(floatX)
    synk.scatter(x_s, x_np)
    parts = np.array_split(x_np, n)  # rank r holds parts[r]; the first len % n ranks get one more
    print("Rows of x_s on each rank:", synk.get_lengths(x_s))
    assert synk.get_lengths(x_s) == [len(p) for p in parts]
    y_dat = synk.data(rng.standard_normal(3).astype(floatX))

    same = [slice(1, 5), [5, 0, 2, 2], np.array([3, 1, 4])]  # one selection for every rank...
    per_rank = [  # ...or one per rank
        [slice(r % 2, 6) for r in range(n)],
        [[r % 6, 5, 0] for r in range(n)],
        [np.arange(6 - r % 3) for r in range(n)],
    ]
    cases = [(None, [None] * n, "None")] + [(b, [b] * n, describe(b)) for b in same]
    cases += [(b, b, "per rank: " + ", ".join(map(describe, b))) for b in per_rank]
    for batch_s, sels, desc in cases:
        selected = np.concatenate([p if sel is None else p[sel] for p, sel in zip(parts, sels)])
        mean, low, z_all = f_pt(selected, y_dat.data)
        for num_slices in (1, 2):
            r = f(y_dat, batch_s=batch_s, num_slices=num_slices)
            print("batch_s=%s, num_slices=%d: mean %.4f  min %.4f  rows per rank %s"
                  % (desc, num_slices, r[0], r[1], [len(v) for v in r[2]]))
            assert np.allclose(r[0], mean)
            assert np.allclose(r[1], low)
            assert np.allclose(np.concatenate(r[2]), z_all)

    synk.close()
    print("\nAll demo_5 assertions passed.")


if __name__ == "__main__":
    main()
