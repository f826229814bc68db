"""synkhronos.pymc.loo on GPU ranks (every visible GPU): each rank's rows at
every draw on its GPU, smoothed there (``_psis_jax``), every value az.loo's on
the original model."""

import pytest

pm = pytest.importorskip("pymc")
az = pytest.importorskip("arviz")

import test_pymc_loo as base  # noqa: E402
from test_pymc import assert_same_density, float64_session, logistic  # noqa: E402

from synkhronos._devices.gpu import visible_gpus  # noqa: E402
from synkhronos.pymc import _placement, data_parallel, loo  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402

pytestmark = pytest.mark.gpus(1)


@pytest.fixture(scope="module")
def session():
    """Every GPU a rank, in float64, as a PyMC user has it."""
    with float64_session(len(visible_gpus()), use_gpu=True):
        yield


def test_logistic_equals_az_loo_on_gpu_ranks(session):
    model = logistic(base.ROWS)
    idata = base.logistic_idata()
    pm.compute_log_likelihood(idata, model=model, progressbar=False)
    copy = data_parallel(model)
    expected = az.loo(idata, pointwise=True)
    base.assert_same_loo(loo(idata, copy, chunk_rows=base.CHUNK), expected)
    base.assert_same_loo(loo(idata, copy), expected)  # one block per rank


@pytest.mark.parametrize("ranks", [1, None], ids=["this GPU alone", "timed"])
def test_rows_on_this_processs_gpu_alone_or_as_timed(session, monkeypatch, ranks):
    """``ranks=1``: every row on this process's GPU, the other ranks idle;
    ``ranks=None``: where the timing puts them.  PyMC's density and gradient
    and az.loo's values either way."""
    monkeypatch.delenv(_placement.RANKS_ENV, raising=False)
    model = logistic(base.ROWS)
    copy = data_parallel(model, ranks=ranks)
    if ranks == 1:
        served = rows_op_of(copy)[0].evaluator
        assert served.alone_up_to == (float("inf") if len(visible_gpus()) > 1 else 0)
    assert_same_density(model, copy)
    idata = base.logistic_idata()
    pm.compute_log_likelihood(idata, model=model, progressbar=False)
    base.assert_same_loo(loo(idata, copy, chunk_rows=base.CHUNK), az.loo(idata, pointwise=True))


def test_float32_ranks_smooth_on_the_host_and_equal_az_loo():
    """A session in float32 (JAX's 64-bit mode off on the ranks): the rows'
    log-likelihood in float32 on the GPUs, smoothed by the numpy block on the
    host, the values of az.loo (which sums in float64) on the same model to
    float32's rounding."""
    import numpy as np
    import pytensor

    import synkhronos as synk

    was = pytensor.config.floatX
    synk.close()
    pytensor.config.floatX = "float32"
    try:
        synk.fork(len(visible_gpus()), use_gpu=True)
        model = logistic(base.ROWS)
        idata = base.logistic_idata()
        pm.compute_log_likelihood(idata, model=model, progressbar=False)
        assert idata.log_likelihood["y"].dtype == np.float32
        ours, theirs = loo(idata, data_parallel(model), chunk_rows=base.CHUNK), az.loo(idata, pointwise=True)
        # p_loo is a difference of sums, which float32 rounds
        np.testing.assert_allclose(base.totals(ours), base.totals(theirs), rtol=1e-4)
        (elpd_i, k), (ref_elpd_i, ref_k) = base.rows(ours), base.rows(theirs)
        np.testing.assert_allclose(elpd_i.values, ref_elpd_i.values, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(k.values, ref_k.values, atol=1e-3)
    finally:
        synk.close()
        pytensor.config.floatX = was
