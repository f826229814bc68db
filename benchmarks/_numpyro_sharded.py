"""``pymc_likelihood.py --sample``'s fair peer on several GPUs: the model written
in numpyro by hand, its rows sharded over the GPUs.

What a JAX user with N GPUs would write instead of the ``data_parallel`` copy:
the same priors and likelihood in ``numpyro`` (float64), the data placed once
with ``jax.sharding.NamedSharding`` so that each GPU holds a block of rows, and
NUTS with ``chain_method="vectorized"`` (every chain in one program, which XLA
partitions over the GPUs along the rows), the data passed to the compiled
program as arguments (``jit_model_args=True``: closed over, as by default, JAX
captures them as constants of the program, and on 4 GPUs at 10^8 rows it ran no
faster than on one).  ``numpyro_sharded_child`` runs in a
process of its own (``pymc_likelihood.py --_numpyro sharded``), on the first
``max(--ranks)`` GPUs, and prints one ``@@RESULT`` JSON line as the other
numpyro child does.

Not a benchmark itself.  JAX and numpyro are imported inside the functions.
"""

import json
import time

import numpy as np
from _pymc_models import GROUPS, make_data

__all__ = ["numpyro_sharded_child"]


def _model(kind):
    """The model of ``_pymc_models.build`` in numpyro: same names, priors, likelihood."""
    import numpyro
    import numpyro.distributions as dist

    def model(x, g, y):
        beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        if kind == "logistic":
            eta = numpyro.sample("alpha", dist.Normal(0.0, 1.0)) + x @ beta
        else:
            sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
            alpha = numpyro.sample("alpha", dist.Normal(0.0, sigma).expand([GROUPS]).to_event(1))
            eta = alpha[g] + x @ beta
        numpyro.sample("y", dist.Bernoulli(logits=eta), obs=y)

    return model


def _sharded(arrays, devices):
    """``arrays`` placed on ``devices``, each holding a block of rows."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(devices), ("rows",))
    return [jax.device_put(a, NamedSharding(mesh, PartitionSpec("rows", *([None] * (a.ndim - 1)))))
            for a in arrays]


def numpyro_sharded_child(args):
    """NUTS on the hand-written model, rows sharded over ``max(args.ranks)`` GPUs:
    wall time (with compiling), posterior summary, leapfrog steps per draw."""
    import numpyro

    numpyro.enable_x64()
    import jax
    from numpyro.infer import MCMC, NUTS

    kind, rows = args.models[0], args.sample_rows
    devices = jax.devices()[:max(args.ranks)]
    if rows % len(devices):
        raise SystemExit("--sample-rows %d: the sharded numpyro peer needs a multiple of %d GPUs"
                         % (rows, len(devices)))
    x, g, y = make_data(kind, rows, args.features)
    x, g, y = _sharded([x, g, y], devices)
    mcmc = MCMC(NUTS(_model(kind)), num_warmup=args.tune, num_samples=args.draws, num_chains=args.chains,
                chain_method="vectorized", progress_bar=False, jit_model_args=True)
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(1), x, g, y, extra_fields=("num_steps",))
    samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    seconds = time.perf_counter() - t0
    summary = {}
    for name in ("alpha", "beta", "sigma"):
        if name in samples:
            s = np.asarray(samples[name]).reshape(args.chains * args.draws, -1)
            summary[name] = (s.mean(0).tolist(), s.std(0, ddof=1).tolist())
    steps = float(np.mean(np.asarray(mcmc.get_extra_fields()["num_steps"])))
    print("@@RESULT " + json.dumps(dict(
        seconds=seconds, summary=summary, steps=steps, devices=[str(d) for d in devices],
        x64=bool(jax.config.jax_enable_x64), dtype=str(np.asarray(samples["beta"]).dtype),
        sharding=str(x.sharding))))
