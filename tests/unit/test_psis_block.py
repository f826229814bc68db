"""PSIS of a block of rows at once (``synkhronos.pymc._psis_block``) against
the installed ArviZ one row at a time (0.x's ``psislw``, 1.x's ``arviz_stats``
``loo``), as ``az.loo`` computes each row's ``elpd_loo``, ``p_loo`` and Pareto
k: blocks of well-behaved, heavy-tailed, constant and tied rows, at draw counts
around the tail's length rules."""

import re
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pymc")  # synkhronos.pymc needs it
pytest.importorskip("arviz")

from _jax64 import jax_x64  # noqa: E402

from synkhronos.pymc._psis import arviz_major, arviz_rows, arviz_stats_rows  # noqa: E402
from synkhronos.pymc._psis_block import smoothed_loo, tail_length  # noqa: E402

RULES = min(arviz_major(), 1)
CHAINS = 4  # ArviZ 1.x reads the draws as chains x draws

KINDS = ("normal", "heavy", "constant", "tied", "two values", "wide")


def _row(rng, kind, n_draws):
    if kind == "normal":
        return rng.normal(-1, rng.uniform(0.01, 2), n_draws)
    if kind == "heavy":
        return -np.abs(rng.standard_t(rng.uniform(0.5, 3), n_draws)) * rng.uniform(0.1, 5)
    if kind == "constant":
        return np.full(n_draws, -rng.uniform(0, 3))
    if kind == "tied":  # repeated draws: ties at and around the tail's cutoff
        return rng.choice(rng.normal(-1, 1, max(2, n_draws // 20)), n_draws)
    if kind == "two values":
        return np.where(rng.random(n_draws) < 0.5, -0.1, -7.0)
    return rng.normal(-50, 40, n_draws)  # ratios spanning far more than a float's range


def _arviz(rows, reff):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if RULES == 0:
            return arviz_rows(rows, reff)
        return arviz_stats_rows(rows, reff, CHAINS)


def _both(rows, reff, fallback=None):
    """The block's and ArviZ's results, or the error both raise (ArviZ 1.x
    refuses a row whose tail is one value)."""
    try:
        want = _arviz(rows, reff)
    except ValueError as exc:
        with pytest.raises(ValueError, match=str(exc)), np.errstate(all="ignore"):
            smoothed_loo(rows, reff, fallback or (lambda left: _arviz(left, reff)), rules=RULES)
        return None, None
    with np.errstate(all="ignore"):
        got = smoothed_loo(rows, reff, fallback or (lambda left: _arviz(left, reff)), rules=RULES)
    return got, want


def _assert_same(got, want):
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=float), np.asarray(w, dtype=float)
        assert np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(np.isinf(g), np.isinf(w))
        fin = np.isfinite(w)
        np.testing.assert_allclose(g[fin], w[fin], rtol=1e-9, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_draws=st.sampled_from([20, 24, 28, 100, 224, 228, 400, 1000, 2000]),
       reff=st.sampled_from([0.3, 0.7, 1.0, 1.6]),
       kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=12))
def test_equals_arviz_row_by_row(seed, n_draws, reff, kinds):
    rng = np.random.default_rng(seed)
    rows = np.stack([_row(rng, kind, n_draws) for kind in kinds])
    got, want = _both(rows, reff)
    if want is not None:
        _assert_same(got, want)


def test_odd_rows_go_to_arviz_and_the_rest_do_not():
    """Ties at the cutoff, and a tail with too few distinct values, are ArviZ's
    to smooth; a well-behaved row is smoothed in the block."""
    rng = np.random.default_rng(3)
    n_draws = 1000
    cut = n_draws - tail_length(n_draws, 1.0, RULES) - 1
    tied = rng.normal(-1, 1, n_draws)
    order = np.argsort(-tied)  # ratios ascending
    tied[order[cut + 1]] = tied[order[cut]]  # the first tail draw equals the cutoff
    lumpy = rng.normal(-1, 1, n_draws)
    order = np.argsort(-lumpy)
    quarter = int(tail_length(n_draws, 1.0, RULES) / 4 + 0.5)
    lumpy[order[cut + 1:cut + 1 + quarter]] = lumpy[order[cut + 1]]  # tail: quartile = minimum
    rows = np.stack([rng.normal(-1, 1, n_draws), tied, lumpy])
    left = []

    def fallback(r):
        left.append(r.copy())
        return _arviz(r, 1.0)

    got, want = _both(rows, 1.0, fallback)
    odd = [1, 2] if RULES == 1 else [1]  # ArviZ 1.x does not fit such a tail; 0.x does
    assert len(left) == 1
    np.testing.assert_array_equal(left[0], rows[odd])
    _assert_same(got, want)


def test_unknown_rules_are_named():
    with pytest.raises(ValueError, match="rules must be one of"):
        smoothed_loo(np.zeros((1, 100)), 1.0, None, rules=2)


# ---------------------------------------------------------------- on the device
# GPU ranks smooth the block in JAX (``_psis_jax``, through ``PointwiseLoo``'s JAX
# form), here on JAX's CPU backend: the same steps, so ArviZ's numbers.

ROWS = 12  # every block padded to this many rows: one compilation per draw count


@pytest.fixture(scope="module")
def x64():
    with jax_x64():
        yield


def _device_form():
    import jax
    from pytensor.link.jax.dispatch import jax_funcify

    from synkhronos.pymc._psis import PointwiseLoo

    return jax.jit(jax_funcify(PointwiseLoo()))


def _assert_device_same(got, want, k_want):
    """ArviZ's numbers to a relative 1e-9 where its Pareto k is at most 1; past
    that the tail's fit is so ill-conditioned that the order of a sum moves
    its k in the sixth digit (1e-4 then)."""
    regular = np.abs(np.asarray(k_want)) <= 1
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=float), np.asarray(w, dtype=float)
        assert np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(np.isinf(g), np.isinf(w))
        fin = np.isfinite(w)
        np.testing.assert_allclose(g[fin & regular], w[fin & regular], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(g[fin & ~regular], w[fin & ~regular], rtol=1e-4, atol=1e-8)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_draws=st.sampled_from([20, 28, 100, 228, 1000, 2000]),
       reff=st.sampled_from([0.3, 0.7, 1.0, 1.6]),
       kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=ROWS))
