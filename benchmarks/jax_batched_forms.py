"""How fast can one device evaluate K points of a logistic log-density and its
gradient in one pass over the rows?  Forms of the same function in JAX, timed
with the points and results on the device.

The batched graph that ``synkhronos.pymc`` runs for several chains' points is
PyTensor's vectorized graph, whose products JAX compiles as matrix products, as
``jax.vmap`` does.  This script measures, in one process, that form against others
a hand-written JAX function could take: the rows stored feature by feature, and
the products written as sums of per-feature elementwise products, with the
gradient written out (``X^T r`` as one sum per feature).  It is the measurement
behind the docs' note on what is left to gain on a GPU (docs/pymc.md, Chains).

Every form is checked against ``jax.vmap(jax.value_and_grad(logp))`` on the same
points (the largest relative difference is printed).  float64 on both sides
(JAX's 64-bit mode on).  Reported per K: ms per call (median of ``--reps``, each
waited for), and each form's speed against vmap.  Prints a table, writes JSON and
a PNG (``benchmarks/plot.py`` redraws it).
"""

import argparse
import sys

import numpy as np
from _common import (
    default_out,
    gpu_name,
    machine_info,
    median,
    print_machine,
    table,
    time_calls,
    write_results,
)

FEATURES = 5
FORMS = ("vmap", "rows_dot", "rows_sums", "columns_dot", "columns_sums", "columns_sums_by_hand",
         "rows_sums_pymc_by_hand", "rows_sums_numpyro_by_hand")
DESCRIPTIONS = {
    "vmap": "jax.vmap(jax.value_and_grad(logp)), rows as stored (row-major)",
    "rows_dot": "all K points as one matrix product X @ B, gradient by hand (X^T R)",
    "rows_sums": "X @ B as a sum of per-feature products, gradient by JAX",
    "columns_dot": "rows stored feature by feature (X^T), B @ X^T, gradient by JAX",
    "columns_sums": "feature-by-feature rows, sums of per-feature products, gradient by JAX",
    "columns_sums_by_hand": "feature-by-feature rows, sums of per-feature products, gradient by hand",
    "rows_sums_pymc_by_hand": "rows as stored, K x n sums as the GPU rank's graph, PyMC's Bernoulli "
                              "(a switch on y of softplus(-eta) and softplus(eta)), gradient by hand",
    "rows_sums_numpyro_by_hand": "the same, numpyro's Bernoulli (y eta - softplus(eta)), gradient by hand",
}


def _forms(jax, jnp):
    """``name -> (jitted f(Q, data, y) -> (logps, grads), wants_columns)``."""
    from jax.nn import sigmoid, softplus

    d = FEATURES

    def logp(q, x, y):  # beta (d), alpha; standard normal priors; Bernoulli(logit_p=alpha + x @ beta)
        eta = q[d] + x @ q[:d]
        return jnp.sum(-0.5 * q ** 2) + jnp.sum(y * eta - softplus(eta))

    def by_rows_sums(q, x, y):
        eta = q[None, :, d]
        for j in range(d):
            eta = eta + x[:, j, None] * q[None, :, j]
        return jnp.sum(-0.5 * q ** 2, 1) + jnp.sum(y[:, None] * eta - softplus(eta), 0)

    def by_columns(q, xt, y, sums):
        if sums:
            eta = q[:, d, None]
            for j in range(d):
                eta = eta + q[:, j, None] * xt[j][None, :]
        else:
            eta = q[:, :d] @ xt + q[:, d, None]
        return eta, jnp.sum(-0.5 * q ** 2, 1) + jnp.sum(y[None] * eta - softplus(eta), 1)

    def rows_dot(q, x, y):
        eta = x @ q[:, :d].T + q[:, d]
        r = y[:, None] - sigmoid(eta)
        lp = jnp.sum(-0.5 * q ** 2, 1) + jnp.sum(y[:, None] * eta - softplus(eta), 0)
        return lp, jnp.concatenate([(x.T @ r).T, jnp.sum(r, 0)[:, None]], 1) - q

    def columns_sums_by_hand(q, xt, y):
        eta, lp = by_columns(q, xt, y, True)
        r = y[None] - sigmoid(eta)
        g = jnp.stack([jnp.sum(r * xt[j][None], 1) for j in range(d)] + [jnp.sum(r, 1)], 1)
        return lp, g - q

    def rows_sums_by_hand(q, x, y, pymc):
        eta = q[:, d, None]
        for j in range(d):
            eta = eta + q[:, j, None] * x[:, j][None, :]
        one = (y == 1)[None, :]
        if pymc:  # the terms PyMC's graph holds once stabilized, each branch computed
            terms = jnp.where(one, -softplus(-eta), -softplus(eta))
            r = jnp.where(one, sigmoid(-eta), -sigmoid(eta))
        else:
            terms = y[None] * eta - softplus(eta)
            r = y[None] - sigmoid(eta)
        g = jnp.stack([jnp.sum(r * x[:, j][None], 1) for j in range(d)] + [jnp.sum(r, 1)], 1)
        return jnp.sum(-0.5 * q ** 2, 1) + jnp.sum(terms, 1), g - q

    def with_grad(f):
        return lambda q, data, y: (f(q, data, y), jax.grad(lambda q: f(q, data, y).sum())(q))

    return {
        "vmap": (jax.jit(jax.vmap(jax.value_and_grad(logp), in_axes=(0, None, None))), False),
        "rows_dot": (jax.jit(rows_dot), False),
        "rows_sums": (jax.jit(with_grad(by_rows_sums)), False),
        "columns_dot": (jax.jit(with_grad(lambda q, xt, y: by_columns(q, xt, y, False)[1])), True),
        "columns_sums": (jax.jit(with_grad(lambda q, xt, y: by_columns(q, xt, y, True)[1])), True),
        "columns_sums_by_hand": (jax.jit(columns_sums_by_hand), True),
        "rows_sums_pymc_by_hand": (jax.jit(lambda q, x, y: rows_sums_by_hand(q, x, y, True)), False),
        "rows_sums_numpyro_by_hand": (jax.jit(lambda q, x, y: rows_sums_by_hand(q, x, y, False)), False),
    }


