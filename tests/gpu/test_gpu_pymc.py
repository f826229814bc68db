"""synkhronos.pymc.data_parallel on one GPU rank: the copy's log-density and
gradient equal PyMC's own (its CPU functions on the same model) at random points,
in float64, and PyMC's sampler runs on it."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import pytensor  # noqa: E402
import test_pymc  # noqa: E402
from test_pymc import assert_same_density, hierarchical, logistic  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos.pymc import data_parallel  # noqa: E402

pytestmark = pytest.mark.gpus(1)


@pytest.fixture(scope="module")
def session():
    """One GPU rank in float64, as a PyMC user has it (floatX put back after)."""
    was = pytensor.config.floatX
    pytensor.config.floatX = "float64"
    synk.close()
    synk.fork(1, use_gpu=True)
    yield
    synk.close()
    pytensor.config.floatX = was


@pytest.mark.parametrize("make, n", [(logistic, 100_003), (hierarchical, 20_000)])
def test_logp_and_gradient_equal_pymcs_on_a_gpu(session, make, n):
    assert test_pymc.RTOL == 1e-9  # the tolerance, in float64
    model = make(n)
    assert_same_density(model, data_parallel(model))


def test_sample_on_a_gpu_rank(session):
    model = data_parallel(logistic(5000))
    with model:
        idata = pm.sample(draws=50, tune=50, chains=2, progressbar=False, random_seed=3,
                          compute_convergence_checks=False)
    b = idata.posterior["b"].values
    assert b.shape == (2, 50, 3) and np.all(np.isfinite(b))
    np.testing.assert_allclose(b.mean(axis=(0, 1)), [0.5, -1.0, 0.2], atol=0.25)
