"""A GLM's graph of one point as PyMC writes it, its ``RowsKernel`` and
numpy's values (the rows kernel's tests on the CPU and on a GPU)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.replace import vectorize_graph

from synkhronos.pymc._kernel import rows_kernel


def kernel_op(params, rows, single):
    stacked = [pt.tensor(dtype=p.dtype, shape=(None,) + p.type.shape, name=p.name) for p in params]
    batched = vectorize_graph(single, replace=dict(zip(params, stacked)))
    return rows_kernel(params, [], rows, single, stacked, batched)[0].owner.op


GROUPS = 5  # the "groups" family's intercepts
_INDEX = {"groups": "int32", "groups_u8": "uint8"}  # each "groups" family's index dtype


def glm(family, d, dtype):
    """A GLM's log-density and gradient of one point, as PyMC writes them:
    ``(params, rows, [logp] + gradient)``.  Families: "bernoulli" (logit
    link), "normal" (its constant counts the rows), "groups" (a Normal with an
    intercept per group, picked by each row's group), "groups_u8" (the same,
    its group index unsigned, as ``_rowdata`` holds one)."""
    x = pt.tensor("x", dtype=dtype, shape=(None, d))
    beta = pt.tensor("beta", dtype=dtype, shape=(d,))
    if family.startswith("groups"):
        alpha = pt.tensor("alpha", dtype=dtype, shape=(GROUPS,))
        g = pt.tensor("g", dtype=_INDEX[family], shape=(None,))
        y = pt.tensor("y", dtype=dtype, shape=(None,))
        total = (-0.5 * (y - x @ beta - alpha[g]) ** 2).sum()
        params = [beta, alpha]
        return params, [x, y, g], [total] + pytensor.grad(total, params)
    alpha = pt.tensor("alpha", dtype=dtype, shape=())
    eta = x @ beta + alpha
    params = [beta, alpha]
    if family == "bernoulli":
        y = pt.tensor("y", dtype="int64", shape=(None,))
        total = pt.switch(pt.eq(y, 1), -pt.softplus(-eta), -pt.softplus(eta)).sum()
    else:  # a Normal whose constant counts the rows (x.shape[0])
        y = pt.tensor("y", dtype=dtype, shape=(None,))
        log_sigma = pt.tensor("log_sigma", dtype=dtype, shape=())
        params.append(log_sigma)
        total = (-0.5 * ((y - eta) / pt.exp(log_sigma)) ** 2).sum() - x.shape[0].astype(dtype) * log_sigma
    return params, [x, y], [total] + pytensor.grad(total, params)


def softplus(v):
    return np.logaddexp(0, v)


def draw_rows(family, rng, n, d, dtype):
    """Row values for ``glm(family, d, dtype)``'s rows."""
    x = rng.standard_normal((n, d)).astype(dtype)
    if family == "bernoulli":
        return [x, rng.integers(0, 2, n)]
    y = rng.standard_normal(n).astype(dtype)
    groups = [rng.integers(0, GROUPS, n).astype(_INDEX[family])] if family.startswith("groups") else []
    return [x, y] + groups


def numpy_glm(family, point, x, y, g=None):
    """numpy's log-density and gradient of one point (in float64)."""
    beta, alpha = point[0], point[1]
    if family.startswith("groups"):
        r = y - x @ beta - alpha[g]
        return [(-0.5 * r**2).sum(), x.T @ r, np.bincount(g, r, minlength=GROUPS)]
    eta = x @ beta + alpha
    if family == "bernoulli":
        one = y == 1
        s = 1 / (1 + np.exp(-eta))
        r = np.where(one, 1 - s, -s)
        return [np.where(one, -softplus(-eta), -softplus(eta)).sum(), x.T @ r, r.sum()]
    sigma = np.exp(point[2])
    z = (y - eta) / sigma
    r = z / sigma
    return [(-0.5 * z**2).sum() - len(y) * point[2], x.T @ r, r.sum(), (z**2).sum() - len(y)]


def check_many_sums(n, interpret, groups=20):
    """An intercept per group among ``groups`` (``groups + 1`` partial sums a
    point: the log-density and its gradient) over ``n`` rows: the kernel's
    values are numpy's, from programs of ``WIDE_BLOCK`` rows."""
    import jax

    from synkhronos.pymc._kernel import Kernel, jax_form
    from synkhronos.pymc._pallas import WIDE_BLOCK

    x = pt.tensor("x", dtype="float64", shape=(None,))
    g = pt.tensor("g", dtype="int64", shape=(None,))
    a = pt.tensor("a", dtype="float64", shape=(groups,))
    total = (-0.5 * (x - a[g]) ** 2).sum()
    kernel = jax_form(kernel_op([a], [x, g], [total, pytensor.grad(total, a)]), interpret=interpret)
    assert isinstance(kernel, Kernel) and kernel.interpret == interpret
    rng = np.random.default_rng(n)
    xv, gv = rng.standard_normal(n), rng.integers(0, groups, n)
    av = rng.standard_normal((2, groups))
    got = jax.jit(kernel)(av, xv, gv)
    for k in range(2):
        r = xv - av[k][gv]
        np.testing.assert_allclose(np.asarray(got[0][k]), (-0.5 * r**2).sum(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(got[1][k]), np.bincount(gv, r, minlength=groups), rtol=1e-12,
                                   atol=1e-12)
    (call,) = [e for e in jax.make_jaxpr(kernel)(av, xv, gv).jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert call.outvars[0].aval.shape == (2 * (groups + 1), max(1, -(-n // WIDE_BLOCK)))