def _time(jax, f, args, reps):
    out = jax.block_until_ready(f(*args))  # compiles
    return median(time_calls(lambda: jax.block_until_ready(f(*args)), reps)) * 1e3, out


def _rel_err(got, ref):
    (v, g), (rv, rg) = [tuple(np.asarray(a) for a in pair) for pair in (got, ref)]
    return float(max(np.max(np.abs(v - rv) / np.abs(rv)), np.max(np.abs(g - rg) / (np.abs(rg) + 1))))


def measure(args):
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, FEATURES))
    eta = x @ np.linspace(-1, 1, FEATURES) + 0.2
    y = (rng.random(args.rows) < 1 / (1 + np.exp(-eta))).astype(np.float64)
    rows, columns, yd = jax.device_put(x), jax.device_put(np.ascontiguousarray(x.T)), jax.device_put(y)
    forms = _forms(jax, jnp)
    records = []
    for k in args.points:
        q = jax.device_put(0.1 + 0.05 * rng.standard_normal((k, FEATURES + 1)))
        ref = None
        for name in FORMS:
            f, wants_columns = forms[name]
            ms, out = _time(jax, f, (q, columns if wants_columns else rows, yd), args.reps)
            ref = out if ref is None else ref
            records.append(dict(form=name, points=k, ms=ms, rel_err=_rel_err(out, ref)))
    dev = jax.devices()[0]
    return records, dict(device=str(dev), platform=dev.platform, jax=jax.__version__,
                         x64=bool(jax.config.jax_enable_x64), dtype=str(x.dtype))


def _table_rows(records):
    vmap = {r["points"]: r["ms"] for r in records if r["form"] == "vmap"}
    return [[r["form"], r["points"], "%.3f" % r["ms"], "%.3f" % (r["ms"] / r["points"]),
             "%.2fx" % (vmap[r["points"]] / r["ms"]), "%.1e" % r["rel_err"]] for r in records]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    p.add_argument("--points", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 4, 8])
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--out", default=default_out(__file__))
    args = p.parse_args(argv)
    info = machine_info()
    print_machine(info)
    records, meta = measure(args)
    print("device %s (jax %s, 64-bit mode %s), %g x %d %s rows; every form against vmap on the same points"
          % (meta["device"], meta["jax"], meta["x64"], args.rows, FEATURES, meta["dtype"]))
    print(table(["form", "points", "ms", "ms per point", "vs vmap", "max rel diff"], _table_rows(records)))
    for name in FORMS:
        print("  %-21s %s" % (name, DESCRIPTIONS[name]))
    write_results(args.out, dict(benchmark="jax_batched_forms", machine=info, gpu=gpu_name(), rows=args.rows,
                                 features=FEATURES, reps=args.reps, forms=DESCRIPTIONS, **meta,
                                 records=records))


if __name__ == "__main__":
    sys.exit(main())
