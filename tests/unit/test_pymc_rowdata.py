"""``synkhronos.pymc._rowdata``, through ``_terms.find_terms``: equal row arrays
are held once, an integer array that only indexes is held in the narrowest
unsigned type of its values (across the 8, 16 and 32-bit limits), and the
terms' log-densities at those rows equal PyMC's own; an array also read as a
number, one with a negative value, and the observed values are left as they
are."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

from synkhronos._graph.editing import replaced, row_input  # noqa: E402
from synkhronos.pymc._terms import find_terms  # noqa: E402

N = 64


def _model(groups, g, g2, x, numeric=False):
    """A normal GLMM as bambi writes one: an intercept and a slope per group,
    each picked by its own copy of the group index; ``numeric``: one index, a
    ``pm.Data`` (PyMC folds arithmetic on constants), also read as a number."""
    rng = np.random.default_rng(0)
    with pm.Model() as m:
        u = pm.Normal("u", 0, 1, shape=groups)
        v = pm.Normal("v", 0, 1, shape=groups)
        b = pm.Normal("b", 0, 1)
        if numeric:
            g = g2 = pm.Data("g", g)
        mu = u[g] + v[g2] * x + b * x
        if numeric:
            mu = mu + 1e-3 * g
        pm.Normal("y", mu, 1, observed=rng.standard_normal(N))
    return m


def _terms(m):
    return find_terms(m, list(m.observed_RVs), N)


def _logp_at_rows(m, terms):
    """The terms' summed log-density at the model's initial point, each row
    variable an input given its value (as the ranks hold them)."""
    import pytensor

    inputs = [row_input(v, v.name) for v in terms.row_vars]
    (lp,) = replaced(terms.logps, dict(zip(terms.row_vars, inputs)))
    point = m.initial_point()
    fn = pytensor.function(terms.held + inputs, lp.sum(), mode="FAST_COMPILE")
    return fn(*[point[p.name] for p in terms.params], *terms.row_values)


def _plain_logp(m):
    return m.compile_logp(vars=list(m.observed_RVs), sum=True)(m.initial_point())


def _index_dtypes(terms):
    return sorted(str(v.dtype) for v, val in zip(terms.row_vars, terms.row_values) if val.dtype.kind in "iu")


@pytest.mark.parametrize("groups, dtype", [(2, "uint8"), (256, "uint8"), (257, "uint16"),
                                           (65536, "uint16"), (65537, "uint32")])
def test_an_index_is_held_once_in_the_narrowest_unsigned_type(groups, dtype):
    rng = np.random.default_rng(groups)
    g = rng.integers(0, groups, N)
    g[0] = groups - 1  # the largest value is there: the limits are crossed exactly
    m = _model(groups, g, g.copy(), rng.standard_normal(N))
    terms = _terms(m)
    assert _index_dtypes(terms) == [dtype], "one index, narrowed"
    (value,) = [v for v in terms.row_values if v.dtype.kind in "iu"]
    np.testing.assert_array_equal(value, g)
    assert np.isclose(_logp_at_rows(m, terms), _plain_logp(m), rtol=1e-12, atol=0)


def test_different_indices_stay_two():
    rng = np.random.default_rng(1)
    g = rng.integers(0, 5, N)
    m = _model(5, g, (g + 1) % 5, rng.standard_normal(N))
    terms = _terms(m)
    assert _index_dtypes(terms) == ["uint8", "uint8"]
    assert np.isclose(_logp_at_rows(m, terms), _plain_logp(m), rtol=1e-12, atol=0)


@pytest.mark.parametrize("why", ["read as a number", "a negative index"])
def test_an_index_that_cannot_be_narrowed_keeps_its_type(why):
    rng = np.random.default_rng(2)
    g = rng.integers(0, 5, N)
    if why == "a negative index":
        g[3] = -1
    m = _model(5, g, g.copy(), rng.standard_normal(N), numeric=why == "read as a number")
    terms = _terms(m)
    (dtype,) = _index_dtypes(terms)
    assert dtype in ("int64", "int32"), why  # (pm.Data holds integers as int32)
    assert np.isclose(_logp_at_rows(m, terms), _plain_logp(m), rtol=1e-12, atol=0)


def test_observed_values_equal_to_data_are_kept_apart():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(N)
    with pm.Model() as m:
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", b * x, 1, observed=x.copy())
    terms = _terms(m)
    assert len(terms.row_vars) == 2 and terms.row_vars[0].name == "y"
    assert np.isclose(_logp_at_rows(m, terms), _plain_logp(m), rtol=1e-12, atol=0)


def _ones_model(column, potential=False):
    """bambi's ``1|group`` term: a coefficient per group multiplied by
    ``column`` (bambi's column of ones), with a slope on data ``x``; as a
    likelihood, or as a potential over the rows (no observed stand-in)."""
    rng = np.random.default_rng(4)
    g, x, y = rng.integers(0, 3, N), rng.standard_normal(N), rng.standard_normal(N)
    with pm.Model() as m:
        u = pm.Normal("u", 0, 1, shape=3)
        b = pm.Normal("b", 0, 1)
        mu = (u[g] * column if column.ndim == 1 else u[g] * column.sum(1)) + b * x
        if potential:
            pm.Potential("lik", pm.logp(pm.Normal.dist(mu, 1), y))
        else:
            pm.Normal("y", mu, 1, observed=y)
    return m


@pytest.mark.parametrize("column", ["int64 ones", "float 2.5", "rows of two values"])
@pytest.mark.parametrize("potential", [False, True])
def test_rows_all_the_same_are_a_constant_not_held(column, potential):
    value = {"int64 ones": np.ones(N, "int64"), "float 2.5": np.full(N, 2.5),
             "rows of two values": np.tile([0.5, -1.0], (N, 1))}[column]
    m = _ones_model(value, potential)
    terms = find_terms(m, list(m.potentials if potential else m.observed_RVs), N)
    held = [val for val in terms.row_values]
    assert not any(val.shape == value.shape and np.array_equal(val, value) for val in held), column
    assert len(held) == 3, "the values, x and the index"
    terms_of = list(m.potentials if potential else m.observed_RVs)
    plain = m.compile_logp(vars=terms_of, sum=True)(m.initial_point())
    assert np.isclose(_logp_at_rows(m, terms), plain, rtol=1e-12, atol=0)


@pytest.mark.parametrize("change", ["last row differs", "negative zero"])
@pytest.mark.parametrize("potential", [False, True])
def test_rows_that_differ_in_one_place_are_held(change, potential):
    value = np.ones(N) if change == "last row differs" else np.zeros(N)
    value[-1] = 1.5 if change == "last row differs" else -0.0  # (-0.0 == 0.0, but not bit for bit)
    m = _ones_model(value, potential)
    terms_of = list(m.potentials if potential else m.observed_RVs)
    terms = find_terms(m, terms_of, N)
    held = any(val.dtype == value.dtype and np.array_equal(val, value) and
               np.array_equal(np.signbit(val), np.signbit(value)) for val in terms.row_values)
    # PyMC derives an observed variable's log-density through rewrites that drop a
    # product with a column of zeros, whatever their signs (as the model's own
    # logp does); a potential's graph stays as written.
    assert held == (potential or change != "negative zero"), change
    plain = m.compile_logp(vars=terms_of, sum=True)(m.initial_point())
    assert np.isclose(_logp_at_rows(m, terms), plain, rtol=1e-12, atol=0)
