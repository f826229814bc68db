"""Random streams (dropout) on several ranks: each rank draws its own numbers,
and a seeded run repeats itself."""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos._graph.function_core import _reseeded


def bernoulli_and_next_rng(p, size, rng):
    """(next generator, draw): PyTensor 3 returns both when asked, PyTensor 2 (which
    PyMC pins) has them as the outputs of the draw's node."""
    if pytensor.__version__.startswith("2."):
        return pt.random.bernoulli(p, size=size, rng=rng).owner.outputs
    return pt.random.bernoulli(p, size=size, rng=rng, return_next_rng=True)


def _dropout_graph(rng):
    """(inputs, output, updates) of dropout on a matrix, drawing from ``rng``."""
    x = pt.matrix("x", dtype="float32")
    next_rng, draw = bernoulli_and_next_rng(0.5, x.shape, rng)
    return [x], x * draw, [(rng, next_rng)]


def dropout_masks(seed, mode=None, use_gpu=False, calls=2):
    """Masks of a dropout function with a seeded shared generator, per call and per
    rank (4 rows of ones, 2 per rank), from a fresh session of 2 ranks."""
    synk.close()
    synk.fork(2, use_gpu=use_gpu)
    try:
        rng = pytensor.shared(np.random.default_rng(seed), name="rng")
        inputs, output, updates = _dropout_graph(rng)
        f = synk.function(inputs, (output, None), updates=updates, mode=mode)
        synk.distribute()
        ones = synk.data(np.ones((4, 32), dtype="float32"))
        return [f(ones) for _ in range(calls)]
    finally:
        synk.close()


def plain_masks(seed, mode=None, calls=2):
    """The same masks from plain PyTensor functions, one per rank, each on the
    generator that rank derives from the seed."""
    fns = []
    for rank in range(2):
        inputs, output, updates = _dropout_graph(
            pytensor.shared(_reseeded(np.random.default_rng(seed), rank)))
        with warnings.catch_warnings():  # plain JAX mode warns that it copies the generator
            warnings.filterwarnings("ignore", message="The RandomType SharedVariables")
            fns.append(pytensor.function(inputs, output, updates=updates, mode=mode))
    ones = np.ones((2, 32), dtype="float32")
    return [[f(ones) for f in fns] for _ in range(calls)]


def check_rank_streams(seed, mode=None, use_gpu=False):
    """Ranks draw differently, each as plain PyTensor does on its generator; the
    stream moves on between calls, and the seeded run repeats."""
    first = dropout_masks(seed, mode, use_gpu)
    for rank0, rank1 in first:
        assert set(np.unique(rank0)) <= {0.0, 1.0} and 0 < rank0.mean() < 1
        assert not np.array_equal(rank0, rank1)  # equal would be a 2**-64 chance
    assert not np.array_equal(first[0][0], first[1][0])
    for got, want in zip(first, plain_masks(seed, mode)):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    again = dropout_masks(seed, mode, use_gpu)
    for (a0, a1), (b0, b1) in zip(first, again):
        np.testing.assert_array_equal(a0, b0)
        np.testing.assert_array_equal(a1, b1)


# JAX functions hold their own copy of the generator, in JAX's form: it must load
# in the workers and be reseeded per rank too.  Synkhronos does not repeat PyTensor's
# warning about that copy (the README says it).
@pytest.mark.filterwarnings("error:The RandomType SharedVariables:UserWarning")
@pytest.mark.parametrize("mode", [None, "JAX"])
def test_ranks_draw_their_own_numbers_and_a_seeded_run_repeats(mode):
    if mode == "JAX":
        pytest.importorskip("jax")
    check_rank_streams(seed=11, mode=mode)
