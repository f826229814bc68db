"""``pymc_likelihood.py`` per evaluation: the ``data_parallel`` copy's logp and
gradient against PyMC's own compiled function, and the copy's three ways of
evaluating points.

- ``likelihood_rows``: PyMC's ``logp_dlogp_function`` in this process, outside
  any Synkhronos session, against the copy on each rank count; the PyMC side is
  timed before and after each session and the two averaged, so that a drift of
  the machine weighs on both sides alike.
- ``copy_per_eval`` (with ``--sample``, beside the hand-written JAX of
  ``_pymc_jax``): the copy at 1 point, at 4 points asked at once from 4 threads
  (the session's batcher runs the pending points together), and 4 points in one
  run of the ranks (the batcher's call, taken directly).
- ``kernel_on_off`` (GPU): that one run with the GPU ranks' rows kernel and
  without it.

Not a benchmark itself.  Synkhronos and PyMC are imported inside the functions.
"""

import collections
import os
import threading
import time

import numpy as np
from _common import median
from _pymc_models import build, evaluator, four_points, per_eval_ms, raveled_point

__all__ = ["copy_per_eval", "kernel_on_off", "likelihood_rows", "rows_op_of", "sizes_since"]


def rows_op_of(copy):
    """``(op, inputs)``: the ``RowsLogp`` of a ``data_parallel`` copy and what it takes."""
    from synkhronos.pymc import _loo

    return _loo.rows_op_of(copy)


def likelihood_rows(args):
    """PyMC against the copy per evaluation, for every model, row count and rank
    count of ``args``; the copy's logp is checked against PyMC's.  Each record
    also gives the copy's time over its time on the first rank count."""
    import synkhronos as synk
    from synkhronos.pymc import data_parallel

    plain_evals = args.evals if args.plain_evals is None else args.plain_evals
    records = []
    for kind in args.models:
        for rows in args.rows:
            model = build(kind, rows, args.features)
            base_fn, q = evaluator(model)
            logp_ref = base_fn(q)[0]
            first = None
            for n in args.ranks:
                base = per_eval_ms(base_fn, q, plain_evals) if plain_evals else None
                synk.fork(n, use_gpu=args.gpu)
                try:
                    copy = data_parallel(model, batch=args.batch, ranks=_ranks(args.placement, n))
                    placed = _alone_up_to(rows_op_of(copy)[0].evaluator)
                    fn, q2 = evaluator(copy)
                    assert np.array_equal(q, q2)
                    logp = fn(q)[0]
                    assert np.isclose(logp, logp_ref, rtol=1e-9), (logp, logp_ref)
                    synk_ms = per_eval_ms(fn, q, args.evals)
                finally:
                    synk.close()
                first = first or synk_ms
                pymc_ms = (base + per_eval_ms(base_fn, q, plain_evals)) / 2 if plain_evals else None
                records.append(dict(model=kind, rows=rows, ranks=n, alone_up_to=placed, pymc_ms=pymc_ms,
                                    synk_ms=synk_ms,
                                    speedup=pymc_ms and pymc_ms / synk_ms, of_one_rank=synk_ms / first,
                                    first_ranks=args.ranks[0], logp_rel_err=abs(logp / logp_ref - 1)))
                print("  %s, %d rows, %d ranks (up to %s points on one rank): PyMC %s ms, Synkhronos %.2f ms "
                      "(%.2f of %d rank(s)'s)"
                      % (kind, rows, n, placed, "%.2f" % pymc_ms if pymc_ms else "(not timed)", synk_ms,
                         synk_ms / first, args.ranks[0]), flush=True)
    return records


def _alone_up_to(served):
    """The most points a call evaluates on the master's rank alone, as text."""
    up_to = served.alone_up_to
    return "all" if up_to == float("inf") else str(up_to)


def _ranks(placement, n):
    """``data_parallel``'s ``ranks`` for ``--placement``: timed (None), every rank, or one."""
    return {"timed": None, "all": n, "one": 1}[placement]


def sizes_since(sizes, before):
    """The batcher's ``{points per run: runs}`` since ``before``, a Counter of its
    ``sizes`` taken earlier."""
    return {int(n): int(k) for n, k in sorted((collections.Counter(sizes) - before).items()) if k}


# ------------------------------------------------------------ the copy's paths
def copy_per_eval(fast, args):
    """The copy's logp+dlogp per evaluation: 1 point; 4 points from 4 threads at
    once; 4 points in one run of the ranks.  For each: ms per call (median), the
    batcher's {points per run: runs} meanwhile, and logps to check."""
    ev = rows_op_of(fast)[0].evaluator
    fn, q = evaluator(fast)
    return dict(one=_one_point(fn, q, ev.batcher.sizes, args.evals),
                threads=_four_threads(fast, four_points(q), ev.batcher.sizes, args.evals),
                one_run=_one_run(fast, ev, args.evals))


