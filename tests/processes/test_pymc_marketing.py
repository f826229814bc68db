"""pymc-marketing's customer-lifetime models split as their users build them
(``BetaGeoModel(data=df).build_model()``, then ``data_parallel`` on
``model.model``, Synkhronos's defaults): the log-density and gradient equal to
PyMC's on the original at random points, and the batched graph where the ranks
compile with JAX (BetaGeo's deterministics once stopped it).  ParetoNBD's
gradient holds an Op JAX cannot compile (a hypergeometric series' loop), so its
ranks compile with PyTensor's C linker, one point at a time.  Skipped where
pymc-marketing is not installed (``pip install pymc-marketing``; its releases
pin PyMC)."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
clv = pytest.importorskip("pymc_marketing.clv")
pd = pytest.importorskip("pandas")

from test_pymc import assert_same_density, float64_session  # noqa: E402

from synkhronos.pymc import data_parallel  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402

N = 2001  # uneven over 2 ranks


@pytest.fixture(scope="module")
def session():
    with float64_session(2):
        yield


def customers(n=N, seed=0):
    """Each customer's repeat purchases, the time of the last one and the time
    observed, as pymc-marketing's CLV models read them."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(20, 60, n)
    frequency = rng.poisson(2, n).astype(float)
    recency = np.where(frequency > 0, t * rng.uniform(0, 1, n), 0.0)
    return pd.DataFrame({"customer_id": np.arange(n), "frequency": frequency, "recency": recency, "T": t})


@pytest.mark.parametrize("name, batched", [("BetaGeoModel", True), ("ParetoNBDModel", False)])
def test_clv_models_split_with_pymcs_density(session, name, batched):
    built = getattr(clv, name)(data=customers())
    built.build_model()
    model = built.model
    split = data_parallel(model)
    assert [v.name for v in split.observed_RVs] == [v.name for v in model.observed_RVs]
    assert rows_op_of(split)[0].evaluator.batched == batched
    assert_same_density(model, split, rtol=1e-9)


def test_a_graph_jax_cannot_convert_is_not_timed_against_jax(session, monkeypatch):
    """ParetoNBD's ranks link with PyTensor's own already: nothing more is
    compiled for the CPU ranks' linker trial (``_linker``), however many rows."""
    from synkhronos.pymc import _linker

    monkeypatch.delenv(_linker.LINKER_ENV, raising=False)
    monkeypatch.setattr(_linker, "TRIAL_ROWS", 10)
    built = []
    monkeypatch.setattr(_linker, "distributed", lambda *a: built.append(a))
    model = clv.ParetoNBDModel(data=customers(n=300))
    model.build_model()
    data_parallel(model.model)
    assert not built
