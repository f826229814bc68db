"""``pymc_likelihood.py --sample``: the samplers on the plain model and on the
``data_parallel`` copy, same draws and seed, with the posteriors side by side.

- ``pm.sample()`` with PyMC's defaults (``--cores`` forces ``cores``): the copy's
  chains, in this process or in processes PyMC forks or spawns, all run on the
  ranks of this process's session;
- nutpie (every chain a thread of this process), if installed;
- with ``--gpu``: ``pm.sample(nuts_sampler="numpyro")`` on the plain model, with
  PyMC's chain_method and with ``chain_method="vectorized"``, each in a process
  of its own (``numpyro_child``: its JAX does not share the session's).  The
  copy refuses JAX samplers.  Part ``numpyro-sharded``: the model in numpyro
  by hand, rows sharded over the copy's GPUs (``_numpyro_sharded``), the peer
  on several GPUs.

In the same session, with the part ``jax-eval``, the copy per evaluation
(``_pymc_per_eval``) against the hand-written JAX of ``_pymc_jax``.  Each row
reports wall time with compiling, the worst difference between two posterior
means in posterior SDs, and the mean leapfrog steps per draw after tuning.

Not a benchmark itself.  Synkhronos, PyMC and the samplers are imported inside
the functions.
"""

import collections
import importlib.util
import json
import os
import subprocess
import sys
import time

from _pymc_jax import jax_per_eval_rows
from _pymc_models import build, evaluator, four_points
from _pymc_per_eval import copy_per_eval, kernel_on_off, rows_op_of, sizes_since

__all__ = ["numpyro_child", "sampling"]

# The children run the benchmark's own command line with a hidden option
# (--_numpyro, --_jax), so that they read the options as this process did.
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pymc_likelihood.py")

#: The numpyro runs of the plain model, the fairest peer on several GPUs last.
NUMPYRO = ("numpyro", "numpyro vectorized", "numpyro sharded")

#: What the copy's runs hand on: seconds and posteriors per sampler, the batcher's
#: {points per run: runs} per sampler, the per-evaluation timings (or None), and
#: whether the copy is batched and in which dtype its split terms compute.
CopyRuns = collections.namedtuple("CopyRuns", "samplers sizes per_eval batched dtype")


def sampling(args):
    """The samplers on the plain model and the copy, same draws and seed, and
    the copy per evaluation against hand-written JAX.  ``(rows, jax_rows)``."""
    parts = _parts(args)
    cores = _pymc_cores(args)
    print("  pm.sample: PyMC's _cpu_count() %d, cores %s -> %d for %d chains, start method %s: chains in %s"
          % (cores["pymc_cpu_count"], args.cores or "default", cores["cores"], args.chains, cores["mp_ctx"],
             cores["chains_run_in"]), flush=True)
    rows, jax_rows = [], []
    for kind in args.models:
        model = build(kind, args.sample_rows, args.features)
        jax_side = _jax_side(args, kind, model) if "jax-eval" in parts else None
        plain = _plain_runs(args, kind, model, parts)
        copy = _copy_runs(args, model, parts)
        rows += _sampling_rows(kind, args, plain, copy, cores)
        if jax_side is not None:
            ref, jx = jax_side
            jax_rows += jax_per_eval_rows(kind, args, jx, copy.per_eval, ref, copy.batched)
    return rows, jax_rows


def _parts(args):
    """The parts of ``--sample-parts`` that can run here (each one left out is said)."""
    parts = set(args.sample_parts)
    if "nutpie" in parts and not _importable("nutpie"):
        print("  (nutpie is not installed: its rows are skipped)")
        parts.discard("nutpie")
    if not args.gpu:
        parts -= {"numpyro", "numpyro-vectorized", "numpyro-sharded"}  # the GPU's baselines
    if "jax-eval" in parts and not _importable("jax"):
        print("  (jax is not installed: the per-evaluation comparison with JAX is skipped)")
        parts.discard("jax-eval")
    if args.gpu and not args.plain_cpu and parts & {"pymc", "nutpie"}:
        print("  (--gpu: the plain model's pm.sample and nutpie on the CPU are not run (--plain-cpu runs "
              "them); the copy's posteriors are compared with numpyro's)")
    return parts


