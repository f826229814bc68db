"""A PyMC model's likelihood, data-parallel: ``synkhronos.pymc.data_parallel``.

A hierarchical logistic regression over 5,000 rows (millions in real use).  The returned copy gives the
same log-density and gradient as the original, and PyMC's own functions take it: sampling, posterior
predictive draws, the log-likelihood per row.
"""

import numpy as np
import pymc as pm

import synkhronos as synk
from synkhronos.pymc import data_parallel

synk.fork(2)                                   # floatX stays float64, PyMC's precision
rng = np.random.default_rng(0)
n, groups = 5_000, 8
x_np = rng.standard_normal((n, 3))
g_np = rng.integers(0, groups, n)
y_np = (rng.random(n) < 1 / (1 + np.exp(-(x_np @ [0.5, -1.0, 0.2] + 0.3 * (g_np % 3))))).astype("int64")

with pm.Model() as model:
    x = pm.Data("x", x_np)
    g = pm.Data("g", g_np)
    beta = pm.Normal("beta", 0, 1, shape=3)
    sigma = pm.HalfNormal("sigma", 1)
    alpha = pm.Normal("alpha", 0, sigma, shape=groups)
    pm.Bernoulli("y", logit_p=alpha[g] + x @ beta, observed=y_np)

fast = data_parallel(model)                    # the rows of x, g and y split once over the ranks

point = model.initial_point()
point = {k: v + rng.normal(0, 0.1, v.shape) for k, v in point.items()}
assert np.isclose(fast.compile_logp()(point), model.compile_logp()(point), rtol=1e-9)
assert np.allclose(fast.compile_dlogp()(point), model.compile_dlogp()(point), rtol=1e-9)

with fast:                                     # chains in this process, each step on every rank
    idata = pm.sample(draws=150, tune=150, chains=2, cores=1, random_seed=1, progressbar=False,
                      compute_convergence_checks=False)
assert abs(idata.posterior["beta"].mean(("chain", "draw")).values - [0.5, -1.0, 0.2]).max() < 0.15
# The copy's y is still an observed variable: drawn here with the original's graph (the same
# numbers under the same seed), its log-density per row computed on the ranks.
ppc = pm.sample_posterior_predictive(idata, model=fast, random_seed=2, progressbar=False)
same = pm.sample_posterior_predictive(idata, model=model, random_seed=2, progressbar=False)
assert np.array_equal(ppc.posterior_predictive["y"], same.posterior_predictive["y"])
loglik = pm.compute_log_likelihood(idata, model=fast, extend_inferencedata=False, progressbar=False)
expected = pm.compute_log_likelihood(idata, model=model, extend_inferencedata=False, progressbar=False)
assert loglik["y"].shape == (2, 150, n) and np.allclose(loglik["y"], expected["y"], rtol=1e-9)
synk.close()
print("All assertions passed.")
