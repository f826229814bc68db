"""``lgamma`` and ``digamma`` as the rows kernel computes them (``_scalars``):
Triton has no rule for JAX's, and a Poisson's ``log(y!)``, a negative
binomial's or a binomial's coefficients take them on every row.

Both shift an argument below 8 to ``z = x + 8`` by the recurrence, where
Stirling's series of seven terms is exact to rounding in float64, and reflect arguments
below one half (``sin`` and ``tan`` of ``pi`` times the distance to the
nearest integer, exact near the poles).  Against SciPy, for ``x > 0``: 6.5e-15
relative (lgamma) and 1.8e-15 (digamma), where XLA's own gave 4.1e-15 and
1.9e-15 on the same points.
"""

import math

__all__ = ["lgamma", "digamma"]

SHIFT = 8
# Stirling's series: B_2k / (2k (2k - 1)) for lgamma, B_2k / (2k) for digamma (k = 1..7).
_LGAMMA = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
_DIGAMMA = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)


def _jnp():
    import jax.numpy as jnp

    return jnp


def _series(coefs, r2):
    s = coefs[-1]
    for c in coefs[-2::-1]:
        s = s * r2 + c
    return s


def _reflected(x):
    """``(x >= 1/2, max(x, 1 - x), pi times x's distance to its nearest integer)``."""
    jnp = _jnp()
    up = x >= 0.5
    return up, jnp.where(up, x, 1 - x), math.pi * (x - jnp.floor(x + 0.5))


def lgamma(x):
    """``log |Gamma(x)|``."""
    jnp = _jnp()
    up, y, angle = _reflected(x)
    small = y < SHIFT  # (shifted; beyond, the series alone, and no product to overflow)
    product = y
    for k in range(1, SHIFT):
        product = product * (y + k)
    z = jnp.where(small, y + SHIFT, y)
    r = 1 / z
    value = (z - 0.5) * jnp.log(z) - z + 0.5 * math.log(2 * math.pi) + _series(_LGAMMA, r * r) * r
    value = jnp.where(small, value - jnp.log(jnp.where(small, product, 1)), value)
    value = jnp.where(y == math.inf, math.inf, value)
    return jnp.where(up, value, math.log(math.pi) - jnp.log(jnp.abs(jnp.sin(angle))) - value)


def digamma(x):
    """``d/dx log Gamma(x)``."""
    jnp = _jnp()
    up, y, angle = _reflected(x)
    small = y < SHIFT
    below = 1 / y
    for k in range(1, SHIFT):
        below = below + 1 / (y + k)
    z = jnp.where(small, y + SHIFT, y)
    r2 = 1 / (z * z)
    value = jnp.log(z) - 0.5 / z - _series(_DIGAMMA, r2) * r2 - jnp.where(small, below, 0)
    return jnp.where(up, value, value - math.pi / jnp.tan(angle))