def _importable(name):
    return importlib.util.find_spec(name) is not None


# ------------------------------------------------------------ the runs
def _jax_side(args, kind, model):
    """PyMC's logps at the point and the 4 points (the reference), and what the
    hand-written JAX child printed."""
    base_fn, q = evaluator(model)
    ref = [float(base_fn(p)[0]) for p in [q] + list(four_points(q))]
    jx = _run_child(args, kind, "--_jax")
    print("  hand-written JAX on %s (jax %s, x64 %s, %s): 1 point %.3f ms, 4 points (vmap) %.3f ms "
          "on the device; from the host (numpy in, numpy out) %.3f and %.3f ms"
          % (jx["device"], jx["jax"], jx["x64"], jx["one"]["dtype"], jx["one"]["ms"],
             jx["four"]["ms"], jx["one"]["host_ms"], jx["four"]["host_ms"]), flush=True)
    return ref, jx


def _plain_runs(args, kind, model, parts):
    """The plain model's samplers: {sampler: (seconds, summary, steps per draw)}."""
    plain = {}
    methods = [("default", "numpyro")] * ("numpyro" in parts)
    methods += [("vectorized", "numpyro vectorized")] * bool(parts & {"numpyro", "numpyro-vectorized"})
    methods += [("sharded", "numpyro sharded")] * ("numpyro-sharded" in parts)
    for method, label in methods:
        res = _run_child(args, kind, "--_numpyro", method)
        plain[label] = (res["seconds"], res["summary"], res["steps"], res["devices"])
        print("  %s on %s (x64 %s, %s): %.1f s" % (label, ", ".join(res["devices"]), res["x64"],
                                                res["dtype"], res["seconds"]), flush=True)
    plain_cpu = args.plain_cpu or not args.gpu  # on a GPU host the CPU samplers take hours at 10^7 rows
    for name, part, run in (("pm.sample", "pymc", _pm_sample), ("nutpie", "nutpie", _nutpie)):
        if plain_cpu and part in parts:
            plain[name] = run(model, args)
            print("  %s, plain model: %.1f s" % (name, plain[name][0]), flush=True)
    return plain


def _copy_runs(args, model, parts):
    """The copy's samplers and per-evaluation timings, in one session: ``CopyRuns``."""
    import synkhronos as synk
    from synkhronos.pymc import data_parallel

    samplers, sizes = {}, {}
    synk.fork(args.ranks[0] if args.gpu else None, use_gpu=args.gpu)
    try:
        fast = data_parallel(model, batch=args.batch)
        op = rows_op_of(fast)[0]
        batched, dtype = bool(op.evaluator.batched), op.dtype
        for name, part, run in (("pm.sample", "pymc", _pm_sample), ("nutpie", "nutpie", _nutpie)):
            if part not in parts:
                continue
            batcher = op.evaluator.batcher
            before, lingered = collections.Counter(batcher.sizes), _lingered(batcher)
            samplers[name] = run(fast, args)
            sizes[name] = sizes_since(batcher.sizes, before)
            print("  %s, copy: %.1f s, points:runs %s, waited for chains %.1f s"
                  % (name, samplers[name][0], sizes[name], _lingered(batcher) - lingered), flush=True)
        per_eval = copy_per_eval(fast, args) if "jax-eval" in parts else None
        if per_eval is not None and args.gpu:
            per_eval["kernel"] = kernel_on_off(model, fast, args)
    finally:
        synk.close()
    return CopyRuns(samplers, sizes, per_eval, batched, dtype)


def _lingered(batcher):
    """Seconds spent waiting for chains due back: by the batcher (threads) and
    by the session's service (chain processes)."""
    from synkhronos._session import runtime

    return batcher.lingered_s + runtime.require().service.lingered_s


# ------------------------------------------------------------ the samplers
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


