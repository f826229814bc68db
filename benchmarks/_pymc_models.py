"""The models of ``pymc_likelihood.py`` and how NUTS evaluates them.

A logistic regression (``features`` features) and a hierarchical logistic
regression (``GROUPS`` groups, 3 features) over float64 ``pm.Data``; the points
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
    """``(x, g, y)``: the float64 features, the group of each row, the 0/1 outcomes."""
    rng = np.random.default_rng(seed)
    k = features if kind == "logistic" else 3
    x = rng.standard_normal((rows, k))
    g = rng.integers(0, GROUPS, rows)
    eta = x @ np.linspace(-1, 1, k) + (0.3 * (g % 4) if kind == "hierarchical" else 0.2)
    y = (rng.random(rows) < 1 / (1 + np.exp(-eta))).astype("int64")
    return x, g, y


def build(kind, rows, features=5, seed=0):
    """The PyMC model ``kind`` ("logistic" or "hierarchical") over ``make_data``'s rows."""
    import pymc as pm

    x, g, y = make_data(kind, rows, features, seed)
    k = x.shape[1]
    with pm.Model() as model:
        xd = pm.Data("x", x)
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
