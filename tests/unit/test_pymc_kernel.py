"""``synkhronos.pymc._kernel``: the GPU ranks' pass over their rows as one
kernel over blocks of rows (here run by Pallas's interpreter on the CPU) gives
numpy's log-density and gradient at every point, for every row count around
the block size, any number of points and features, in float32 and float64,
with a coefficient per group picked by each row's group too (its index signed
or unsigned); what it does not
handle falls back to the batched graph."""

import contextlib
import logging
import pickle

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pymc")  # synkhronos.pymc needs it
jax = pytest.importorskip("jax")

from _jax64 import jax_x64  # noqa: E402
from _pymc_glm import check_many_sums, draw_rows, glm, kernel_op, numpy_glm  # noqa: E402

from synkhronos.pymc._blocks import MAX_GROUPS  # noqa: E402
from synkhronos.pymc._kernel import BLOCK, Kernel, jax_form  # noqa: E402
from synkhronos.pymc._pallas import MANY_SUMS, WIDE_BLOCK, rows_per_program  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def x64():
    with jax_x64():
        yield


@settings(max_examples=15, deadline=None)
@given(family=st.sampled_from(["bernoulli", "normal", "groups", "groups_u8"]),
       dtype=st.sampled_from(["float64", "float32"]),
       n=st.one_of(st.sampled_from([0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 2]),
                   st.integers(0, 3 * BLOCK)),
       points=st.integers(1, 4), d=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_the_kernel_gives_numpys_values(family, dtype, n, points, d, seed):
    rng = np.random.default_rng(seed)
    params, rows, single = glm(family, d, dtype)
    kernel = jax_form(kernel_op(params, rows, single), interpret=True)
    assert isinstance(kernel, Kernel)
    values = draw_rows(family, rng, n, d, dtype)
    stacked = [(rng.standard_normal((points,) + p.type.shape) * 0.5).astype(dtype) for p in params]
    got = jax.jit(kernel)(*stacked, *values)
    eps = 1e-10 if dtype == "float64" else 2e-4
    wide = [v.astype(np.float64) if v.dtype.kind == "f" else v for v in values]
    for k in range(points):
        want = numpy_glm(family, [s[k].astype(np.float64) for s in stacked], *wide)
        for g, w in zip(got, want):
            assert g.dtype == dtype
            np.testing.assert_allclose(np.asarray(g[k], dtype=np.float64), w, rtol=eps, atol=eps * (n + 1))


@pytest.mark.parametrize("n", [1, BLOCK + 3])
def test_an_unsigned_group_index_gives_numpys_values(n):
    """``_rowdata`` holds a group index unsigned: the kernel picks by it as by a
    signed one (it has no negative indices to count from the end)."""
    rng = np.random.default_rng(n)
    params, rows, single = glm("groups_u8", 3, "float64")
    kernel = jax_form(kernel_op(params, rows, single), interpret=True)
    assert isinstance(kernel, Kernel)
    values = draw_rows("groups_u8", rng, n, 3, "float64")
    assert values[2].dtype == np.uint8
    stacked = [rng.standard_normal((2,) + p.type.shape) * 0.5 for p in params]
    got = jax.jit(kernel)(*stacked, *values)
    for k in range(2):
        want = numpy_glm("groups", [s[k] for s in stacked], *values)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g[k]), w, rtol=1e-10, atol=1e-10 * (n + 1))


@pytest.mark.parametrize("n", [1, WIDE_BLOCK - 1, WIDE_BLOCK, WIDE_BLOCK + 1, 2 * WIDE_BLOCK + 3])
def test_a_kernel_of_many_partial_sums_reads_wider_blocks(n):
    """An intercept per group among 20 (21 partial sums a point): programs
    of ``WIDE_BLOCK`` rows, numpy's values at row counts around it."""
    assert rows_per_program(21) == WIDE_BLOCK and 21 > MANY_SUMS and WIDE_BLOCK != BLOCK
    check_many_sums(n, interpret=True)


