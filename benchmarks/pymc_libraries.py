"""Models of the libraries built on PyMC, split as their users build them, on CPU
ranks: the copy's logp + gradient against PyMC's own function in this process,
with the ranks' linker as ``data_parallel`` times it and with JAX kept.

Models (each where its library is installed; the others are listed as skipped):

* ``bambi_normal``, ``bambi_bernoulli``: ``bmb.Model("c ~ x1 + x2 + (1 + x1 |
  group)", df, family=...)`` (20 groups), ``data_parallel(m.backend.model)``;
* ``betageo``, ``paretonbd``: pymc-marketing's ``BetaGeoModel`` and
  ``ParetoNBDModel`` (``m.build_model(); data_parallel(m.model)``).

For each model, in one session of ``--ranks`` CPU ranks: two copies, one built
with ``SYNKHRONOS_PYMC_LINKER=jax`` (JAX on the ranks, untimed) and one with the
linker timed (the default), each ``data_parallel``'s wall time recorded and
which linker the timed copy runs.  Then ``--rounds`` rounds of the original's
``logp_dlogp_function``, the JAX copy's and the timed copy's, alternated, each
the median of ``--evals`` calls at a point near the model's initial one.  float64 on every
side (PyMC's default).  Prints a table, writes JSON and a PNG
(``benchmarks/plot.py`` redraws it).
"""

import argparse
import logging
import os
import sys
import time
from unittest import mock

import numpy as np
from _common import default_out, machine_info, median, module_version, print_machine, table, write_results
from _pymc_models import evaluator, per_eval_ms

MODELS = ("bambi_normal", "bambi_bernoulli", "betageo", "paretonbd")


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated, of %s" % ", ".join(MODELS))
    p.add_argument("--rows", type=float, default=200_000, help="rows (customers) per model")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--evals", type=int, default=20, help="calls per median")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _bambi(family, n, seed=0):
    import bambi as bmb
    import pandas as pd

    rng = np.random.default_rng(seed)
    g = rng.integers(0, 20, n)
    x1, x2 = rng.standard_normal(n), rng.standard_normal(n)
    eta = 0.3 + 0.5 * rng.standard_normal(20)[g] + 0.8 * x1 - 0.5 * x2
    y = eta + rng.standard_normal(n) if family == "gaussian" else (rng.random(n) < 1 / (1 + np.exp(-eta)))
    df = pd.DataFrame({"c": y.astype(float) if family == "gaussian" else y.astype(int), "x1": x1, "x2": x2,
                       "group": pd.Categorical(g)})
    m = bmb.Model("c ~ x1 + x2 + (1 + x1 | group)", df, family=family)
    m.build()
    return m.backend.model


def _clv(name, n, seed=0):
    import pandas as pd
    from pymc_marketing import clv

    rng = np.random.default_rng(seed)
    t = rng.uniform(20, 60, n)
    frequency = rng.poisson(2, n).astype(float)
    recency = np.where(frequency > 0, t * rng.uniform(0, 1, n), 0.0)
    df = pd.DataFrame({"customer_id": np.arange(n), "frequency": frequency, "recency": recency, "T": t})
    m = getattr(clv, name)(data=df)
    m.build_model()
    return m.model


BUILDERS = {
    "bambi_normal": ("bambi", lambda n: _bambi("gaussian", n)),
    "bambi_bernoulli": ("bambi", lambda n: _bambi("bernoulli", n)),
    "betageo": ("pymc_marketing", lambda n: _clv("BetaGeoModel", n)),
    "paretonbd": ("pymc_marketing", lambda n: _clv("ParetoNBDModel", n)),
}


