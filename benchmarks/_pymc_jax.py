"""``pymc_likelihood.py``'s peer per evaluation: the log-density a JAX user writes
by hand in ``jax.numpy``, and the rows that set it beside the copy.

The model's log-density (priors, transforms, likelihood) in float64,
``jax.jit(jax.value_and_grad(...))`` at 1 point and with ``jax.vmap`` at 4,
timed on JAX's default device two ways: with the point and the results on the
device, and as a sampler on the host calls it (the point from numpy, the results
to numpy).  ``jax_child`` runs in a process of its own (``pymc_likelihood.py
--_jax``), so that its JAX does not share the Synkhronos session's; it prints its
results as one ``@@RESULT`` JSON line.  ``jax_per_eval_rows`` checks both sides'
logps against PyMC's and makes the rows of the table.

Not a benchmark itself.  JAX is imported inside the functions.
"""

import json
import time

import numpy as np
from _common import median, time_calls
from _pymc_models import build, four_points, make_data, raveled_point

__all__ = ["jax_child", "jax_per_eval_rows"]


def _jax_logp(kind, layout):
    """The model's log-density (priors, transforms, likelihood) in ``jax.numpy``,
    of a raveled point laid out as PyMC ravels it."""
    import jax
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
        if kind == "multinomial":  # w ~ Normal(0, 1); Categorical(softmax([0, x @ w]))
            w = p["w"]
            eta = jnp.concatenate([jnp.zeros((x.shape[0], 1)), x @ w], axis=1)
            picked = jnp.take_along_axis(eta, y[:, None], axis=1)[:, 0]
            return (jnp.sum(-0.5 * w ** 2) - w.size * half_log_2pi
                    + jnp.sum(picked - jax.nn.logsumexp(eta, axis=1)))
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

    kind = args.models[0]
    x, g, y = make_data(kind, args.sample_rows, args.features)
    q, layout = raveled_point(build(kind, 100, args.features))  # the layout does not depend on the rows
    logp = _jax_logp(kind, layout)
    # (the classes as integers, to index with; 0/1 outcomes as floats, to multiply)
    data = (jax.device_put(x), jax.device_put(y if kind == "multinomial" else y.astype(np.float64)),
            None if kind != "hierarchical" else jax.device_put(g))
    one = jax.jit(jax.value_and_grad(logp))
    four = jax.jit(jax.vmap(jax.value_and_grad(logp), in_axes=(0, None, None, None)))
    res = {name: _timed(jax, f, host, data, args.evals)
           for name, f, host in (("one", one, q), ("four", four, four_points(q)))}
    dev = jax.devices()[0]
    print("@@RESULT " + json.dumps(dict(device=str(dev), platform=dev.platform, jax=jax.__version__,
                                        x64=bool(jax.config.jax_enable_x64), **res)))


def _timed(jax, f, host, data, evals):
    """``f`` at the point ``host`` (numpy): its first call, then ms per call on
    the device and from the host (medians), and its values."""
    import jax.numpy as jnp

    point = jnp.asarray(host)
    t0 = time.perf_counter()
    value, grad = jax.block_until_ready(f(point, *data))
    first = time.perf_counter() - t0
    on_device = time_calls(lambda: jax.block_until_ready(f(point, *data)), evals)
    # as a sampler on the host calls it: the point from numpy, the results to numpy
    from_host = time_calls(lambda: jax.device_get(f(host, *data)), evals)
    return dict(ms=1e3 * median(on_device), host_ms=1e3 * median(from_host), first_call_s=first,
                logp=np.asarray(value).tolist(), dtype=str(value.dtype), grad_dtype=str(grad.dtype))


def jax_per_eval_rows(kind, args, jx, per_eval, ref, batched):
    """The table's rows: JAX (``jx``, what ``jax_child`` printed) beside each of
    the copy's paths (``per_eval``, from ``_pymc_per_eval``), both sides' logps
    checked against PyMC's (``ref``: the point, then the 4 points)."""
    err = max(abs(v / r - 1) for v, r in zip([jx["one"]["logp"]] + jx["four"]["logp"], ref))
    copy_err = max(abs(v / r - 1) for v, r in zip(per_eval["one"]["logp"] + per_eval["threads"]["logp"], ref))
    assert err < 1e-9 and copy_err < 1e-9, "logp differs from PyMC's: JAX %g, copy %g" % (err, copy_err)
    common = dict(model=kind, rows=args.sample_rows, jax_device=jx["device"], jax=jx["jax"],
                  jax_dtype=jx["one"]["dtype"], jax_logp_rel_err=err, copy_logp_rel_err=copy_err,
                  batched=batched)
    labels = {"one": "logp_dlogp_function", "threads": "4 threads at once", "one_run": "one run of the ranks"}
    out = [_row(common, jx, points, labels[how], per_eval[how]["ms"], per_eval[how]["sizes"])
           for how, points in (("one", 1), ("threads", 4), ("one_run", 4))]
    for points, (on, off) in sorted(per_eval.get("kernel", {}).items()):
        for label, ms in (("one run, rows kernel (default)", on), ("one run, rows kernel off", off)):
            out.append(_row(common, jx, points, label, ms, {points: args.evals}))
    return out


def _row(common, jx, points, copy_path, synk_ms, batch_sizes):
    j = jx["one" if points == 1 else "four"]
    return dict(common, points=points, copy_path=copy_path, jax_ms=j["ms"], jax_host_ms=j["host_ms"],
                synk_ms=synk_ms, jax_over_synk=j["ms"] / synk_ms, jax_host_over_synk=j["host_ms"] / synk_ms,
                batch_sizes=batch_sizes, jax_first_call_s=j["first_call_s"])
