"""A PyMC model's log-density and gradient per evaluation: PyMC's own compiled
function in one process against ``synkhronos.pymc.data_parallel`` on 1, 2, 4
ranks; with ``--sample``, samplers' wall time on the plain model and on the copy,
with the posteriors side by side, and the copy per evaluation against JAX.

Models: a logistic regression (``--features`` features, default 5) and a
hierarchical logistic regression (20 groups, 3 features), over ``--rows`` rows of
float64 ``pm.Data``.  Every evaluation is PyMC's ``logp_dlogp_function`` (what NUTS
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
  only).  The copy refuses JAX samplers.
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
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
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

PARTS = ("pymc", "nutpie", "numpyro", "numpyro-vectorized", "jax-eval")
GROUPS = 20


def make_data(kind, rows, features=5, seed=0):
    """``(x, g, y)``: the float64 features, the group of each row, the 0/1 outcomes."""
    rng = np.random.default_rng(seed)
    k = features if kind == "logistic" else 3
    x = rng.standard_normal((rows, k))
    g = rng.integers(0, GROUPS, rows)
    eta = x @ np.linspace(-1, 1, k) + (0.3 * (g % 4) if kind == "hierarchical" else 0.2)
    y = (rng.random(rows) < 1 / (1 + np.exp(-eta))).astype("int64")
    return x, g, y


def build(kind, rows, features=5, seed=0):
    import pymc as pm

    x, g, y = make_data(kind, rows, features, seed)
    k = x.shape[1]
    with pm.Model() as model:
        xd = pm.Data("x", x)
        beta = pm.Normal("beta", 0, 1, shape=k)
        if kind == "logistic":
            alpha = pm.Normal("alpha", 0, 1)
        else:
            gd = pm.Data("g", g)
            sigma = pm.HalfNormal("sigma", 1)
            alpha = pm.Normal("alpha", 0, sigma, shape=GROUPS)[gd]
        pm.Bernoulli("y", logit_p=alpha + xd @ beta, observed=y)
    return model


def _point(model):
    """A raveled point off the initial one (as NUTS passes them) and its layout."""
    from pymc.blocking import DictToArrayBijection

    raveled = DictToArrayBijection.map({k: v + 0.1 for k, v in model.initial_point().items()})
    return raveled.data, raveled.point_map_info


def _four(q):
    """4 points near ``q``, one a row."""
    return q[None, :] + 0.05 * np.arange(4)[:, None]


def evaluator(model):
    """PyMC's logp+dlogp function (as NUTS calls it) and a raveled point."""
    fn = model.logp_dlogp_function(ravel_inputs=True)
    fn.set_extra_values({})
    return fn, _point(model)[0]


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
            model = build(kind, rows, args.features)
            base_fn, q = evaluator(model)
            logp_ref = base_fn(q)[0]
            for n in args.ranks:
                base = per_eval_ms(base_fn, q, args.evals)
                synk.fork(n, use_gpu=args.gpu)
                try:
                    fn, q2 = evaluator(data_parallel(model, batch=args.batch))
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


# ------------------------------------------------------------------ sampling
def _summary(idata):
    post = idata.posterior
    return {name: (post[name].mean(("chain", "draw")).values.ravel().tolist(),
                   post[name].std(("chain", "draw")).values.ravel().tolist())
            for name in post.data_vars}


def _steps(idata):
    """Mean leapfrog steps (gradient evaluations) per draw and chain, after tuning."""
    stats = idata.sample_stats
    name = "n_steps" if "n_steps" in stats else "num_steps" if "num_steps" in stats else None
    return float(stats[name].mean()) if name else None


def _worst(ref, other):
    """The largest |difference of posterior means| in posterior SDs of ``ref``,
    over the variables both name."""
    return max(abs(m2 - m1) / s1 for k in ref if k in other
               for m1, s1, m2 in zip(ref[k][0], ref[k][1], other[k][0]))


def _sample_opts(args):
    return dict(draws=args.draws, tune=args.tune, chains=args.chains, random_seed=1, progressbar=False,
                compute_convergence_checks=False)


