"""The models of ``pymc_likelihood.py`` and how NUTS evaluates them.

A logistic regression (``features`` features), a hierarchical logistic
regression (``GROUPS`` groups, 3 features) and a multinomial logit (3 classes,
3 features, the first class's coefficients fixed at 0) over float64
``pm.Data``; the points
NUTS passes (raveled, as ``DictToArrayBijection`` lays them out); PyMC's
``logp_dlogp_function`` on such a point, and its median time per call.  Every
part of the benchmark (per evaluation, sampling, the hand-written JAX peer)
builds on these, so that all of them measure the same models at the same points.
Not a benchmark itself; PyMC is imported inside the functions.
"""

import numpy as np
from _common import median, time_calls

__all__ = ["GROUPS", "build", "evaluator", "four_points", "make_data", "per_eval_ms", "raveled_point"]

GROUPS = 20


def make_data(kind, rows, features=5, seed=0):
    """``(x, g, y)``: the float64 features, the group of each row, the outcomes
    (0/1; a class of 3 for the multinomial logit)."""
    rng = np.random.default_rng(seed)
    k = features if kind == "logistic" else 3
    x = rng.standard_normal((rows, k))
    g = rng.integers(0, GROUPS, rows)
    if kind == "multinomial":
        eta = np.concatenate([np.zeros((rows, 1)), x @ np.linspace(-1, 1, 2 * k).reshape(k, 2)], axis=1)
        p = np.exp(eta - eta.max(axis=1, keepdims=True))
        cum = (p / p.sum(axis=1, keepdims=True)).cumsum(axis=1)
        return x, g, (rng.random((rows, 1)) > cum[:, :-1]).sum(axis=1).astype("int64")
    eta = x @ np.linspace(-1, 1, k) + (0.3 * (g % 4) if kind == "hierarchical" else 0.2)
    y = (rng.random(rows) < 1 / (1 + np.exp(-eta))).astype("int64")
    return x, g, y


def build(kind, rows, features=5, seed=0):
    """The PyMC model ``kind`` ("logistic", "hierarchical" or "multinomial") over
    ``make_data``'s rows."""
    import pymc as pm
    import pytensor.tensor as pt

    x, g, y = make_data(kind, rows, features, seed)
    k = x.shape[1]
    with pm.Model() as model:
        xd = pm.Data("x", x)
        if kind == "multinomial":
            w = pm.Normal("w", 0, 1, shape=(k, 2))
            eta = pt.concatenate([pt.zeros((xd.shape[0], 1)), xd @ w], axis=1)
            pm.Categorical("y", p=pm.math.softmax(eta, axis=1), observed=y)
            return model
        beta = pm.Normal("beta", 0, 1, shape=k)
        if kind == "logistic":
            alpha = pm.Normal("alpha", 0, 1)
        else:
            gd = pm.Data("g", g)
            sigma = pm.HalfNormal("sigma", 1)
            alpha = pm.Normal("alpha", 0, sigma, shape=GROUPS)[gd]
        pm.Bernoulli("y", logit_p=alpha + xd @ beta, observed=y)
    return model


def raveled_point(model):
    """A raveled point off the initial one (as NUTS passes them) and its layout."""
    from pymc.blocking import DictToArrayBijection

    raveled = DictToArrayBijection.map({k: v + 0.1 for k, v in model.initial_point().items()})
    return raveled.data, raveled.point_map_info


def four_points(q):
    """4 points near ``q``, one a row."""
    return q[None, :] + 0.05 * np.arange(4)[:, None]


def evaluator(model):
    """PyMC's logp+dlogp function (as NUTS calls it) and a raveled point."""
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    return fn, raveled_point(model)[0]


def per_eval_ms(fn, q, evals):
    """Median ms of ``evals`` calls ``fn(q)``, after one untimed call."""
    fn(q)  # the first call may compile
    return 1e3 * median(time_calls(lambda: fn(q), evals))
