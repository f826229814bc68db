"""PSIS-LOO of a data-parallel copy on the ranks (``synkhronos.pymc.loo``)
against what a PyMC user runs on the original model (``pm.compute_log_likelihood``
then ``az.loo``), on the logistic regression of ``pymc_likelihood.py``
(``features`` float64 features in ``pm.Data``).

The posterior is not sampled (at 10^7 rows that alone would take minutes): each
chain's draws are an AR(1) series around the coefficients the data were drawn
from, so the draws are autocorrelated and ``reff`` is not 1, as after NUTS.
Both sides read the same ``idata``.

Per row count, reported: ``loo`` on the copy, its first call (which builds and
compiles the ranks' functions) and a second one; where the original's draws x
rows matrix stays within ``--compare-gb``, ``pm.compute_log_likelihood`` and
``az.loo`` on the original, and the largest relative difference of the ELPD,
its SE, ``p_loo`` and of every row's Pareto k; and this process's peak resident
memory after each side (``ru_maxrss``; the original runs last, so its peak
includes the copy's).  float64 on both sides.  Prints a table, writes JSON and
a PNG (``benchmarks/plot.py`` redraws it).

Run ``python benchmarks/pymc_loo.py --gpu --rows 1e6,1e7 --draws 4000``.
"""

import argparse
import contextlib
import io
import resource
import sys
import time

import numpy as np
from _common import default_out, gpu_name, machine_info, print_machine, table, write_results
from _pymc_models import build, make_data


def _posterior(features, chains, draws, seed=0):
    """AR(1) draws of the logistic model's free variables around the truth."""
    rng = np.random.default_rng(seed)
    truth = {"alpha": np.float64(0.2), "beta": np.linspace(-1, 1, features)}

    def series(center):
        center = np.asarray(center, dtype=float)
        x = np.empty((chains, draws) + center.shape)
        x[:, 0] = rng.standard_normal((chains,) + center.shape)
        for t in range(1, draws):
            x[:, t] = 0.6 * x[:, t - 1] + 0.8 * rng.standard_normal((chains,) + center.shape)
        return center + 0.002 * x

    return {name: series(center) for name, center in truth.items()}


def _idata(posterior):
    import arviz as az

    if int(az.__version__.split(".")[0]) == 0:
        return az.from_dict(posterior=posterior)
    import arviz_base

    return arviz_base.from_dict({"posterior": posterior})


def _totals(result):
    """(elpd, se, p_loo, every row's k) of either ArviZ's ELPD object."""
    if hasattr(result, "elpd"):
        return result.elpd, result.se, result.p, np.asarray(result.pareto_k).ravel()
    return result["elpd_loo"], result["se"], result["p_loo"], np.asarray(result["pareto_k"]).ravel()


def _peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def run_rows(rows, args):
    """One row count: the copy's ``loo`` twice, then the original's where it fits."""
    import arviz as az
    import pymc as pm

    from synkhronos.pymc import data_parallel, loo

    model = build("logistic", rows, args.features)
    idata = _idata(_posterior(args.features, args.chains, args.draws))
    copy, split_s = _timed(lambda: data_parallel(model))
    ours, first_s = _timed(lambda: loo(idata, copy, pointwise=True, chunk_rows=args.chunk_rows))
    _, again_s = _timed(lambda: loo(idata, copy, pointwise=True, chunk_rows=args.chunk_rows))
    rec = {"rows": rows, "draws": args.draws * args.chains, "data_parallel_s": split_s,
           "loo_first_s": first_s, "loo_again_s": again_s, "peak_rss_mb_copy": _peak_mb()}
    matrix_gb = rows * args.draws * args.chains * 8 / 1e9
    if matrix_gb <= args.compare_gb:
        _, ll_s = _timed(lambda: pm.compute_log_likelihood(idata, model=model, progressbar=False))
        theirs, az_s = _timed(lambda: az.loo(idata, pointwise=True))
        a, b = _totals(ours), _totals(theirs)
        rel = [abs(x - y) / abs(y) for x, y in zip(a[:3], b[:3])]
        k_rel = float(np.max(np.abs(a[3] - b[3]) / np.maximum(np.abs(b[3]), 1e-12)))
        rec.update(original_loglik_s=ll_s, original_az_loo_s=az_s, peak_rss_mb_original=_peak_mb(),
                   max_rel_diff_totals=float(max(rel)), max_rel_diff_k=k_rel)
    else:
        rec["original_skipped"] = "the draws x rows matrix is %.1f GB (over --compare-gb %.1f)" % (
            matrix_gb, args.compare_gb)
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="GPU ranks (default: CPU workers)")
    p.add_argument("--ranks", type=int, default=None, help="ranks (default: fork()'s)")
    p.add_argument("--rows", default="1e5", help="comma-separated row counts")
    p.add_argument("--draws", type=int, default=1000, help="draws per chain")
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--features", type=int, default=5)
    p.add_argument("--chunk-rows", type=int, default=None, help="loo's chunk_rows (default: loo's)")
    p.add_argument("--compare-gb", type=float, default=2.0,
                   help="run the original where its draws x rows matrix is at most this many GB")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/pymc_loo.json)")
    args = p.parse_args()
    rows = [int(float(r)) for r in args.rows.split(",")]

    import pytensor

    import synkhronos as synk

    if pytensor.config.floatX != "float64":
        sys.exit("float64 is the point of the comparison: run with floatX=float64 (PyTensor's default)")
    info = machine_info()
    if args.gpu:
        info["gpu_name"] = gpu_name()
    print_machine(info)
    make_data("logistic", 10)  # fail early on a missing dependency
    with contextlib.redirect_stdout(io.StringIO()):
        synk.fork(args.ranks, use_gpu=args.gpu)
    info["ranks"] = synk.n_parallel()
    if args.gpu:
        info["gpus"] = len(synk.gpus())
    records = []
    try:
        for n in rows:
            records.append(run_rows(n, args))
            print("rows %d done" % n, flush=True)
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            synk.close()
    print("\nPSIS-LOO, logistic regression with %d features, %d chains x %d draws, float64 both sides, "
          "%s ranks (%s)" % (args.features, args.chains, args.draws, info["ranks"],
                             "GPU" if args.gpu else "CPU"))
    fmt = lambda v: "-" if v is None else "%.2f" % v  # noqa: E731
    print(table(["rows", "data_parallel s", "loo first s", "loo again s", "peak MB", "original loglik s",
                 "az.loo s", "peak MB after", "max rel diff totals / k"],
                [[r["rows"], fmt(r["data_parallel_s"]), fmt(r["loo_first_s"]), fmt(r["loo_again_s"]),
                  "%.0f" % r["peak_rss_mb_copy"], fmt(r.get("original_loglik_s")),
                  fmt(r.get("original_az_loo_s")),
                  "%.0f" % r["peak_rss_mb_original"] if "peak_rss_mb_original" in r else "-",
                  "%.1e / %.1e" % (r["max_rel_diff_totals"], r["max_rel_diff_k"]) if "max_rel_diff_k" in r
                  else r["original_skipped"]] for r in records]))
    write_results(args.out or default_out(__file__),
                  {"benchmark": "pymc_loo", "machine": info, "gpu": args.gpu, "settings": vars(args),
                   "records": records})


if __name__ == "__main__":
    main()