def _pymc_cores(args):
    """The cores and start method ``pm.sample`` uses with these arguments."""
    from pymc.sampling.parallel import _cpu_count, _initialize_multiprocessing_context

    cpus = _cpu_count()
    cores = min(args.cores or min(4, cpus), args.chains)
    start = _initialize_multiprocessing_context(None, quiet=True).get_start_method()
    return dict(pymc_cpu_count=cpus, cores_arg=args.cores, cores=cores, mp_ctx=start,
                chains_run_in="processes (%s)" % start if cores > 1 else "this process, one after another")


def _pm_sample(model, args):
    import pymc as pm

    forced = dict(cores=args.cores) if args.cores else {}  # else PyMC's default
    t0 = time.perf_counter()
    idata = pm.sample(model=model, **_sample_opts(args), **forced)
    return time.perf_counter() - t0, _summary(idata), _steps(idata)


def _nutpie(model, args):
    import nutpie

    t0 = time.perf_counter()
    idata = nutpie.sample(nutpie.compile_pymc_model(model), chains=args.chains, tune=args.tune,
                          draws=args.draws, seed=1, progress_bar=False)
    return time.perf_counter() - t0, _summary(idata), _steps(idata)


def numpyro_child(args):
    """``pm.sample(nuts_sampler="numpyro")`` on the plain model (on the GPU), with
    PyMC's chain_method or ``--_numpyro vectorized``: wall time, posterior summary."""
    import pymc as pm

    model = build(args.models[0], args.sample_rows, args.features)
    kw = {} if args.numpyro == "default" else dict(nuts_sampler_kwargs={"chain_method": args.numpyro})
    t0 = time.perf_counter()
    idata = pm.sample(model=model, nuts_sampler="numpyro", **_sample_opts(args), **kw)
    seconds = time.perf_counter() - t0
    import jax

    print("@@RESULT " + json.dumps(dict(
        seconds=seconds, summary=_summary(idata), steps=_steps(idata),
        devices=[str(d) for d in jax.devices()],
        x64=bool(jax.config.jax_enable_x64), dtype=str(idata.posterior["beta"].dtype))))


def _jax_logp(kind, layout):
    """The model's log-density (priors, transforms, likelihood) in ``jax.numpy``,
    of a raveled point laid out as PyMC ravels it."""
    import jax.numpy as jnp
    from jax.nn import softplus

    half_log_2pi = 0.5 * np.log(2 * np.pi)

    def unravel(q):
        out, i = {}, 0
        for entry in layout:
            name, shape = entry[0], tuple(entry[1])
            size = int(np.prod(shape))
            out[name] = q[i:i + size].reshape(shape)
            i += size
        return out

    def logp(q, x, y, g):
        p = unravel(q)
        beta = p["beta"]
        lp = jnp.sum(-0.5 * beta ** 2) - beta.size * half_log_2pi
        if kind == "logistic":
            alpha = p["alpha"]
            lp += -0.5 * alpha ** 2 - half_log_2pi
            eta = alpha + x @ beta
        else:
            s = p["sigma_log__"]
            sigma = jnp.exp(s)
            lp += np.log(2.0) - half_log_2pi - 0.5 * sigma ** 2 + s  # HalfNormal(1), log transform
            alpha = p["alpha"]
            lp += jnp.sum(-0.5 * (alpha / sigma) ** 2) - alpha.size * (s + half_log_2pi)
            eta = alpha[g] + x @ beta
        return lp + jnp.sum(y * eta - softplus(eta))  # Bernoulli(logit_p=eta)

    return logp