def _copy(model, linker):
    """``(copy, seconds, the ranks' linker)``: ``data_parallel`` under
    ``$SYNKHRONOS_PYMC_LINKER=linker``."""
    from synkhronos.pymc import data_parallel
    from synkhronos.pymc._linker import LINKER_ENV
    from synkhronos.pymc._loo import rows_op_of

    with mock.patch.dict(os.environ, {LINKER_ENV: linker}):
        t = time.perf_counter()
        copy = data_parallel(model)
        seconds = time.perf_counter() - t
    name = type(rows_op_of(copy)[0].evaluator.fn._core.plain.maker.linker).__name__
    return copy, seconds, {"JAXLinker": "JAX", "VMLinker": "C", "NumbaLinker": "Numba"}.get(name, name)


def _per_eval_ms(model, evals):
    """A measurement: ms per logp + gradient of ``model`` (median of ``evals``)."""
    fn, q = evaluator(model)
    return lambda: per_eval_ms(fn, q, evals)


def run_model(name, args):
    model = BUILDERS[name][1](int(args.rows))
    jax_copy, jax_s, _ = _copy(model, "jax")
    timed_copy, timed_s, chosen = _copy(model, "timed")
    sides = {"original": _per_eval_ms(model, args.evals), "copy_jax": _per_eval_ms(jax_copy, args.evals),
             "copy_timed": _per_eval_ms(timed_copy, args.evals)}
    rounds = {k: [] for k in sides}
    for _ in range(args.rounds):
        for k, measure in sides.items():
            rounds[k].append(measure())
    rec = {"model": name, "rows": int(args.rows), "linker_timed": chosen, "data_parallel_jax_s": jax_s,
           "data_parallel_timed_s": timed_s}
    for k, values in rounds.items():
        rec[k + "_ms"] = values
    rec["speedup_jax"] = median(rounds["original"]) / median(rounds["copy_jax"])
    rec["speedup_timed"] = median(rounds["original"]) / median(rounds["copy_timed"])
    return rec


def _span(values):
    return "%.2f-%.2f" % (min(values), max(values))


def main(argv=None):
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("pytensor", "jax", "numba", "arviz", "pymc", "bambi", "pymc_marketing", "synkhronos._api"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import pytensor

    import synkhronos as synk

    pytensor.config.floatX = "float64"
    info = machine_info()
    for mod in ("pymc", "bambi", "pymc_marketing", "jax"):
        info[mod] = module_version(mod)
    print_machine(info)
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in wanted if m not in BUILDERS]
    if unknown:
        sys.exit("unknown --models %s: choose among %s" % (unknown, ", ".join(MODELS)))
    import importlib.util

    runnable = [m for m in wanted if importlib.util.find_spec(BUILDERS[m][0]) is not None]
    for m in sorted(set(wanted) - set(runnable)):
        print("skipped %s: %s is not installed" % (m, BUILDERS[m][0]))
    synk.fork(n_parallel=args.ranks)
    try:
        records = [run_model(m, args) for m in runnable]
    finally:
        synk.close()
    print("\n%d CPU ranks, float64 both sides; ms per logp + gradient near the initial point, medians of %d "
          "calls, %d alternated rounds (range over rounds)" % (args.ranks, args.evals, args.rounds))
    print(table(["model", "rows", "original ms", "copy, JAX ms", "copy, timed ms", "timed chose",
                 "timed / original speedup", "data_parallel s (JAX / timed)"],
                [[r["model"], r["rows"], _span(r["original_ms"]), _span(r["copy_jax_ms"]),
                  _span(r["copy_timed_ms"]), r["linker_timed"], "%.2fx (JAX %.2fx)" % (r["speedup_timed"],
                                                                                       r["speedup_jax"]),
                  "%.1f / %.1f" % (r["data_parallel_jax_s"], r["data_parallel_timed_s"])] for r in records]))
    write_results(args.out or default_out(__file__),
                  {"benchmark": "pymc_libraries", "machine": info, "records": records,
                   "settings": {"ranks": args.ranks, "evals": args.evals, "rounds": args.rounds,
                                "rows": int(args.rows), "precision": "float64 both sides"}})


if __name__ == "__main__":
    main()
