"""``synkhronos.pymc._special``: the rows kernel's lgamma and digamma (Triton
has no rule for JAX's) against SciPy's, in float64 and float32, over the
whole line: small and huge arguments, the reflection below one half, near
its poles, and infinities."""

import numpy as np
import pytest
import scipy.special as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

pytest.importorskip("pymc")  # synkhronos.pymc needs it
jax = pytest.importorskip("jax")

from _jax64 import jax_x64  # noqa: E402

from synkhronos.pymc import _special  # noqa: E402

FUNCTIONS = {"lgamma": (_special.lgamma, sp.gammaln), "digamma": (_special.digamma, sp.digamma)}
EDGES = [1e-300, 1e-8, 0.5, 1.0, 2.0, 7.999999, 8.0, 8.000001, 1e6, 1e39, 1e300, -0.5, -1e-8, -2.5,
         -9.000012, -20.999, np.inf]


@pytest.fixture(autouse=True, scope="module")
def x64():
    with jax_x64():
        yield


def _values(name, xv):
    fn, ref = FUNCTIONS[name]
    got = np.asarray(jax.jit(fn)(xv))
    with np.errstate(all="ignore"):
        return got, ref(xv)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(FUNCTIONS)),
       hnp.arrays(np.float64, st.integers(1, 40), elements=st.floats(-60, 1e12) | st.sampled_from(EDGES)))
def test_float64_values_are_scipys(name, xv):
    xv = xv[~((xv <= 0) & (xv == np.round(xv)))]  # (the poles)
    xv = xv[np.abs(xv) >= np.finfo(np.float64).tiny]  # (XLA flushes subnormal numbers to zero)
    if not xv.size:
        return
    got, want = _values(name, xv)
    assert got.dtype == np.float64
    # Below one half the reflection loses digits; near a pole (x < 0) the value is
    # ill-conditioned besides: x itself is rounded, by up to |x| * eps, so the value
    # is known to about |x| * eps / distance of itself, in SciPy's reference too
    # (a digamma 7e-15 from -2: SciPy -1.40709e14, the true value -1.40737e14).
    eps = np.finfo(np.float64).eps
    distance = np.abs(xv - np.round(xv))
    tol = 2e-14 * np.maximum(1, np.abs(want)) * np.where(xv < 0.5, 1e3, 1)
    with np.errstate(all="ignore"):
        tol += np.where(xv < 0, 4 * eps * np.abs(xv) / distance * np.abs(want), 0)
    finite = np.isfinite(want)
    np.testing.assert_array_less(np.abs(got[finite] - want[finite]), tol[finite])
    assert np.array_equal(np.isposinf(got), np.isposinf(want)) and not np.isnan(got[~np.isnan(want)]).any()


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_float32_values_are_scipys(name):
    xv = np.concatenate([np.geomspace(1e-6, 1e20, 400), -np.linspace(0.05, 30.5, 200)]).astype("float32")
    got, want = _values(name, xv)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want.astype("float32"), rtol=2e-5, atol=2e-5)