def jax_child(args):
    """The hand-written JAX log-density and gradient, 1 point and 4 (vmap), timed
    on JAX's default device: ms per call, and its values to check."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    kind = args.models[0]
    x, g, y = make_data(kind, args.sample_rows, args.features)
    q, layout = _point(build(kind, 100, args.features))  # the layout does not depend on the rows
    logp = _jax_logp(kind, layout)
    data = (jax.device_put(x), jax.device_put(y.astype(np.float64)),
            None if kind == "logistic" else jax.device_put(g))
    one = jax.jit(jax.value_and_grad(logp))
    four = jax.jit(jax.vmap(jax.value_and_grad(logp), in_axes=(0, None, None, None)))
    res = {}
    for name, f, host in (("one", one, q), ("four", four, _four(q))):
        point = jnp.asarray(host)
        t0 = time.perf_counter()
        value, grad = jax.block_until_ready(f(point, *data))
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.evals):
            t0 = time.perf_counter()
            jax.block_until_ready(f(point, *data))
            times.append(time.perf_counter() - t0)
        # as a sampler on the host calls it: the point from numpy, the results to numpy
        host_times = []
        for _ in range(args.evals):
            t0 = time.perf_counter()
            jax.device_get(f(host, *data))
            host_times.append(time.perf_counter() - t0)
        res[name] = dict(ms=1e3 * median(times), host_ms=1e3 * median(host_times), first_call_s=first,
                         logp=np.asarray(value).tolist(), dtype=str(value.dtype), grad_dtype=str(grad.dtype))
    dev = jax.devices()[0]
    print("@@RESULT " + json.dumps(dict(device=str(dev), platform=dev.platform, jax=jax.__version__,
                                        x64=bool(jax.config.jax_enable_x64), **res)))


def _child(args, kind, *flags):
    """Run this script in a process of its own for ``kind`` (``--_numpyro`` or
    ``--_jax``): the JSON it prints."""
    cmd = [sys.executable, os.path.abspath(__file__), *flags, "--models", kind,
           "--sample-rows", str(args.sample_rows), "--features", str(args.features), "--tune", str(args.tune),
           "--draws", str(args.draws), "--chains", str(args.chains), "--evals", str(args.evals)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError("%s failed:\n%s%s" % (" ".join(flags), proc.stdout[-3000:], proc.stderr[-3000:]))
    return json.loads(lines[-1][len("@@RESULT "):])


def _lingered(batcher):
    """Seconds spent waiting for chains due back: by the batcher (threads) and
    by the session's service (chain processes)."""
    from synkhronos._session import runtime

    return batcher.lingered_s + runtime.require().service.lingered_s


def _sizes(counter):
    return {int(n): int(k) for n, k in sorted(counter.items()) if k}


def _since(sizes, before):
    return _sizes(collections.Counter(sizes) - before)


def copy_per_eval(fast, args):
    """The copy's logp+dlogp per evaluation: 1 point; 4 points from 4 threads at
    once; 4 points in one run of the ranks.  For each: ms per call (median), the
    batcher's {points per run: runs} meanwhile, and logps to check."""

    node = fast.potentials[0].owner
    ev = node.op.evaluator
    sizes = ev.batcher.sizes
    fn, q = evaluator(fast)
    qs = _four(q)
    out = {}

    before = collections.Counter(sizes)
    out["one"] = dict(ms=per_eval_ms(fn, q, args.evals), sizes=_since(sizes, before), logp=[float(fn(q)[0])])

    # 4 threads, each its own compiled function (as nutpie's chains), asking at once
    fns = []
    for _ in range(4):
        f = fast.logp_dlogp_function(ravel_inputs=True)
        f.set_extra_values({})
        fns.append(f)
    logps = [float(f(p)[0]) for f, p in zip(fns, qs)]
    start, end = threading.Barrier(5, timeout=600), threading.Barrier(5, timeout=600)
    errors = []

    def chain(f, p):
        try:
            for _ in range(args.evals):
                start.wait()
                f(p)
                end.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # let the others go, then raise it below
            errors.append(exc)
            start.abort()
            end.abort()

    threads = [threading.Thread(target=chain, args=(f, p), daemon=True) for f, p in zip(fns, qs)]
    before = collections.Counter(sizes)
    for t in threads:
        t.start()
    times = []
    try:
        for _ in range(args.evals):
            start.wait()
            t0 = time.perf_counter()
            end.wait()
            times.append(time.perf_counter() - t0)
    except threading.BrokenBarrierError as exc:
        raise (errors[0] if errors else RuntimeError("a thread of the 4-point timing stopped")) from exc
    for t in threads:
        t.join()
    out["threads"] = dict(ms=1e3 * median(times), sizes=_since(sizes, before), logp=logps)

    # 4 points in one run: the call the batcher makes with every pending point
    # (Evaluator._run, the split terms alone: the priors are not in it)
    points = _run_points(fast, 4)
    together = ev._run(points)
    times = []
    for _ in range(args.evals):
        t0 = time.perf_counter()
        ev._run(points)
        times.append(time.perf_counter() - t0)
    alone = [float(ev.evaluate(p)[0]) for p in points]
    err = max(abs(float(r[0]) / a - 1) for r, a in zip(together, alone))
    assert err < 1e-9, "4 points in one run differ from one at a time by %g" % err
    out["one_run"] = dict(ms=1e3 * median(times), sizes={4: args.evals}, rel_err_vs_one_at_a_time=err,
                          batched=bool(ev.batched))
    return out


