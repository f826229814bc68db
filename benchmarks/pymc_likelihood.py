"""A PyMC model's log-density and gradient per evaluation: PyMC's own compiled
function in one process against ``synkhronos.pymc.data_parallel`` on 1, 2, 4
ranks; optionally ``pm.sample`` wall time both ways with the posteriors side by side.

Models: a logistic regression (5 features) and a hierarchical logistic regression
(20 groups, 3 features), over ``--rows`` rows of float64 ``pm.Data``.  Every
evaluation is PyMC's ``logp_dlogp_function`` (what NUTS calls), on a raveled point.
The PyMC baseline is timed in this process, outside any Synkhronos session (its
default BLAS threads), before each rank count: the speedup divides by the mean of
the baselines timed next to it.  Both sides compute in float64.

``--gpu`` puts the copy's ranks on GPUs (default one).  With ``--sample`` the
baseline is then what a PyMC user with a GPU picks today,
``pm.sample(nuts_sampler="numpyro")`` on the same GPU (in a process of its own, so
that its JAX does not share the session's), with PyMC's other defaults.

Needs PyMC (``pip install ".[pymc,bench]"``).  Prints a table, writes JSON and a PNG.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    _version,
    default_out,
    gpu_name,
    machine_info,
    median,
    print_machine,
    table,
    usable_cores,
)


def build(kind, rows, seed=0):
    import pymc as pm

    rng = np.random.default_rng(seed)
    k = 5 if kind == "logistic" else 3
    x = rng.standard_normal((rows, k))
    g = rng.integers(0, 20, rows)
    eta = x @ np.linspace(-1, 1, k) + (0.3 * (g % 4) if kind == "hierarchical" else 0.2)
    y = (rng.random(rows) < 1 / (1 + np.exp(-eta))).astype("int64")
    with pm.Model() as model:
        xd = pm.Data("x", x)
        beta = pm.Normal("beta", 0, 1, shape=k)
        if kind == "logistic":
            alpha = pm.Normal("alpha", 0, 1)
        else:
            gd = pm.Data("g", g)
            sigma = pm.HalfNormal("sigma", 1)
            alpha = pm.Normal("alpha", 0, sigma, shape=20)[gd]
        pm.Bernoulli("y", logit_p=alpha + xd @ beta, observed=y)
    return model


def evaluator(model):
    """PyMC's logp+dlogp function (as NUTS calls it) and a raveled point."""
    from pymc.blocking import DictToArrayBijection

    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    point = {k: v + 0.1 for k, v in model.initial_point().items()}
    return fn, DictToArrayBijection.map(point).data


def per_eval_ms(fn, q, evals):
    fn(q)  # the first call may compile
    times = []
    for _ in range(evals):
        t0 = time.perf_counter()
        fn(q)
        times.append(time.perf_counter() - t0)
    return 1e3 * median(times)


def likelihood_rows(args):
    import synkhronos as synk
    from synkhronos.pymc import data_parallel

    records = []
    for kind in args.models:
        for rows in args.rows:
            model = build(kind, rows)
            base_fn, q = evaluator(model)
            logp_ref = base_fn(q)[0]
            for n in args.ranks:
                base = per_eval_ms(base_fn, q, args.evals)
                synk.fork(n, use_gpu=args.gpu)
                try:
                    fn, q2 = evaluator(data_parallel(model))
                    assert np.array_equal(q, q2)
                    logp = fn(q)[0]
                    assert np.isclose(logp, logp_ref, rtol=1e-9), (logp, logp_ref)
                    synk_ms = per_eval_ms(fn, q, args.evals)
                finally:
                    synk.close()
                base_after = per_eval_ms(base_fn, q, args.evals)
                pymc_ms = (base + base_after) / 2
                records.append(dict(model=kind, rows=rows, ranks=n, pymc_ms=pymc_ms, synk_ms=synk_ms,
                                    speedup=pymc_ms / synk_ms, logp_rel_err=abs(logp / logp_ref - 1)))
                print("  %s, %d rows, %d ranks: PyMC %.2f ms, Synkhronos %.2f ms (%.2fx)"
                      % (kind, rows, n, pymc_ms, synk_ms, pymc_ms / synk_ms), flush=True)
    return records


def _summary(idata):
    post = idata.posterior
    return {name: (post[name].mean(("chain", "draw")).values.ravel().tolist(),
                   post[name].std(("chain", "draw")).values.ravel().tolist())
            for name in post.data_vars}


def _sample_opts(args):
    return dict(draws=args.draws, tune=args.tune, chains=2, random_seed=1, progressbar=False,
                compute_convergence_checks=False)


def numpyro_child(args):
    """``pm.sample(nuts_sampler="numpyro")`` on the GPU: wall time and posterior summary."""
    import pymc as pm

    model = build(args.models[0], args.sample_rows)
    t0 = time.perf_counter()
    idata = pm.sample(model=model, nuts_sampler="numpyro", **_sample_opts(args))
    print("@@NUMPYRO " + json.dumps({"seconds": time.perf_counter() - t0, "summary": _summary(idata)}))


