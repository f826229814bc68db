"""synkhronos.pymc.loo against ArviZ itself: on a data_parallel copy it gives
what az.loo gives after pm.compute_log_likelihood on the original model (the
totals, the standard error, every row's elpd and Pareto k), with rows that do
not divide among the ranks and blocks smaller than a rank's rows; az.compare
takes its result; bad arguments are refused with errors that name them."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
az = pytest.importorskip("arviz")

from test_pymc import float64_session, logistic  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos.pymc import data_parallel, loo  # noqa: E402
from synkhronos.pymc._loo_ranks import over_draws  # noqa: E402
from synkhronos.pymc._psis import arviz_major  # noqa: E402

RTOL = 1e-6  # the bar; the values agree to about 1e-13
ROWS = 2001  # odd: the two ranks hold 1001 and 1000 rows
CHUNK = 300  # four blocks on each rank
MAJOR = arviz_major()


@pytest.fixture(scope="module")
def session():
    with float64_session(2):
        yield


def idata_of(posterior):
    """ArviZ's own container of ``posterior`` (name -> chain x draw x ...)."""
    if MAJOR == 0:
        return az.from_dict(posterior=posterior)
    import arviz_base

    return arviz_base.from_dict({"posterior": posterior})


def correlated(rng, center, scale, chains=2, draws=150):
    """Draws around ``center`` that are autocorrelated within each chain (AR(1)),
    so that ``reff`` is not 1."""
    center = np.asarray(center, dtype=float)
    x = np.empty((chains, draws) + center.shape)
    x[:, 0] = rng.standard_normal((chains,) + center.shape)
    for t in range(1, draws):
        x[:, t] = 0.6 * x[:, t - 1] + 0.8 * rng.standard_normal((chains,) + center.shape)
    return center + scale * x


