"""distribute() compiles each Numba function once per host, spread over its
ranks, and every other rank loads it from the compile cache: no rank compiles a
graph another already compiled, and no call compiles again."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos._graph.precompile import compile_counts, compile_shares, counts_by_variant, precompile
from synkhronos._session import runtime
from synkhronos._wire.protocol import CompileCounts


def test_each_host_compiles_every_function_once_largest_first():
    sizes = {0: 50, 1: 10, 2: 30, 3: 30, 4: 5}
    shares = compile_shares(sizes, [[0, 1], [2, 3, 4]])
    assert set(shares) == {0, 1, 2, 3, 4}
    for host in ([0, 1], [2, 3, 4]):
        got = sorted(i for r in host for i in shares[r])
        assert got == sorted(sizes), "every function once on every host"
    # Largest first, each to the rank with the least so far (ties: the lower rank).
    assert shares[0] == (0, 1, 4) and shares[1] == (2, 3)
    assert shares[2] == (0,) and shares[3] == (1, 2) and shares[4] == (3, 4)


def test_no_functions_no_shares_of_work():
    assert compile_shares({}, [[0, 1]]) == {0: (), 1: ()}


def test_other_linkers_are_left_alone():
    x = pt.vector("x")
    fn = pytensor.function([x], x * 2, mode="FAST_COMPILE")
    assert compile_counts(fn) is None and precompile(fn) is False


def _counts():
    rt = runtime.current()
    mine, replies = rt.dispatcher.request(
        CompileCounts(), local=lambda: counts_by_variant([f._core for f in rt.registry.functions]))
    return {rt.master_rank: mine, **replies}


def _check_once(counts, key):
    """Every rank holds variant ``key`` compiled once, for the argument types of
    its calls; one rank compiled it, the others loaded it from the cache."""
    per_rank = [counts[r][key] for r in sorted(counts)]
    assert all(held == 1 for held, _, _ in per_rank), (key, per_rank)
    assert sum(new for _, _, new in per_rank) == 1, (key, per_rank)
    assert all(hits + new == 1 for _, hits, new in per_rank), (key, per_rank)


def test_every_function_compiled_once_for_all_ranks():
    """Inputs of several kinds (float and int rows, a broadcast vector and
    scalar): the types compiled ahead are those the calls have."""
    synk.fork(2, use_gpu=False)
    rng = np.random.default_rng()
    # Constants new to every run: graphs no earlier run left in the compile cache.
    c = [float(v) for v in rng.uniform(1, 2, 3)]
    x, y, i, k = pt.matrix("x"), pt.vector("y"), pt.ivector("i"), pt.iscalar("k")
    exprs = [(x * c[0]).sum(), (x.dot(y) * c[1]).max(), ((pt.exp(x) * c[2]).mean(axis=1) * i * k).sum()]
    fns = [synk.function([x], outputs=(exprs[0], "sum"), mode="NUMBA"),
           synk.function([x], bcast_inputs=[y], outputs=(exprs[1], "max"), mode="NUMBA"),
           synk.function([x, i], bcast_inputs=[k], outputs=(exprs[2], "sum"), mode="NUMBA")]
    synk.distribute()
    fx = pytensor.config.floatX
    x_val, y_val = rng.standard_normal((50, 4)).astype(fx), rng.standard_normal(4).astype(fx)
    i_val = rng.integers(-5, 5, 50).astype("int32")
    x_dat, y_dat, i_dat, k_dat = synk.data(x_val), synk.data(y_val), synk.data(i_val), synk.data(np.int32(3))
    calls = [((x_dat,), [x], (x_val,)), ((x_dat, y_dat), [x, y], (x_val, y_val)),
             ((x_dat, i_dat, k_dat), [x, i, k], (x_val, i_val, 3))]
    for f, expr, (args, ins, vals) in zip(fns, exprs, calls):
        np.testing.assert_allclose(f(*args), pytensor.function(ins, expr)(*vals), rtol=1e-5)
    counts = _counts()
    assert sorted(counts) == [0, 1]
    for n, f in enumerate(fns):
        _check_once(counts, (n, f._core.plain_key))
    synk.close()


def test_a_variant_compiled_in_the_master_first():
    """A call that needs a new variant (here: num_slices with updates, which
    the slices accumulate) compiles it in the master; the workers then load it
    from the cache."""
    synk.fork(2, use_gpu=False)
    rng = np.random.default_rng()
    x = pt.matrix("x")
    expr = (pt.sin(x) * float(rng.uniform(1, 2))).sum()
    s = pytensor.shared(np.zeros(3, dtype=pytensor.config.floatX), name="s")
    f = synk.function([x], outputs=(expr, "sum"), updates=[(s, s + x.sum(axis=0))], mode="NUMBA")
    synk.distribute()
    x_val = rng.standard_normal((40, 3)).astype(pytensor.config.floatX)
    got = f(synk.data(x_val), num_slices=2)
    np.testing.assert_allclose(got, pytensor.function([x], expr)(x_val), rtol=1e-5)
    counts = _counts()
    sliced = set(counts[0]) - {(0, f._core.plain_key)}
    assert len(sliced) == 1, "a variant for num_slices: %s" % sliced
    _check_once(counts, sliced.pop())
    synk.close()


def test_a_function_numba_cannot_compile_fails_where_it_is_called():
    """distribute() goes on; the call raises Numba's error, as without compiling ahead."""
    from _untypable import untypable

    synk.fork(2, use_gpu=False)
    x = pt.vector("x")
    f = synk.function([x], outputs=(untypable(x).sum(), "sum"), mode="NUMBA")
    g = synk.function([x], outputs=(x.sum(), "sum"), mode="NUMBA")
    synk.distribute()
    x_dat = synk.data(np.arange(6, dtype=pytensor.config.floatX))
    assert g(x_dat) == 15
    with pytest.raises(Exception, match="text"):
        f(x_dat)


def test_the_first_call_compiles_the_variant_every_rank_runs():
    """More slices than a rank has rows: each rank runs its share whole, and the
    master's first-call step (which compiles the variant ahead of the workers)
    names that same variant, by the one rule (``share_rows`` and
    ``variant_key``); with rows enough the sliced variant is the one named."""
    x = pt.vector("x")
    s = pytensor.shared(np.float64(0.0), name="s")
    synk.close()  # the test before leaves its session to the module's fixture
    synk.fork(2, use_gpu=False)
    f = synk.function([x], (x.sum(), "sum"), updates=[(s, s + x.sum())])
    synk.distribute()
    core = f._core
    whole = ((0,), False, None)
    assert f(synk.data(np.arange(2.0)), num_slices=4) == 1.0  # one row per rank
    assert f._ran == {whole} and set(core.compiled_variants()) == {whole}
    assert f(synk.data(np.arange(8.0)), num_slices=4) == 28.0  # four rows per rank
    assert f._ran == {whole, ((0,), True, None)}
    synk.close()
