"""synkhronos.pymc.loo on GPU ranks (every visible GPU): each rank's rows at
every draw on its GPU, smoothed there (``_psis_jax``), every value az.loo's on
the original model."""

import pytest

pm = pytest.importorskip("pymc")
az = pytest.importorskip("arviz")

import test_pymc_loo as base  # noqa: E402
from test_pymc import float64_session, logistic  # noqa: E402

from synkhronos._devices.gpu import visible_gpus  # noqa: E402
from synkhronos.pymc import data_parallel, loo  # noqa: E402

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