def _run_points(fast, k):
    """``k`` points as the batcher passes them to ``Evaluator._run``."""
    from pymc.blocking import DictToArrayBijection, RaveledVars

    node = fast.potentials[0].owner
    q, layout = _point(fast)
    op_inputs = fast.compile_fn(fast.replace_rvs_by_values(node.inputs), inputs=fast.value_vars,
                                on_unused_input="ignore", point_fn=True)
    qs = [q] if k == 1 else list(_four(q))[:k]
    return [[np.asarray(v) for v in op_inputs(DictToArrayBijection.rmap(RaveledVars(p, layout)))] for p in qs]


def kernel_on_off(model, fast, args):
    """One run of the ranks (1 and 4 points) with the GPU ranks' rows kernel
    (``fast``, the default) and without it (a second copy, built with
    ``SYNKHRONOS_ROWS_KERNEL=0``), calls alternated: {points: (on ms, off ms)}."""
    from synkhronos.pymc import data_parallel
    from synkhronos.pymc._kernel import KERNEL_ENV

    before = os.environ.get(KERNEL_ENV)
    os.environ[KERNEL_ENV] = "0"
    try:
        off = data_parallel(model, batch=args.batch)
    finally:
        if before is None:
            del os.environ[KERNEL_ENV]
        else:
            os.environ[KERNEL_ENV] = before
    out = {}
    for k in (1, 4):
        runs = [(c.potentials[0].owner.op.evaluator, _run_points(c, k)) for c in (fast, off)]
        times = [[], []]
        for ev, pts in runs:
            ev._run(pts)
        for _ in range(args.evals):
            for i, (ev, pts) in enumerate(runs):
                t0 = time.perf_counter()
                ev._run(pts)
                times[i].append(time.perf_counter() - t0)
        on_off = [runs[i][0]._run(runs[i][1]) for i in (0, 1)]
        err = max(abs(float(a[0]) / float(b[0]) - 1) for a, b in zip(*on_off))
        assert err < 1e-9, "the rows kernel's logp differs from the batched graph's by %g" % err
        out[k] = (1e3 * median(times[0]), 1e3 * median(times[1]))
    return out


