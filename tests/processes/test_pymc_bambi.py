"""bambi's models split as its users build them (``bmb.Model(...).build()``, then
``data_parallel`` on ``model.backend.model``, Synkhronos's defaults): group terms
(``1|group_sigma``-style names) in both families we test, the log-density and
gradient equal to PyMC's on the original at random points.  Skipped where bambi
is not installed (it follows PyMC 6; ``pip install bambi``)."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
bmb = pytest.importorskip("bambi")
pd = pytest.importorskip("pandas")

from test_pymc import assert_same_density, float64_session  # noqa: E402

from synkhronos.pymc import data_parallel  # noqa: E402

N = 2001  # uneven over 2 ranks
FORMULA = "%s ~ x1 + x2 + (1 + x1 | group)"


@pytest.fixture(scope="module")
def session():
    with float64_session(2):
        yield


def frame(n, groups=7, seed=0):
    """Rows of a logistic and a normal outcome with varying intercepts and slopes."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    x1, x2 = rng.standard_normal(n), rng.standard_normal(n)
    eta = 0.3 + 0.5 * rng.standard_normal(groups)[g] + 0.8 * x1 - 0.5 * x2
    return pd.DataFrame({"b": (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int),
                         "c": eta + rng.standard_normal(n), "x1": x1, "x2": x2,
                         "group": pd.Categorical(g)})


@pytest.mark.parametrize("outcome, family", [("b", "bernoulli"), ("c", "gaussian")])
def test_group_terms_split_with_pymcs_density(session, outcome, family):
    built = bmb.Model(FORMULA % outcome, frame(N), family=family)
    built.build()
    model = built.backend.model
    split = data_parallel(model)
    assert [v.name for v in split.observed_RVs] == [v.name for v in model.observed_RVs]
    assert not split.potentials
    assert any("|group" in v.name for v in split.value_vars)
    assert_same_density(model, split, rtol=1e-9)