def test_an_op_it_does_not_handle_falls_back_to_the_batched_graph(caplog):
    """A coefficient per group among more groups than the kernel picks from
    (``MAX_GROUPS``): the batched graph's JAX function, same values."""
    groups = MAX_GROUPS + 1
    x = pt.tensor("x", dtype="float64", shape=(None,))
    g = pt.tensor("g", dtype="int64", shape=(None,))
    a = pt.tensor("a", dtype="float64", shape=(groups,))
    total = (-0.5 * (x - a[g]) ** 2).sum()
    single = [total, pytensor.grad(total, a)]
    with caplog.at_level(logging.INFO, logger="synkhronos.pymc"):
        fn = jax_form(kernel_op([a], [x, g], single), interpret=True)
    assert not isinstance(fn, Kernel)
    assert "not as one kernel" in caplog.text and "an index among %d values" % groups in caplog.text
    xv, gv = np.arange(70.0), np.arange(70) % groups
    av = np.stack([np.linspace(0, 1, groups), np.ones(groups)])
    got = fn(av, xv, gv)
    for k in range(2):
        r = xv - av[k][gv]
        np.testing.assert_allclose(got[0][k], (-0.5 * r**2).sum())
        np.testing.assert_allclose(got[1][k], np.bincount(gv, r, minlength=groups))


def test_the_op_pickles_and_computes_the_batched_graph_outside_jax():
    """Ranks receive it pickled; a rank that does not compile with JAX runs
    the batched graph it stands for."""
    params, rows, single = glm("bernoulli", 2, "float64")
    op = kernel_op(params, rows, single)
    assert isinstance(jax_form(op, interpret=True), Kernel)  # (the kernel it tried stays here)
    op = pickle.loads(pickle.dumps(op))
    assert isinstance(jax_form(op, interpret=True), Kernel)
    stacked = [pt.tensor(dtype=p.dtype, shape=(None,) + p.type.shape) for p in params]
    row_inputs = [r.type() for r in rows]
    fn = pytensor.function(stacked + row_inputs, op(*stacked, *row_inputs), mode="FAST_COMPILE")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 2)), rng.integers(0, 2, 5)
    point = [rng.standard_normal((1, 2)), rng.standard_normal(1)]
    for g, w in zip(fn(*point, x, y), numpy_glm("bernoulli", [point[0][0], point[1][0]], x, y)):
        np.testing.assert_allclose(g[0], w, rtol=1e-12)


def _primitives(jaxpr, found):
    """Every primitive's count in ``jaxpr`` and the jaxprs inside it (the
    kernel's body is in the ``pallas_call``'s parameters)."""
    for eqn in jaxpr.eqns:
        found[eqn.primitive.name] = found.get(eqn.primitive.name, 0) + 1
        for p in eqn.params.values():
            inner = getattr(p, "jaxpr", p)
            inner = getattr(inner, "jaxpr", inner)
            if hasattr(inner, "eqns"):
                _primitives(inner, found)
    return found


def test_a_bernoullis_softplus_and_sigmoid_of_eta_and_minus_eta_share_one_exponential(monkeypatch):
    """PyMC's Bernoulli holds softplus and sigmoid of ``eta`` and of ``-eta``:
    the kernel computes one ``exp(-|eta|)``, one ``log1p`` and one division
    for the four, with the same values bit for bit as each computed apart."""
    from synkhronos.pymc import _blocks

    params, rows, single = glm("bernoulli", 3, "float64")
    rng = np.random.default_rng(1)
    values = draw_rows("bernoulli", rng, 700, 3, "float64")
    stacked = [rng.standard_normal((2,) + p.type.shape) * 3 for p in params]  # (|eta| large and small)

    def run():
        kernel = jax_form(kernel_op(params, rows, single), interpret=True)
        found = _primitives(jax.make_jaxpr(kernel)(*stacked, *values).jaxpr, {})
        return found, [np.asarray(o) for o in jax.jit(kernel)(*stacked, *values)]

    shared, got = run()
    assert (shared["exp"], shared["log1p"], shared["div"]) == (1, 1, 1)
    monkeypatch.setattr(_blocks, "shared_exponentials", contextlib.nullcontext)
    apart, want = run()
    assert apart["exp"] == 4  # (each of the four its own, as the release before computed them)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