def sampling(args):
    """The samplers on the plain model and the copy, same draws and seed, and
    the copy per evaluation against hand-written JAX.  ``(rows, jax_rows)``."""
    import synkhronos as synk
    from synkhronos.pymc import data_parallel

    parts = set(args.sample_parts)
    if "nutpie" in parts and not _importable("nutpie"):
        print("  (nutpie is not installed: its rows are skipped)")
        parts.discard("nutpie")
    if not args.gpu:
        parts -= {"numpyro", "numpyro-vectorized"}  # the numpyro rows are the GPU's baseline
    if "jax-eval" in parts and not _importable("jax"):
        print("  (jax is not installed: the per-evaluation comparison with JAX is skipped)")
        parts.discard("jax-eval")
    plain_cpu = args.plain_cpu or not args.gpu
    if args.gpu and not args.plain_cpu and parts & {"pymc", "nutpie"}:
        print("  (--gpu: the plain model's pm.sample and nutpie on the CPU are not run (--plain-cpu runs "
              "them); the copy's posteriors are compared with numpyro's)")
    cores = _pymc_cores(args)
    print("  pm.sample: PyMC's _cpu_count() %d, cores %s -> %d for %d chains, start method %s: chains in %s"
          % (cores["pymc_cpu_count"], args.cores or "default", cores["cores"], args.chains, cores["mp_ctx"],
             cores["chains_run_in"]), flush=True)

    rows, jax_rows = [], []
    for kind in args.models:
        model = build(kind, args.sample_rows, args.features)
        plain, copy = {}, {}  # sampler -> (seconds, summary)
        if "jax-eval" in parts:
            base_fn, q = evaluator(model)
            ref = [float(base_fn(p)[0]) for p in [q] + list(_four(q))]
            jx = _child(args, kind, "--_jax")
            print("  hand-written JAX on %s (jax %s, x64 %s, %s): 1 point %.3f ms, 4 points (vmap) %.3f ms "
                  "on the device; from the host (numpy in, numpy out) %.3f and %.3f ms"
                  % (jx["device"], jx["jax"], jx["x64"], jx["one"]["dtype"], jx["one"]["ms"],
                     jx["four"]["ms"], jx["one"]["host_ms"], jx["four"]["host_ms"]), flush=True)
        methods = [("default", "numpyro")] * ("numpyro" in parts)
        methods += [("vectorized", "numpyro vectorized")] * bool(parts & {"numpyro", "numpyro-vectorized"})
        for method, label in methods:
            res = _child(args, kind, "--_numpyro", method)
            plain[label] = (res["seconds"], res["summary"], res["steps"])
            print("  %s on %s (x64 %s, %s): %.1f s" % (label, ", ".join(res["devices"]), res["x64"],
                                                    res["dtype"], res["seconds"]), flush=True)
        if plain_cpu and "pymc" in parts:
            plain["pm.sample"] = _pm_sample(model, args)
            print("  pm.sample, plain model: %.1f s" % plain["pm.sample"][0], flush=True)
        if plain_cpu and "nutpie" in parts:
            plain["nutpie"] = _nutpie(model, args)
            print("  nutpie, plain model: %.1f s" % plain["nutpie"][0], flush=True)

        sizes = {}
        synk.fork(args.ranks[0] if args.gpu else None, use_gpu=args.gpu)
        try:
            fast = data_parallel(model, batch=args.batch)
            op = fast.potentials[0].owner.op
            batched, dtype = bool(op.evaluator.batched), op.dtype
            for name, part, run in (("pm.sample", "pymc", _pm_sample), ("nutpie", "nutpie", _nutpie)):
                if part not in parts:
                    continue
                batcher = op.evaluator.batcher
                before, lingered = collections.Counter(batcher.sizes), _lingered(batcher)
                copy[name] = run(fast, args)
                sizes[name] = _since(batcher.sizes, before)
                print("  %s, copy: %.1f s, points:runs %s, waited for chains %.1f s"
                      % (name, copy[name][0], sizes[name], _lingered(batcher) - lingered), flush=True)
            per_eval = copy_per_eval(fast, args) if "jax-eval" in parts else None
            if per_eval is not None and args.gpu:
                per_eval["kernel"] = kernel_on_off(model, fast, args)
        finally:
            synk.close()

        rows += _sampling_rows(kind, args, plain, copy, sizes, cores, batched, dtype)
        if per_eval is not None:
            jax_rows += _jax_rows(kind, args, jx, per_eval, ref, batched)
    return rows, jax_rows