def _run_child(args, kind, *flags):
    """Run the benchmark in a process of its own for ``kind`` (``--_numpyro`` or
    ``--_jax``): the JSON it prints."""
    cmd = [sys.executable, SCRIPT, *flags, "--models", kind, "--ranks", ",".join(map(str, args.ranks)),
           "--sample-rows", str(args.sample_rows), "--features", str(args.features), "--tune", str(args.tune),
           "--draws", str(args.draws), "--chains", str(args.chains), "--evals", str(args.evals)]
    env = dict(os.environ)
    if "SYNK_GPU_IDS" in env:  # the GPUs this process saw before fork() narrowed it to the master's
        env["CUDA_VISIBLE_DEVICES"] = env["SYNK_GPU_IDS"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError("%s failed:\n%s%s" % (" ".join(flags), proc.stdout[-3000:], proc.stderr[-3000:]))
    return json.loads(lines[-1][len("@@RESULT "):])


# ------------------------------------------------------------ posteriors and rows
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


def _sampling_rows(kind, args, plain, copy, cores):
    """The table's rows: the CPU samplers on both sides, then numpyro's on the plain model."""
    common = dict(model=kind, rows=args.sample_rows, features=args.features if kind == "logistic" else 3,
                  chains=args.chains, tune=args.tune, draws=args.draws)
    return (_cpu_sampler_rows(common, plain, copy, cores)
            + [_numpyro_row(common, plain, sampler) for sampler in NUMPYRO if sampler in plain])


def _cpu_sampler_rows(common, plain, copy, cores):
    """pm.sample and nutpie: the plain model against the copy (or, where the plain
    model did not run, numpyro's posteriors against the copy's)."""
    ref_name = next((s for s in NUMPYRO[::-1] if s in plain), "numpyro")  # the fairest there is
    numpyro_ref = plain.get(ref_name)
    out = []
    for sampler in ("pm.sample", "nutpie"):
        if sampler not in plain and sampler not in copy.samplers:
            continue
        p, c = plain.get(sampler), copy.samplers.get(sampler)
        ref, against = (p, "plain " + sampler) if p else (numpyro_ref, "plain " + ref_name)
        row = dict(common, sampler=sampler, plain_s=p and p[0], synk_s=c and c[0],
                   speedup=p[0] / c[0] if p and c else None,
                   max_mean_diff_in_sd=_worst(ref[1], c[1]) if ref and c else None, against=against,
                   batch_sizes=copy.sizes.get(sampler), batched=copy.batched, copy_dtype=copy.dtype,
                   plain_steps_per_draw=p and p[2], synk_steps_per_draw=c and c[2],
                   plain=p and p[1], synk=c and c[1])
        if sampler == "pm.sample":
            row.update(cores)
        else:
            row.update(cores=None, mp_ctx=None, chains_run_in="threads of this process")
        if numpyro_ref and c:
            row["vs_numpyro"] = dict(baseline=ref_name, seconds=numpyro_ref[0], ratio=numpyro_ref[0] / c[0])
        out.append(row)
    return out


def _numpyro_row(common, plain, sampler):
    """numpyro on the plain model, its posteriors against pm.sample's or the other numpyro's."""
    p = plain[sampler]
    others = [s for s in NUMPYRO if s != sampler and s in plain]
    against = "pm.sample" if "pm.sample" in plain else others[0] if others else None
    ref = plain.get(against)
    return dict(common, sampler=sampler, plain_s=p[0], synk_s=None, speedup=None,
                max_mean_diff_in_sd=_worst(ref[1], p[1]) if ref else None,
                against=against and "plain " + against, batch_sizes=None, cores=None, mp_ctx=None,
                plain_steps_per_draw=p[2], synk_steps_per_draw=None,
                chains_run_in=("%d GPU(s), rows sharded, vectorized" % len(p[3]) if "sharded" in sampler else
                               "one GPU, " + ("vectorized" if "vector" in sampler else
                                              "one after another (PyMC's chain_method)")),
                plain=p[1], synk=None)
