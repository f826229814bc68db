"""Leave-one-out cross-validation of data-parallel models: ``synkhronos.pymc.loo``.

Two logistic regressions over the same 4,000 rows (millions in real use), each sampled on its
data-parallel copy; each rank computes PSIS-LOO for the rows it holds, and ArviZ compares the
models.  At this size ``az.loo`` on the original model also runs, and gives the same numbers.
"""

import arviz as az
import numpy as np
import pymc as pm

import synkhronos as synk
from synkhronos.pymc import data_parallel, loo

synk.fork(2)                                   # floatX stays float64, PyMC's precision
rng = np.random.default_rng(0)
n = 4_000
x_np = rng.standard_normal((n, 3))
y_np = (rng.random(n) < 1 / (1 + np.exp(-(x_np @ [0.5, -1.0, 0.2] + 0.3)))).astype("int64")


def logistic(features):
    with pm.Model() as model:
        x = pm.Data("x", x_np[:, :features])
        alpha = pm.Normal("alpha", 0, 1)
        beta = pm.Normal("beta", 0, 1, shape=features)
        pm.Bernoulli("y", logit_p=alpha + x @ beta, observed=y_np)
    return model


results = {}
for name, features in [("three features", 3), ("one feature", 1)]:
    model = logistic(features)
    fast = data_parallel(model)                # the rows split once over the ranks
    with fast:
        idata = pm.sample(draws=150, tune=150, chains=2, cores=1, random_seed=1, progressbar=False,
                          compute_convergence_checks=False)
    results[name] = loo(idata, fast)           # no draws x rows matrix anywhere
    if features == 3:                          # the same as ArviZ on the original model
        pm.compute_log_likelihood(idata, model=model, progressbar=False)
        expected = az.loo(idata, pointwise=True)
        assert np.allclose(results[name]["pareto_k"], expected["pareto_k"], rtol=1e-6)

print(results["three features"])
table = az.compare(results)
print(table)
assert table.index[0] == "three features"
synk.close()
print("All assertions passed.")