def _importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _sampling_rows(kind, args, plain, copy, sizes, cores, batched, dtype):
    numpyro_ref = plain.get("numpyro vectorized") or plain.get("numpyro")
    ref_name = "numpyro vectorized" if "numpyro vectorized" in plain else "numpyro"
    common = dict(model=kind, rows=args.sample_rows, features=args.features if kind == "logistic" else 3,
                  chains=args.chains, tune=args.tune, draws=args.draws)
    out = []
    for sampler in ("pm.sample", "nutpie"):
        if sampler not in plain and sampler not in copy:
            continue
        p, c = plain.get(sampler), copy.get(sampler)
        ref, against = (p, "plain " + sampler) if p else (numpyro_ref, "plain " + ref_name)
        row = dict(common, sampler=sampler, plain_s=p and p[0], synk_s=c and c[0],
                   speedup=p[0] / c[0] if p and c else None,
                   max_mean_diff_in_sd=_worst(ref[1], c[1]) if ref and c else None, against=against,
                   batch_sizes=sizes.get(sampler), batched=batched, copy_dtype=dtype,
                   plain_steps_per_draw=p and p[2], synk_steps_per_draw=c and c[2],
                   plain=p and p[1], synk=c and c[1])
        if sampler == "pm.sample":
            row.update(cores)
        else:
            row.update(cores=None, mp_ctx=None, chains_run_in="threads of this process")
        if numpyro_ref and c:
            row["vs_numpyro"] = dict(baseline=ref_name, seconds=numpyro_ref[0], ratio=numpyro_ref[0] / c[0])
        out.append(row)
    for sampler in ("numpyro", "numpyro vectorized"):
        if sampler not in plain:
            continue
        p = plain[sampler]
        other = "numpyro" if sampler == "numpyro vectorized" else "numpyro vectorized"
        against = "pm.sample" if "pm.sample" in plain else other if other in plain else None
        ref = plain.get(against)
        out.append(dict(common, sampler=sampler, plain_s=p[0], synk_s=None, speedup=None,
                        max_mean_diff_in_sd=_worst(ref[1], p[1]) if ref else None,
                        against=against and "plain " + against, batch_sizes=None, cores=None, mp_ctx=None,
                        plain_steps_per_draw=p[2], synk_steps_per_draw=None,
                        chains_run_in="one GPU, " + ("vectorized" if "vector" in sampler else
                                                     "one after another (PyMC's chain_method)"),
                        plain=p[1], synk=None))
    return out


def _jax_rows(kind, args, jx, per_eval, ref, batched):
    err = max(abs(v / r - 1) for v, r in zip([jx["one"]["logp"]] + jx["four"]["logp"], ref))
    copy_err = max(abs(v / r - 1) for v, r in zip(per_eval["one"]["logp"] + per_eval["threads"]["logp"], ref))
    assert err < 1e-9 and copy_err < 1e-9, "logp differs from PyMC's: JAX %g, copy %g" % (err, copy_err)
    common = dict(model=kind, rows=args.sample_rows, jax_device=jx["device"], jax=jx["jax"],
                  jax_dtype=jx["one"]["dtype"], jax_logp_rel_err=err, copy_logp_rel_err=copy_err,
                  batched=batched)
    out = []
    for how, points in (("one", 1), ("threads", 4), ("one_run", 4)):
        j = jx["one" if points == 1 else "four"]
        e = per_eval[how]
        label = {"one": "logp_dlogp_function", "threads": "4 threads at once",
                 "one_run": "one run of the ranks"}[how]
        out.append(dict(common, points=points, copy_path=label, jax_ms=j["ms"], jax_host_ms=j["host_ms"],
                        synk_ms=e["ms"], jax_over_synk=j["ms"] / e["ms"],
                        jax_host_over_synk=j["host_ms"] / e["ms"], batch_sizes=e["sizes"],
                        jax_first_call_s=j["first_call_s"]))
    for points, (on, off) in sorted(per_eval.get("kernel", {}).items()):
        j = jx["one" if points == 1 else "four"]
        for label, ms in (("one run, rows kernel (default)", on), ("one run, rows kernel off", off)):
            out.append(dict(common, points=points, copy_path=label, jax_ms=j["ms"], jax_host_ms=j["host_ms"],
                            synk_ms=ms, jax_over_synk=j["ms"] / ms, jax_host_over_synk=j["host_ms"] / ms,
                            batch_sizes={points: args.evals}, jax_first_call_s=j["first_call_s"]))
    return out