def regression(n, seed=3):
    """A normal regression with group intercepts (their index a row of data),
    group weights in data of another length (broadcast, not split), a
    log-transformed scale, named dims, and a second observed variable (a Poisson
    count) on the same rows."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, 4, n)
    x = rng.standard_normal(n)
    y = 0.5 * g - 0.7 * x + rng.standard_normal(n)
    counts = rng.poisson(np.exp(0.3 + 0.2 * x))
    with pm.Model(coords={"obs": np.arange(n) + 100, "group": list("abcd")}) as m:
        gd = pm.Data("g", g, dims="obs")
        xd = pm.Data("x", x, dims="obs")
        weight = pm.Data("weight", [1.0, 0.5, 2.0, 1.5], dims="group")
        alpha = pm.Normal("alpha", 0, 2, dims="group")
        beta = pm.Normal("beta", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        gamma = pm.Normal("gamma", 0, 1, shape=2)
        pm.Normal("y", alpha[gd] + 0.1 * weight[gd] + beta * xd, sigma, observed=y, dims="obs")
        pm.Poisson("counts", pm.math.exp(gamma[0] + gamma[1] * xd), observed=counts, dims="obs")
    return m


def regression_idata(seed=4):
    rng = np.random.default_rng(seed)
    return idata_of({"alpha": correlated(rng, [0.0, 0.5, 1.0, 1.5], 0.05),
                     "beta": correlated(rng, -0.7, 0.03),
                     "sigma": np.abs(correlated(rng, 1.0, 0.03)),
                     "gamma": correlated(rng, [0.3, 0.2], 0.03)})


def logistic_idata(seed=5, shrink=1.0):
    rng = np.random.default_rng(seed)
    return idata_of({"a": correlated(rng, 0.3, 0.05), "b": shrink * correlated(rng, [0.5, -1.0, 0.2], 0.05)})


def _case(model, idata):
    """(the original, its copy, ``idata`` with the original's log-likelihood)."""
    pm.compute_log_likelihood(idata, model=model, progressbar=False)
    return model, data_parallel(model), idata


@pytest.fixture(scope="module")
def logistic_case(session):
    return _case(logistic(ROWS), logistic_idata())


@pytest.fixture(scope="module")
def regression_case(session):
    return _case(regression(ROWS), regression_idata())


def totals(result):
    """(elpd, se, p_loo) of either ArviZ's ELPD object."""
    if MAJOR == 0:
        return result["elpd_loo"], result["se"], result["p_loo"]
    return result.elpd, result.se, result.p


def rows(result):
    """(elpd_i, pareto_k) of either ArviZ's ELPD object, as DataArrays."""
    if MAJOR == 0:
        return result["loo_i"], result["pareto_k"]
    return result.elpd_i, result.pareto_k


def assert_same_loo(ours, theirs):
    assert type(ours) is type(theirs)
    np.testing.assert_allclose(totals(ours), totals(theirs), rtol=RTOL)
    for mine, ref in zip(rows(ours), rows(theirs)):
        assert mine.dims == ref.dims
        for d in ref.dims:
            np.testing.assert_array_equal(mine[d].values, ref[d].values)
        np.testing.assert_allclose(mine.values, ref.values, rtol=RTOL, atol=1e-12)
    p_i = ours["p_loo_i"].values
    np.testing.assert_allclose(p_i.sum(), totals(theirs)[2], rtol=RTOL)


def test_logistic_equals_az_loo_in_blocks(logistic_case):
    model, copy, idata = logistic_case
    ours = loo(idata, copy, chunk_rows=CHUNK)
    assert_same_loo(ours, az.loo(idata, pointwise=True))
    again = loo(idata, copy, chunk_rows=1000, reff=0.8)  # last block: one row on rank 0, none on rank 1
    np.testing.assert_allclose(totals(again), totals(az.loo(idata, pointwise=True, reff=0.8)), rtol=RTOL)


def test_regression_each_term_equals_az_loo(regression_case):
    model, copy, idata = regression_case
    for name in ["y", "counts"]:
        ours = loo(idata, copy, var_name=name)  # the default block: all of a rank's rows at once
        assert_same_loo(ours, az.loo(idata, var_name=name, pointwise=True))
    with pytest.raises(ValueError, match="several terms.*var_name"):
        loo(idata, copy)
    pm.set_data({"weight": [3.0, 0.5, 2.0, 1.5]}, model=copy)  # data without rows: read at each loo
    pm.set_data({"weight": [3.0, 0.5, 2.0, 1.5]}, model=model)
    idata = regression_idata()  # the same draws, the log-likelihood with the new weights
    pm.compute_log_likelihood(idata, model=model, progressbar=False)
    assert_same_loo(loo(idata, copy, var_name="y"), az.loo(idata, var_name="y", pointwise=True))


def test_compare_takes_the_result(logistic_case):
    _, copy, idata = logistic_case
    shrunk = logistic_idata(shrink=0.2)  # the same rows, the covariates' effects shrunk: a worse fit
    table = az.compare({"logistic": loo(idata, copy, chunk_rows=CHUNK), "shrunk": loo(shrunk, copy)})
    assert list(table.index) == ["logistic", "shrunk"]


def test_not_pointwise(logistic_case):
    _, copy, idata = logistic_case
    ours = loo(idata, copy, pointwise=False)
    np.testing.assert_allclose(totals(ours), totals(az.loo(idata, pointwise=True)), rtol=RTOL)
    assert "loo_i" not in ours if MAJOR == 0 else ours.elpd_i is None


def test_scale(logistic_case):
    _, copy, idata = logistic_case
    if MAJOR >= 1:
        with pytest.raises(ValueError, match="scale='deviance'.*log scale only"):
            loo(idata, copy, scale="deviance")
        return
    ours = loo(idata, copy, scale="deviance")
    assert_same_loo(ours, az.loo(idata, pointwise=True, scale="deviance"))


def test_bad_arguments(logistic_case):
    model, copy, idata = logistic_case
    with pytest.raises(TypeError, match="not a copy that synkhronos.pymc.data_parallel returned"):
        loo(idata, model)
    with pytest.raises(TypeError, match="model must be the pymc.Model"):
        loo(idata, "model")
    with pytest.raises(TypeError, match="posterior group"):
        loo({"draws": 1}, copy)
    missing = idata_of({"a": np.zeros((2, 10))})
    with pytest.raises(ValueError, match="no variable 'b'"):
        loo(missing, copy)
    wrong = idata_of({"a": np.zeros((2, 10)), "b": np.zeros((2, 10, 4))})
    with pytest.raises(ValueError, match="'b' has shape \\(4,\\)"):
        loo(wrong, copy)
    with pytest.raises(ValueError, match="var_name='z' is not a term"):
        loo(idata, copy, var_name="z")
    for bad in [0, -3, 2.5, True]:
        with pytest.raises(ValueError, match="chunk_rows must be a positive int, got %r" % (bad,)):
            loo(idata, copy, chunk_rows=bad)
    for bad in [0, -1.0, float("inf"), "1"]:
        with pytest.raises(ValueError, match="reff must be a positive finite number"):
            loo(idata, copy, reff=bad)
    with pytest.raises(ValueError, match="scale must be one of"):
        loo(idata, copy, scale="linear")
    with pytest.raises(TypeError, match="pointwise must be True, False or None, got 'yes'"):
        loo(idata, copy, pointwise="yes")


def test_draws_in_a_loop_where_not_vectorized(monkeypatch):
    """Where PyTensor cannot vectorize the per-row graph over the draws, a scan
    over them gives the same matrix."""
    import pytensor
    import pytensor.graph.replace as replace
    import pytensor.tensor as pt

    b = pt.vector("b", shape=(2,))
    x = pt.matrix("x")
    logp = -((x @ b) ** 2)
    draws = pytensor.shared(np.arange(10.0).reshape(5, 2))
    x_val = np.random.default_rng(0).standard_normal((7, 2))
    vectorized = pytensor.function([x], over_draws(logp, [b], [draws], {}))(x_val)

    def refused(*args, **kwargs):
        raise NotImplementedError("no batched form")

    monkeypatch.setattr(replace, "vectorize_graph", refused)
    looped = pytensor.function([x], over_draws(logp, [b], [draws], {}))(x_val)
    np.testing.assert_allclose(looped, vectorized, rtol=1e-12)
    np.testing.assert_allclose(vectorized, -((x_val @ draws.get_value().T) ** 2).T, rtol=1e-12)


def test_benchmark_runs_at_its_smallest_and_equals_az_loo(tmp_path):
    """benchmarks/pymc_loo.py: loo on the copy against the original's
    compute_log_likelihood + az.loo on the same posterior, JSON and PNG."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "loo.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "pymc_loo.py"), "--rows", "3000",
                           "--draws", "100", "--chains", "2", "--ranks", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = json.loads(out.read_text())["records"]
    assert record["rows"] == 3000 and record["draws"] == 200
    assert record["max_rel_diff_totals"] < 1e-6 and record["max_rel_diff_k"] < 1e-6
    assert record["loo_first_s"] > 0 and record["original_az_loo_s"] > 0
    assert (tmp_path / "loo.png").read_bytes()[:4] == b"\x89PNG"


def test_closed_session_is_named(logistic_case):
    _, copy, idata = logistic_case
    synk.close()
    with pytest.raises(RuntimeError, match="session that holds the rows of 'y' was closed"):
        loo(idata, copy)