def _one_point(fn, q, sizes, evals):
    before = collections.Counter(sizes)
    return dict(ms=per_eval_ms(fn, q, evals), sizes=sizes_since(sizes, before), logp=[float(fn(q)[0])])


def _four_threads(fast, qs, sizes, evals):
    """4 threads, each its own compiled function (as nutpie's chains), asking at once."""
    fns = []
    for _ in range(4):
        f = fast.logp_dlogp_function(ravel_inputs=True)
        f.set_extra_values({})
        fns.append(f)
    logps = [float(f(p)[0]) for f, p in zip(fns, qs)]
    before = collections.Counter(sizes)
    times = _together(fns, qs, evals)
    return dict(ms=1e3 * median(times), sizes=sizes_since(sizes, before), logp=logps)


def _together(fns, points, evals):
    """Seconds of each of ``evals`` rounds in which every ``fns[i](points[i])`` runs
    in a thread of its own, all released at once: from the release until the
    last one returns."""
    start, end = (threading.Barrier(len(fns) + 1, timeout=600) for _ in range(2))
    errors = []

    def chain(f, p):
        try:
            for _ in range(evals):
                start.wait()
                f(p)
                end.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # let the others go, then raise it below
            errors.append(exc)
            start.abort()
            end.abort()

    threads = [threading.Thread(target=chain, args=(f, p), daemon=True) for f, p in zip(fns, points)]
    for t in threads:
        t.start()
    times = []
    try:
        for _ in range(evals):
            start.wait()
            t0 = time.perf_counter()
            end.wait()
            times.append(time.perf_counter() - t0)
    except threading.BrokenBarrierError as exc:
        raise (errors[0] if errors else RuntimeError("a thread of the 4-point timing stopped")) from exc
    for t in threads:
        t.join()
    return times


def _one_run(fast, ev, evals):
    """4 points in one run: the call the batcher makes with every pending point
    (``Evaluator.run``, the split terms alone: the priors are not in it),
    checked against the points one at a time."""
    points = _run_points(fast, 4)
    ms = per_eval_ms(ev.run, points, evals)
    together = ev.run(points)
    alone = [float(ev.evaluate(p)[0]) for p in points]
    err = max(abs(float(r[0]) / a - 1) for r, a in zip(together, alone))
    assert err < 1e-9, "4 points in one run differ from one at a time by %g" % err
    return dict(ms=ms, sizes={4: evals}, rel_err_vs_one_at_a_time=err, batched=bool(ev.batched))


def _run_points(fast, k):
    """``k`` points as the batcher passes them to ``Evaluator.run``."""
    from pymc.blocking import DictToArrayBijection, RaveledVars

    _, inputs = rows_op_of(fast)
    q, layout = raveled_point(fast)
    op_inputs = fast.compile_fn(fast.replace_rvs_by_values(inputs), inputs=fast.value_vars,
                                on_unused_input="ignore", point_fn=True)
    qs = [q] if k == 1 else list(four_points(q))[:k]
    return [[np.asarray(v) for v in op_inputs(DictToArrayBijection.rmap(RaveledVars(p, layout)))] for p in qs]


# ------------------------------------------------------------ GPU rows kernel
def kernel_on_off(model, fast, args):
    """One run of the ranks (1 and 4 points) with the GPU ranks' rows kernel
    (``fast``, the default) and without it (a second copy, built with
    ``SYNKHRONOS_ROWS_KERNEL=0``), calls alternated: {points: (on ms, off ms)}."""
    off = _copy_without_kernel(model, args.batch)
    out = {}
    for k in (1, 4):
        runs = [(rows_op_of(c)[0].evaluator, _run_points(c, k)) for c in (fast, off)]
        for ev, pts in runs:
            ev.run(pts)
        times = [[], []]
        for _ in range(args.evals):  # alternated, so that a drift weighs on both alike
            for i, (ev, pts) in enumerate(runs):
                t0 = time.perf_counter()
                ev.run(pts)
                times[i].append(time.perf_counter() - t0)
        on_off = [ev.run(pts) for ev, pts in runs]
        err = max(abs(float(a[0]) / float(b[0]) - 1) for a, b in zip(*on_off))
        assert err < 1e-9, "the rows kernel's logp differs from the batched graph's by %g" % err
        out[k] = (1e3 * median(times[0]), 1e3 * median(times[1]))
    return out


def _copy_without_kernel(model, batch):
    """A copy of ``model`` built with ``SYNKHRONOS_ROWS_KERNEL=0``; the environment
    is restored after."""
    from synkhronos.pymc import data_parallel
    from synkhronos.pymc._kernel import KERNEL_ENV

    before = os.environ.get(KERNEL_ENV)
    os.environ[KERNEL_ENV] = "0"
    try:
        return data_parallel(model, batch=batch)
    finally:
        if before is None:
            del os.environ[KERNEL_ENV]
        else:
            os.environ[KERNEL_ENV] = before
