"""A PyMC model's log-density and gradient per evaluation: PyMC's own compiled
function in one process against ``synkhronos.pymc.data_parallel`` on 1, 2, 4
ranks; with ``--sample``, samplers' wall time on the plain model and on the copy,
with the posteriors side by side, and the copy per evaluation against JAX.

Models (``--models``): a logistic regression (``--features`` features, default
5), a hierarchical logistic regression (20 groups, 3 features) and a
multinomial logit (``multinomial``: 3 classes, 3 features), over ``--rows`` rows
of float64 ``pm.Data``.  Every evaluation is PyMC's ``logp_dlogp_function`` (what NUTS
calls), on a raveled point.  The PyMC baseline is timed in this process, outside
any Synkhronos session (its default BLAS threads), before each rank count: the
speedup divides by the mean of the baselines timed next to it.  Both sides compute
in float64.

``--sample``: at ``--sample-rows`` rows, ``--chains`` chains, ``--tune`` +
``--draws`` draws and one seed, each sampler on the plain model and on the copy
(ranks: every core, or with ``--gpu`` the first of ``--ranks``), wall time with
compiling, and the worst difference between the two posterior means in posterior
SDs:

- ``pm.sample()`` with PyMC's defaults (``cores`` = min(4, cpus // 2), capped at
  the chains; PyMC's multiprocessing start method; ``--cores`` forces ``cores``):
  the copy's chains, in this process or in processes PyMC forks or spawns, all
  run on the ranks of this process's session;
- nutpie (every chain a thread of this process), if installed;
- with ``--gpu``: ``pm.sample(nuts_sampler="numpyro")`` on the plain model on the
  same GPU, with PyMC's chain_method (on one GPU numpyro runs the chains one
  after the other) and with ``chain_method="vectorized"``, each in a process of
  its own (its JAX does not share the session's; part ``numpyro-vectorized``: that one
  only); part ``numpyro-sharded``: the model in numpyro by hand, its rows sharded
  over the first ``max(--ranks)`` GPUs (``NamedSharding``, vectorized chains), the
  peer on several GPUs.  The copy refuses JAX samplers.
  On a GPU host the plain model's CPU samplers (hours at 10^7 rows) run only with
  ``--plain-cpu``; without, the copy's posteriors are compared with numpyro's.
  Each sampler's row reports its mean leapfrog steps (gradient evaluations) per
  draw after tuning.

and per evaluation, at ``--sample-rows``: the copy against the log-density a JAX
user writes by hand in ``jax.numpy`` (float64, ``jax.jit(jax.value_and_grad(...))``,
4 points with ``jax.vmap``; in a process of its own, on JAX's default device;
timed with the point and results on the device, and as a sampler on the host
calls it, the point from numpy and the results to numpy):
the copy at 1 point (``logp_dlogp_function``), at 4 points asked at once from 4
threads (each its own compiled function, as nutpie's chains; the session's
batcher runs the points pending together in one call: the points per run are
reported), and 4 points in one run of the ranks (the batcher's call, taken
directly: the split terms only, priors not included).

Needs PyMC (``pip install ".[pymc,bench]"``).  Prints tables, writes JSON and a PNG.

This page is the command line and the tables; the parts live beside it:
``_pymc_models`` (the models, their points, PyMC's function per evaluation),
``_pymc_per_eval`` (the copy per evaluation), ``_pymc_sampling`` (``--sample``),
``_pymc_jax`` (the hand-written JAX peer, ``--_jax``) and ``_plots_pymc`` (the
picture, which ``benchmarks/plot.py`` redraws from the JSON).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    default_out,
    gpu_name,
    machine_info,
    module_version,
    print_machine,
    table,
    usable_cores,
    write_results,
)
from _numpyro_sharded import numpyro_sharded_child  # noqa: E402
from _pymc_jax import jax_child  # noqa: E402
from _pymc_per_eval import likelihood_rows  # noqa: E402
from _pymc_sampling import numpyro_child, sampling  # noqa: E402

PARTS = ("pymc", "nutpie", "numpyro", "numpyro-vectorized", "numpyro-sharded", "jax-eval")


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="logistic,hierarchical", type=lambda s: s.split(","))
    p.add_argument("--rows", default="100000,1000000", type=lambda s: [int(float(v)) for v in s.split(",")])
    p.add_argument("--features", type=int, default=5, help="features of the logistic regression")
    p.add_argument("--ranks", default=None, type=lambda s: [int(v) for v in s.split(",")],
                   help="rank counts (default: 1, 2, 4 up to the cores; with --gpu: 1)")
    p.add_argument("--gpu", action="store_true", help="GPU ranks; sampling against numpyro on the GPU")
    p.add_argument("--batch", choices=("auto", "on", "off"), default="auto",
                   help="data_parallel(batch=): auto (None, the package's default), on, off; "
                        "whether the copy was batched is recorded")
    p.add_argument("--placement", choices=("timed", "all", "one"), default="timed",
                   help="where data_parallel puts the rows: as timed (its default), every rank, or one")
    p.add_argument("--evals", type=int, default=30, help="timed evaluations per setting (median)")
    p.add_argument("--plain-evals", type=int, default=None,
                   help="timed evaluations of plain PyMC per setting (default: --evals; 0: not timed, "
                        "for row counts where PyMC's single-threaded C takes seconds per evaluation)")
    p.add_argument("--sample", action="store_true", help="also time the samplers both ways")
    p.add_argument("--sample-rows", type=int, default=100_000)
    p.add_argument("--sample-parts", default=",".join(PARTS),
                   type=lambda s: [v for v in s.split(",") if v],
                   help="which of %s to run with --sample (numpyro: both ways, numpyro-vectorized: that "
                        "one; only with --gpu)" % ",".join(PARTS))
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--tune", type=int, default=1000)
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--cores", type=int, default=None,
                   help="pm.sample(cores=) (default: PyMC's, min(4, cpus // 2))")
    p.add_argument("--plain-cpu", action="store_true",
                   help="with --gpu: also sample the plain model with pm.sample and nutpie on the CPU")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/)")
    p.add_argument("--_numpyro", dest="numpyro", choices=("default", "vectorized", "sharded"),
                   help=argparse.SUPPRESS)
    p.add_argument("--_jax", dest="jax", action="store_true", help=argparse.SUPPRESS)
    return p


def _parse(argv):
    p = _parser()
    args = p.parse_args(argv)
    if args.ranks is None:
        args.ranks = [1] if args.gpu else [n for n in (1, 2, 4) if n <= usable_cores()]
    unknown = set(args.sample_parts) - set(PARTS)
    if unknown:
        p.error("--sample-parts: unknown %s (choose from %s)" % (sorted(unknown), ",".join(PARTS)))
    args.batch = {"auto": None, "on": True, "off": False}[args.batch]
    return args


def _fmt(v, f="%.1f", none="-"):
    return none if v is None else f % v


def _print_sampling(sampled, floatx):
    if not sampled:
        return
    print("sampling (wall time with compiling; precision: PyMC floatX %s, the copy's split terms %s):"
          % (floatx, sampled[0].get("copy_dtype", "-")))
    print(table(["model", "rows", "sampler", "chains", "chains run in", "plain s", "Synkhronos s", "speedup",
                 "max |dmean|/sd", "against", "steps/draw", "points:runs"],
                [[s["model"], s["rows"], s["sampler"], s["chains"], s["chains_run_in"], _fmt(s["plain_s"]),
                  _fmt(s["synk_s"], none="refused" if "numpyro" in s["sampler"] else "-"),
                  _fmt(s["speedup"], "%.2fx"), _fmt(s["max_mean_diff_in_sd"], "%.3f"), s["against"] or "-",
                  "/".join(_fmt(s[k]) for k in ("plain_steps_per_draw", "synk_steps_per_draw")),
                  " ".join("%d:%d" % kv for kv in (s["batch_sizes"] or {}).items()) or "-"]
                 for s in sampled]))
    for s in sampled:
        if s.get("vs_numpyro"):
            v = s["vs_numpyro"]
            print("  %s, %s on the copy %.1f s against %s on the plain model %.1f s: %.2fx"
                  % (s["model"], s["sampler"], s["synk_s"], v["baseline"], v["seconds"], v["ratio"]))


def _print_jax(jax_rows, sampled):
    if not jax_rows:
        return
    print("per evaluation against hand-written JAX (%s; the copy %s, %s):"
          % (jax_rows[0]["jax_dtype"], sampled[0].get("copy_dtype", "float64") if sampled else "float64",
             "batched" if jax_rows[0]["batched"] else "one point at a time on the ranks"))
    print(table(["model", "rows", "points", "JAX device", "JAX ms", "JAX from host ms", "copy path",
                 "Synkhronos ms", "JAX/Synkhronos", "JAX from host/Synkhronos", "points:runs"],
                [[r["model"], r["rows"], r["points"], r["jax_device"], "%.3f" % r["jax_ms"],
                  "%.3f" % r["jax_host_ms"], r["copy_path"], "%.3f" % r["synk_ms"],
                  "%.2fx" % r["jax_over_synk"], "%.2fx" % r["jax_host_over_synk"],
                  " ".join("%d:%d" % kv for kv in r["batch_sizes"].items())] for r in jax_rows]))


def _machine(args):
    """The machine's description, PyMC's side of it (and with ``--gpu`` the GPU's), printed."""
    import pymc
    import pytensor

    info = machine_info()
    info.update(pymc=pymc.__version__, nutpie=module_version("nutpie"),
                pytensor_blas_ldflags=pytensor.config.blas__ldflags)
    if args.gpu:
        info.update(gpu_name=gpu_name(), jax=module_version("jax"), numpyro=module_version("numpyro"))
        print("GPU %s, jax %s, numpyro %s" % (info["gpu_name"], info["jax"], info["numpyro"]))
    print_machine(info)
    print("pymc %s, nutpie %s, pytensor mode %s, floatX %s, BLAS flags %r (both sides float64 data and "
          "parameters)" % (pymc.__version__, info["nutpie"], pytensor.config.mode, pytensor.config.floatX,
                           info["pytensor_blas_ldflags"]))
    return info


def main(argv=None):
    args = _parse(argv)
    if args.numpyro:  # a child of --sample: numpyro on the plain model, or by hand with its rows sharded
        return numpyro_sharded_child(args) if args.numpyro == "sharded" else numpyro_child(args)
    if args.jax:  # a child of --sample: the hand-written JAX
        return jax_child(args)
    import pytensor

    info = _machine(args)
    records = likelihood_rows(args)
    print(table(["model", "rows", "ranks", "one rank up to", "PyMC ms", "Synkhronos ms", "speedup",
                 "ms / 1 rank's"],
                [[r["model"], r["rows"], r["ranks"], r["alone_up_to"], _fmt(r["pymc_ms"], "%.2f"),
                  "%.2f" % r["synk_ms"],
                  _fmt(r["speedup"], "%.2fx"), _fmt(r["of_one_rank"], "%.2f")] for r in records]))
    sampled, jax_rows = sampling(args) if args.sample else ([], [])
    _print_sampling(sampled, pytensor.config.floatX)
    _print_jax(jax_rows, sampled)
    write_results(args.out or default_out(__file__),
                  dict(benchmark="pymc_likelihood", machine=info, args=vars(args), likelihood=records,
                       sampling=sampled, jax_per_eval=jax_rows))


if __name__ == "__main__":
    main()
