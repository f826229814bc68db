"""The GPU ranks' rows kernel (``synkhronos.pymc._pallas``) at several block
sizes (rows per program), through the session: one run of the ranks of a
``data_parallel`` copy for 1 and 4 points, one GPU rank, float64.

Models (``--rows`` rows each, float64 ``pm.Data``):

* ``logistic``: a logistic regression, 5 features (7 partial sums a point:
  the log-density and its gradient);
* ``normal``: a Normal linear regression, 5 features and sigma (8);
* ``poisson``: a Poisson GLM, 5 features and an intercept (7; lgamma of each
  row's count);
* ``student_t``: a Student-t regression, 5 features, nu and sigma free (9; what
  the rows do not enter computed before the kernel);
* ``hierarchical``: ``pymc_likelihood.py``'s hierarchical logistic regression,
  an intercept per group among 20 of static shape, 3 features (25);
* ``slopes``: varying slopes, an intercept and a slope per county among 20,
  sized by the model's ``dims`` (42), with a Normal likelihood.

Each block size is one copy of the model, its kernel traced with that many
rows a program (``rows_per_program`` replaced while each copy traces), and one
more copy is built without the kernel (``SYNKHRONOS_ROWS_KERNEL=0``: the
batched graph through XLA, what GPU ranks run where the kernel does not take a
graph; block size 0 in the JSON).  The copies' calls alternate, so that a
drift of the GPU weighs on all alike; the least of ``--rounds`` medians of
``--evals`` calls.  Every copy's log-density is checked against the first's.
The table marks the block size the kernel picks by itself for each model.
Prints a table, writes JSON and a PNG
(``benchmarks/plot.py`` redraws it).  Made for a GPU (Triton); needs PyMC.
"""

import argparse
import sys
import time

import numpy as np
from _common import (
    default_out,
    gpu_name,
    machine_info,
    median,
    module_version,
    print_machine,
    table,
    write_results,
)

BLOCKS = (256, 512, 1024, 2048)
MODELS = ("logistic", "normal", "poisson", "student_t", "hierarchical", "slopes")
GROUPS = 20  # counties of the varying slopes
XLA = 0  # the "block size" of the copy without the kernel


def build(name, rows, seed=0):
    """The PyMC model ``name`` (``MODELS``) over ``rows`` rows."""
    import pymc as pm
    from _pymc_models import build as likelihood_model

    if name in ("logistic", "hierarchical"):
        return likelihood_model(name, rows, 5, seed)
    rng = np.random.default_rng(seed)
    if name in ("normal", "poisson", "student_t"):
        x = rng.standard_normal((rows, 5))
        eta = x @ np.linspace(-0.5, 0.5, 5) + 0.3
        with pm.Model() as model:
            xd = pm.Data("x", x)
            b = pm.Normal("b", 0, 1, shape=5)
            a = pm.Normal("a")
            if name == "poisson":
                pm.Poisson("y", mu=pm.math.exp(a + xd @ b), observed=rng.poisson(np.exp(eta)))
            elif name == "normal":
                pm.Normal("y", a + xd @ b, pm.HalfNormal("s"), observed=eta + rng.standard_normal(rows))
            else:
                pm.StudentT("y", nu=pm.Gamma("nu", 2, 0.1), mu=a + xd @ b, sigma=pm.HalfNormal("s"),
                            observed=eta + rng.standard_t(4, rows))
        return model
    county = rng.integers(0, GROUPS, rows)
    floor = rng.integers(0, 2, rows).astype(float)
    y = 0.3 * (county % 5) - 0.5 * floor + rng.standard_normal(rows)
    with pm.Model(coords={"county": np.arange(GROUPS)}) as model:
        c, f = pm.Data("county_idx", county), pm.Data("floor", floor)
        a = pm.Normal("a", 0, 1, dims="county")
        b = pm.Normal("b", 0, 1, dims="county")
        s = pm.Exponential("s", 1)
        pm.Normal("y", a[c] + b[c] * f, s, observed=y)
    return model


class _Blocks:
    """``rows_per_program`` of ``synkhronos.pymc._pallas`` replaced by a fixed
    block size while a copy traces, and the partial sums a point it was asked
    about (the kernel's own choice is ``chosen``)."""

    def __init__(self):
        from synkhronos.pymc import _pallas

        self.module, self.chosen, self.sums, self.block = _pallas, _pallas.rows_per_program, None, None
        _pallas.rows_per_program = self._fixed

    def _fixed(self, sums):
        self.sums = sums
        return self.block

    def restore(self):
        self.module.rows_per_program = self.chosen


