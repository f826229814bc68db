"""Demo 3: shared variables on every rank, and the collectives that move them.

Each rank holds its own copy of every shared variable used in a Synkhronos
function; function updates apply locally on each rank.  Shows ``gather``
(``nd_up`` 1 and 0), ``reduce`` (``op``, ``in_place``), ``broadcast``,
``all_reduce``, ``scatter``, ``all_gather``, per-rank ``set_value`` and
``get_value``, ``get_lengths`` and ``get_shapes``, all checked against numpy.
"""

import argparse

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def check(result, expected):
    assert np.allclose(result, expected), (result, expected)


def main():
    parser = argparse.ArgumentParser(description="Synkhronos demo 3: shared variables and collectives")
    parser.add_argument("--n", type=int, default=None, help="number of ranks (default: all cores)")
    parser.add_argument("--gpu", action="store_true", help="use GPU workers")
    args = parser.parse_args()

    n = synk.fork(args.n, use_gpu=args.gpu)
    floatX = pytensor.config.floatX
    s_init = np.ones(2, dtype=floatX)
    s = pytensor.shared(s_init, name="s")
    w = pytensor.shared(np.zeros((1, 3), dtype=floatX), name="w")
    x = pt.matrix("x")
    f = synk.function([x], updates=[(s, pt.sum(x * s, axis=0))])
    g = synk.function([], outputs=(pt.sum(w), "sum"))  # runs whole on each rank
    synk.distribute()

    x_np = np.repeat(np.arange(1, 2 * n + 2), 2).reshape(-1, 2).astype(floatX)  # 2n+1 rows
    parts = np.array_split(x_np, n)  # rank r gets parts[r]: the first len % n ranks get one more
    x_dat = synk.data(x_np)
    total = x_np.sum(axis=0)

    f.as_pytensor(x_dat)  # master only
    print("s after plain PyTensor call:", s.get_value())
    check(s.get_value(), total)

    s.set_value(s_init)  # master only; workers still hold s_init
    f(x_dat)
    gathered = synk.gather(s, nd_up=1)  # stacked along a new axis 0
    print("\ngathered s after Synkhronos call:\n", gathered)
    check(gathered, [p.sum(axis=0) for p in parts])
    check(synk.gather(s, nd_up=0), np.concatenate([p.sum(axis=0) for p in parts]))

    check(synk.reduce(s, op="max", in_place=False), np.max([p.sum(axis=0) for p in parts], axis=0))
    synk.reduce(s, op="sum")  # in place: only the master's value changes
    print("master s after in-place reduce(sum):", s.get_value())
    check(s.get_value(), total)
    check(synk.gather(s)[1:], gathered[1:])  # workers unchanged

    synk.broadcast(s, s_init)  # same value on every rank
    check(synk.gather(s), [s_init] * n)
    f(x_dat)
    synk.all_reduce(s, op="sum")
    print("gathered s after broadcast, call and all_reduce(sum):\n", synk.gather(s))
    check(synk.gather(s), [total] * n)
    s_last = np.array([2, 4], dtype=floatX)
    synk.set_value(n - 1, s, s_last)  # one rank only
    check(synk.get_value(n - 1, s), s_last)
    synk.all_reduce(s, op="avg")  # equal weights over ranks
    check(synk.get_value(0, s), ((n - 1) * total + s_last) / n)

    # Scatter a data set: rank r gets the r-th part of it.
    w_np = np.arange(3 * (2 * n + 1), dtype=floatX).reshape(-1, 3)
    synk.scatter(w, w_np)
    print("\nlengths of w after scatter:", synk.get_lengths(w), " shapes:", synk.get_shapes(w))
    assert synk.get_lengths(w) == [len(p) for p in np.array_split(w_np, n)]
    assert synk.get_shapes(w) == [p.shape for p in np.array_split(w_np, n)]
    check(synk.gather(w, nd_up=0), w_np)  # concatenated
    per_rank = synk.gather(w, nd_up=1)  # lengths differ: a list with one array per rank
    for r, p in enumerate(np.array_split(w_np, n)):
        check(per_rank[r], p)
        check(synk.get_value(r, w), p)
    check(g(), w_np.sum())
    synk.all_gather(w)  # every rank now holds all of w
    check(synk.gather(w, nd_up=1), [w_np] * n)
    check(g(), n * w_np.sum())

    w_d = synk.data(w_np)  # from a Data, workers read their rows in place
    synk.scatter(w, w_d, batch=slice(1, 2 * n + 1))  # scatter only these rows
    check(synk.gather(w, nd_up=0), w_np[1:])
    synk.set_value(0, w, w_np, batch=[2, 0, 2])  # these rows, on rank 0 only
    assert synk.get_lengths([s, w]) == [[2] * n, [3] + [2] * (n - 1)]
    check(synk.get_value(0, w), w_np[[2, 0, 2]])

    synk.close()
    print("\nAll demo_3 assertions passed.")


if __name__ == "__main__":
    main()