def _numpyro_baseline(args, kind):
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--_numpyro", "--models", kind, "--sample-rows",
           str(args.sample_rows), "--tune", str(args.tune), "--draws", str(args.draws)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@NUMPYRO ")]
    if proc.returncode or not lines:
        raise RuntimeError("numpyro run failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
    res = json.loads(lines[-1][10:])
    return res["seconds"], res["summary"]


def sampling(args):
    """``pm.sample`` with PyMC's defaults (with ``--gpu``: its numpyro sampler)
    against the data-parallel copy (chains in this process: ``cores=1``), same
    draws and seed."""
    import pymc as pm

    import synkhronos as synk
    from synkhronos.pymc import data_parallel

    out = []
    for kind in args.models:
        model = build(kind, args.sample_rows)
        opts = _sample_opts(args)
        if args.gpu:
            t_plain, a = _numpyro_baseline(args, kind)
        else:
            t0 = time.perf_counter()
            a = _summary(pm.sample(model=model, **opts))
            t_plain = time.perf_counter() - t0
        synk.fork(args.ranks[0] if args.gpu else None, use_gpu=args.gpu)
        try:
            fast = data_parallel(model)
            t0 = time.perf_counter()
            split = pm.sample(model=fast, cores=1, **opts)
            t_synk = time.perf_counter() - t0
        finally:
            synk.close()
        b = _summary(split)
        worst = max(abs(m1 - m2) / s1 for k in a for m1, s1, m2 in zip(a[k][0], a[k][1], b[k][0]))
        baseline = "numpyro, GPU" if args.gpu else "PyMC defaults"
        out.append(dict(model=kind, rows=args.sample_rows, baseline=baseline, pymc_s=t_plain, synk_s=t_synk,
                        speedup=t_plain / t_synk, max_mean_diff_in_sd=worst, pymc=a, synk=b))
        print("  pm.sample %s, %d rows: %s %.1f s, Synkhronos cores=1 %.1f s (%.2fx); "
              "max |mean difference| %.3f posterior SD"
              % (kind, args.sample_rows, baseline, t_plain, t_synk, t_plain / t_synk, worst), flush=True)
    return out


def draw(records, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["model"] for r in records})
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for rows in sorted({r["rows"] for r in records if r["model"] == kind}):
            rs = [r for r in records if r["model"] == kind and r["rows"] == rows]
            ax.plot([r["ranks"] for r in rs], [r["speedup"] for r in rs], "o-", label="%g rows" % rows)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xticks(sorted({r["ranks"] for r in records}))
        ax.set(title="%s: logp+dlogp vs PyMC, one process" % kind, xlabel="ranks",
               ylabel="speedup (PyMC ms / Synkhronos ms)")
        ax.legend()
    fig.suptitle("PyMC logp+dlogp per evaluation, float64 both sides (%d usable cores)"
                 % usable_cores(), fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = usable_cores()
    p.add_argument("--models", default="logistic,hierarchical", type=lambda s: s.split(","))
    p.add_argument("--rows", default="100000,1000000", type=lambda s: [int(float(v)) for v in s.split(",")])
    p.add_argument("--ranks", default=None, type=lambda s: [int(v) for v in s.split(",")],
                   help="rank counts (default: 1, 2, 4 up to the cores; with --gpu: 1)")
    p.add_argument("--gpu", action="store_true", help="GPU ranks; pm.sample against numpyro on the GPU")
    p.add_argument("--evals", type=int, default=30, help="timed evaluations per setting (median)")
    p.add_argument("--sample", action="store_true", help="also time pm.sample both ways")
    p.add_argument("--sample-rows", type=int, default=100_000)
    p.add_argument("--tune", type=int, default=1000)
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/)")
    p.add_argument("--_numpyro", dest="numpyro", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ranks is None:
        args.ranks = [1] if args.gpu else [n for n in (1, 2, 4) if n <= cores]
    return args


def main(argv=None):
    args = _parse(argv)
    if args.numpyro:
        return numpyro_child(args)
    import pymc
    import pytensor

    info = machine_info()
    info["pymc"] = pymc.__version__
    if args.gpu:
        info.update(gpu_name=gpu_name(), jax=_version("jax"), numpyro=_version("numpyro"))
        print("GPU %s, jax %s, numpyro %s" % (info["gpu_name"], info["jax"], info["numpyro"]))
    print_machine(info)
    print("pymc %s, pytensor mode %s, floatX %s (both sides float64 data and parameters)"
          % (pymc.__version__, pytensor.config.mode, pytensor.config.floatX))
    records = likelihood_rows(args)
    print(table(["model", "rows", "ranks", "PyMC ms", "Synkhronos ms", "speedup"],
                [[r["model"], r["rows"], r["ranks"], "%.2f" % r["pymc_ms"], "%.2f" % r["synk_ms"],
                  "%.2fx" % r["speedup"]] for r in records]))
    sampled = sampling(args) if args.sample else []
    if sampled:
        print(table(["model", "rows", "baseline", "baseline s", "Synkhronos s (cores=1)", "speedup",
                     "max |dmean|/sd"],
                    [[s["model"], s["rows"], s["baseline"], "%.1f" % s["pymc_s"], "%.1f" % s["synk_s"],
                      "%.2fx" % s["speedup"], "%.3f" % s["max_mean_diff_in_sd"]] for s in sampled]))
    out = args.out or default_out(__file__)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(machine=info, args=vars(args), likelihood=records, sampling=sampled), f, indent=1)
    png = os.path.splitext(out)[0] + ".png"
    draw(records, png)
    print("wrote %s and %s" % (out, png))


if __name__ == "__main__":
    main()