def measure_model(name, args, blocks):
    """{block: {points: ms}} for model ``name``, and its partial sums a point."""
    from _pymc_per_eval import _copy_without_kernel, _run_points

    from synkhronos.pymc import data_parallel
    from synkhronos.pymc._loo import rows_op_of

    model = build(name, args.rows)
    copies = {}
    for block in args.blocks:
        blocks.block = block
        copies[block] = data_parallel(model)
    copies[XLA] = _copy_without_kernel(model, None)
    out = {b: {} for b in copies}
    for k in (1, 4):
        runs = {}
        for block, copy in copies.items():
            blocks.block = block  # (each copy traces its kernel at its first run of k points)
            runs[block] = (rows_op_of(copy)[0].evaluator, _run_points(copy, k))
            runs[block][0].run(runs[block][1])
        times = {b: [] for b in runs}
        for _ in range(args.rounds):
            calls = {b: [] for b in runs}
            for _ in range(args.evals):
                for block, (ev, pts) in runs.items():
                    t0 = time.perf_counter()
                    ev.run(pts)
                    calls[block].append(time.perf_counter() - t0)
            for b in runs:
                times[b].append(1e3 * median(calls[b]))
        logps = {b: float(np.ravel(ev.run(pts)[0][0])[0]) for b, (ev, pts) in runs.items()}
        first = logps[args.blocks[0]]
        worst = max(abs(v / first - 1) for v in logps.values())
        assert worst < 1e-10, "%s: the log-density differs across block sizes by %g" % (name, worst)
        for b in runs:
            out[b][k] = min(times[b])
    return out, blocks.sums


def measure(args):
    import jax

    import synkhronos as synk

    blocks = _Blocks()
    synk.fork(1, use_gpu=True)
    records = []
    try:
        for name in args.models:
            ms, sums = measure_model(name, args, blocks)
            chosen = blocks.chosen(sums)
            for block, by_points in ms.items():
                records.append(dict(model=name, sums=sums, block=block, chosen=block == chosen,
                                    ms_1=by_points[1], ms_4=by_points[4]))
                print("  %-12s %-20s %.3f / %.3f ms%s" % (name, _label(block), by_points[1], by_points[4],
                                                          "  (chosen)" * (block == chosen)), flush=True)
        device = str(jax.devices()[0].device_kind)
    finally:
        blocks.restore()
        synk.close()
    return records, dict(device=device, jax=jax.__version__, pymc=module_version("pymc"))


def _label(block):
    return "XLA, no kernel" if block == XLA else "%d rows a program" % block


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    p.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS))
    p.add_argument("--blocks", type=lambda s: [int(v) for v in s.split(",")], default=list(BLOCKS))
    p.add_argument("--evals", type=int, default=40, help="calls per median")
    p.add_argument("--rounds", type=int, default=2, help="medians per block size (the least kept)")
    p.add_argument("--out", default=default_out(__file__))
    args = p.parse_args(argv)
    unknown = set(args.models) - set(MODELS)
    if unknown:
        p.error("unknown models %s (known: %s)" % (sorted(unknown), ",".join(MODELS)))
    info = machine_info()
    print_machine(info)
    records, meta = measure(args)
    print("\n%s (jax %s, pymc %s), %g rows, float64 on every side; one run of the ranks, 1 GPU rank"
          % (meta["device"], meta["jax"], meta["pymc"], args.rows))
    best = {m: min(r["ms_4"] for r in records if r["model"] == m) for m in args.models}
    print(table(["model", "sums a point", "form", "1 point ms", "4 points ms", "4 points / best",
                 "chosen"],
                [[r["model"], r["sums"], _label(r["block"]), "%.3f" % r["ms_1"], "%.3f" % r["ms_4"],
                  "%.2f" % (r["ms_4"] / best[r["model"]]), "yes" if r["chosen"] else ""] for r in records]))
    write_results(args.out, dict(benchmark="rows_kernel_blocks", machine=info, gpu=gpu_name(), rows=args.rows,
                                 evals=args.evals, rounds=args.rounds, **meta, records=records))


if __name__ == "__main__":
    sys.exit(main())