# ------------------------------------------------------------------ picture
def plot(payload, png):
    """The picture of a results file this script wrote (``benchmarks/plot.py``)."""
    draw(payload["likelihood"], payload["sampling"], payload["jax_per_eval"], png, payload["machine"])
    return png


def draw(records, sampled, jax_rows, png, machine=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["model"] for r in records})
    lower = [x for x in (sampled, jax_rows) if x]
    cols = max(len(kinds), len(lower), 1)
    fig, axes = plt.subplots(1 + bool(lower), cols, figsize=(6.5 * cols, 4.5 * (1 + bool(lower))),
                             squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for rows in sorted({r["rows"] for r in records if r["model"] == kind}):
            rs = [r for r in records if r["model"] == kind and r["rows"] == rows]
            ax.plot([r["ranks"] for r in rs], [r["speedup"] for r in rs], "o-", label="%g rows" % rows)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xticks(sorted({r["ranks"] for r in records}))
        ax.set(title="%s: logp+dlogp vs PyMC, one process" % kind, xlabel="ranks",
               ylabel="speedup (PyMC ms / Synkhronos ms)")
        ax.legend()
    for ax in list(axes[0][len(kinds):]) + (list(axes[1][len(lower):]) if lower else []):
        ax.axis("off")
    if lower:
        axes_lower = iter(axes[1])
        if sampled:
            _draw_sampling(next(axes_lower), sampled)
        if jax_rows:
            _draw_jax(next(axes_lower), jax_rows)
    machine = machine or {}
    where = "%d usable cores" % machine.get("usable_cores", usable_cores())
    if machine.get("gpu_name"):
        where = "%s, %s" % (machine["gpu_name"], where)
    fig.suptitle("PyMC logp+dlogp per evaluation and sampling, float64 both sides (%s; PyMC %s, PyTensor %s)"
                 % (where, machine.get("pymc"), machine.get("pytensor")), fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _bars(ax, labels, series):
    """Grouped bars: ``series`` is [(name, [value or None per label])]."""
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, v in enumerate(values) if v is not None]
        ax.bar(xs, [v for v in values if v is not None], width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.legend(fontsize=8)


def _draw_sampling(ax, sampled):
    labels = ["%s\n%s %g rows" % (s["sampler"], s["model"], s["rows"]) for s in sampled]
    _bars(ax, labels, [("plain model", [s["plain_s"] for s in sampled]),
                       ("data_parallel copy", [s["synk_s"] for s in sampled])])
    ax.set(title="sampling: wall time with compiling (%d chains, %d+%d draws)"
           % (sampled[0]["chains"], sampled[0]["tune"], sampled[0]["draws"]), ylabel="seconds")


def _draw_jax(ax, jax_rows):
    labels = ["%s, %d pt\n%s" % (r["model"], r["points"], r["copy_path"]) for r in jax_rows]
    _bars(ax, labels, [("hand-written JAX (%s)" % jax_rows[0]["jax_device"], [r["jax_ms"] for r in jax_rows]),
                       ("the same from the host", [r["jax_host_ms"] for r in jax_rows]),
                       ("data_parallel copy", [r["synk_ms"] for r in jax_rows])])
    ax.set(title="logp+dlogp per call, %g rows" % jax_rows[0]["rows"], ylabel="ms per call")


# ------------------------------------------------------------------ main
def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = usable_cores()
    p.add_argument("--models", default="logistic,hierarchical", type=lambda s: s.split(","))
    p.add_argument("--rows", default="100000,1000000", type=lambda s: [int(float(v)) for v in s.split(",")])
    p.add_argument("--features", type=int, default=5, help="features of the logistic regression")
    p.add_argument("--ranks", default=None, type=lambda s: [int(v) for v in s.split(",")],
                   help="rank counts (default: 1, 2, 4 up to the cores; with --gpu: 1)")
    p.add_argument("--gpu", action="store_true", help="GPU ranks; sampling against numpyro on the GPU")
    p.add_argument("--batch", choices=("auto", "on", "off"), default="auto",
                   help="data_parallel(batch=): auto (None, the package's default), on, off; "
                        "whether the copy was batched is recorded")
    p.add_argument("--evals", type=int, default=30, help="timed evaluations per setting (median)")
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
    p.add_argument("--_numpyro", dest="numpyro", choices=("default", "vectorized"), help=argparse.SUPPRESS)
    p.add_argument("--_jax", dest="jax", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ranks is None:
        args.ranks = [1] if args.gpu else [n for n in (1, 2, 4) if n <= cores]
    unknown = set(args.sample_parts) - set(PARTS)
    if unknown:
        p.error("--sample-parts: unknown %s (choose from %s)" % (sorted(unknown), ",".join(PARTS)))
    args.batch = {"auto": None, "on": True, "off": False}[args.batch]
    return args


def _fmt(v, f="%.1f", none="-"):
    return none if v is None else f % v


def _print_sampling(sampled):
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


def _print_jax(jax_rows):
    print(table(["model", "rows", "points", "JAX device", "JAX ms", "JAX from host ms", "copy path",
                 "Synkhronos ms", "JAX/Synkhronos", "JAX from host/Synkhronos", "points:runs"],
                [[r["model"], r["rows"], r["points"], r["jax_device"], "%.3f" % r["jax_ms"],
                  "%.3f" % r["jax_host_ms"], r["copy_path"], "%.3f" % r["synk_ms"],
                  "%.2fx" % r["jax_over_synk"], "%.2fx" % r["jax_host_over_synk"],
                  " ".join("%d:%d" % kv for kv in r["batch_sizes"].items())] for r in jax_rows]))


def main(argv=None):
    args = _parse(argv)
    if args.numpyro:
        return numpyro_child(args)
    if args.jax:
        return jax_child(args)
    import pymc
    import pytensor

    info = machine_info()
    info.update(pymc=pymc.__version__, nutpie=_version("nutpie"),
                pytensor_blas_ldflags=pytensor.config.blas__ldflags)
    if args.gpu:
        info.update(gpu_name=gpu_name(), jax=_version("jax"), numpyro=_version("numpyro"))
        print("GPU %s, jax %s, numpyro %s" % (info["gpu_name"], info["jax"], info["numpyro"]))
    print_machine(info)
    print("pymc %s, nutpie %s, pytensor mode %s, floatX %s, BLAS flags %r (both sides float64 data and "
          "parameters)" % (pymc.__version__, info["nutpie"], pytensor.config.mode, pytensor.config.floatX,
                           info["pytensor_blas_ldflags"]))
    records = likelihood_rows(args)
    print(table(["model", "rows", "ranks", "PyMC ms", "Synkhronos ms", "speedup"],
                [[r["model"], r["rows"], r["ranks"], "%.2f" % r["pymc_ms"], "%.2f" % r["synk_ms"],
                  "%.2fx" % r["speedup"]] for r in records]))
    sampled, jax_rows = sampling(args) if args.sample else ([], [])
    if sampled:
        print("sampling (wall time with compiling; precision: PyMC floatX %s, the copy's split terms %s):"
              % (pytensor.config.floatX, sampled[0].get("copy_dtype", "-")))
        _print_sampling(sampled)
    if jax_rows:
        print("per evaluation against hand-written JAX (%s; the copy %s, %s):"
              % (jax_rows[0]["jax_dtype"], sampled[0].get("copy_dtype", "float64") if sampled else "float64",
                 "batched" if jax_rows[0]["batched"] else "one point at a time on the ranks"))
        _print_jax(jax_rows)
    out = args.out or default_out(__file__)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(benchmark="pymc_likelihood", machine=info, args=vars(args), likelihood=records,
                       sampling=sampled, jax_per_eval=jax_rows), f, indent=1)
    png = os.path.splitext(out)[0] + ".png"
    draw(records, sampled, jax_rows, png, info)
    print("wrote %s and %s" % (out, png))


if __name__ == "__main__":
    main()