def test_device_form_equals_arviz_row_by_row(x64, seed, n_draws, reff, kinds):
    rng = np.random.default_rng(seed)
    kinds = kinds + ["normal"] * (ROWS - len(kinds))
    rows = np.stack([_row(rng, kind, n_draws) for kind in kinds])
    try:
        want = _arviz(rows, reff)
    except ValueError as exc:  # ArviZ 1.x refuses some rows; so does the device form, naming why
        with pytest.raises(Exception, match=re.escape(str(exc))), np.errstate(all="ignore"):
            np.asarray(_device_form()(rows, reff, CHAINS)[0])
        return
    with np.errstate(all="ignore"):
        got = _device_form()(rows, reff, CHAINS)
    _assert_device_same(got, want, want[2])


def test_device_form_leaves_only_odd_rows_to_arviz(x64, monkeypatch):
    """A block of regular rows never comes to the host; one with a row tied at
    its cutoff does, once, and that row is ArviZ's."""
    from synkhronos.pymc import _psis

    calls = []
    real = _psis._rest_by_arviz

    def counted(rows, reff, chains, done, *values):
        calls.append(np.flatnonzero(~np.asarray(done)))
        return real(rows, reff, chains, done, *values)

    monkeypatch.setattr(_psis, "_rest_by_arviz", counted)
    rng = np.random.default_rng(5)
    n_draws = 1000
    rows = rng.normal(-1, 1, (ROWS, n_draws))
    form = _device_form()
    _assert_device_same(form(rows, 1.0, CHAINS), _arviz(rows, 1.0), _arviz(rows, 1.0)[2])
    assert calls == []
    cut = n_draws - tail_length(n_draws, 1.0, RULES) - 1
    order = np.argsort(-rows[4])  # ratios ascending
    rows[4, order[cut + 1]] = rows[4, order[cut]]  # the first tail draw equals the cutoff
    want = _arviz(rows, 1.0)
    _assert_device_same(form(rows, 1.0, CHAINS), want, want[2])
    assert [list(c) for c in calls] == [[4]]
