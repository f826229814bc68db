"""Random streams (dropout) on several ranks: each rank draws its own numbers,
and a seeded run repeats itself."""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk


def dropout_masks(seed, calls=2):
    """Masks of a dropout function with a seeded shared generator, per call and per
    rank (4 rows of ones, 2 per rank), from a fresh session of 2 CPU ranks."""
    synk.close()
    synk.fork(2, use_gpu=False)
    try:
        rng = pytensor.shared(np.random.default_rng(seed), name="rng")
        x = pt.matrix("x", dtype="float32")
        draw = pt.random.bernoulli(0.5, size=x.shape, rng=rng)
        next_rng = draw.owner.outputs[0]
        f = synk.function([x], (x * draw, None), updates=[(rng, next_rng)])
        synk.distribute()
        ones = synk.data(np.ones((4, 32), dtype="float32"))
        return [f(ones) for _ in range(calls)]
    finally:
        synk.close()


def test_ranks_draw_their_own_numbers_and_a_seeded_run_repeats():
    first = dropout_masks(seed=11)
    for rank0, rank1 in first:
        assert set(np.unique(rank0)) <= {0.0, 1.0} and 0 < rank0.mean() < 1
        assert not np.array_equal(rank0, rank1)  # equal would be a 2**-64 chance
    assert not np.array_equal(first[0][0], first[1][0])  # the stream moves on
    again = dropout_masks(seed=11)
    for (a0, a1), (b0, b1) in zip(first, again):
        np.testing.assert_array_equal(a0, b0)
        np.testing.assert_array_equal(a1, b1)
