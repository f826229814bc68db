"""The GPU ranks' rows kernel (``synkhronos.pymc._kernel``) for K points of a
logistic regression, against forms of the same kernel written by hand in
Pallas: what limits it as points are added.

Forms, each a Pallas kernel over blocks of 256 rows (float64, JAX's 64-bit
mode), timed as a jitted call with its points and rows on the GPU:

* ``kernel``: ``RowsKernel`` as built for PyMC's Bernoulli graph (the
  log-density and gradient of ``eta = x @ beta + alpha`` as PyMC writes them,
  from the tests' ``_pymc_glm``), as the ranks run it;
* ``kernel_apart``: the same with each softplus and sigmoid computing its own
  ``exp(-|eta|)`` (``_scalars.shared_exponentials`` off: the release before);
* ``hand``: the same pass written by hand (one exponential, one ``log1p``);
* ``hand_loop``: each program 8 blocks in a loop, the row sums kept as vectors
  and reduced once (fewer, longer programs);
* ``hand_f32_math``: ``hand`` with its arithmetic in float32 (rows still read
  in float64): how much of each point's time is float64 arithmetic;
* ``hand_points_inner``: ``hand`` with the grid's axes swapped (blocks, then
  points), so that the programs of one block run next to each other;
* ``hand_one_read``: one program per block for all the points, the rows read
  once;
* ``fm``, ``fm_loop``, ``fm_one_read``: ``hand``, ``hand_loop`` and
  ``hand_one_read`` on the rows stored feature by feature (a D x n array), so
  that each column's load is contiguous.

* ``xla``: the batched graph the kernel stands for, compiled by XLA (what a
  GPU rank runs where the kernel does not take its graph).

``--family normal``: a Normal linear regression instead (mean ``x @ beta +
alpha``, ``log_sigma``; its log-density counts the rows), the kernel against
``xla`` only.

Beside the forms, two bounds timed through XLA: reading the rows once, and the
row math of K points alone (on values made in the kernel: no memory traffic).

Every form is checked against numpy on the first 20,000 rows (the largest
relative difference is printed).  Prints a table, writes JSON and a PNG
(``benchmarks/plot.py`` redraws it).  Made for a GPU (Triton); elsewhere Pallas
interprets every form (a check of the script, not a measurement).
"""

import argparse
import contextlib
import os
import sys
import time

import numpy as np
from _common import default_out, gpu_name, machine_info, print_machine, table, write_results

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

D = 5  # features
BLOCK = 256  # rows per block of the hand forms
WARPS = None  # warps per program of the hand forms (None: Pallas's default)
FORMS = ("kernel", "kernel_apart", "xla", "hand", "hand_loop", "hand_f32_math", "hand_points_inner",
         "hand_one_read", "fm", "fm_loop", "fm_one_read")
FAMILY_FORMS = {"bernoulli": FORMS, "normal": ("kernel", "xla")}
FEATURE_MAJOR = ("fm", "fm_loop", "fm_one_read")  # the rows stored feature by feature (D x n)


def _row_math(xs, y, q, jnp):
    """Each row's log-density and gradient factor, PyMC's Bernoulli (a switch
    on y), softplus and sigmoid from one exp(-|eta|)."""
    eta = q[D]
    for j in range(D):
        eta = eta + xs[j] * q[j]
    e = jnp.exp(-jnp.abs(eta))
    l1 = jnp.log1p(e)
    one = y == 1
    logp = jnp.where(one, -(jnp.maximum(-eta, 0) + l1), -(jnp.maximum(eta, 0) + l1))
    s = jnp.where(eta >= 0, 1, e) * (1 / (1 + e))
    return [logp] + [jnp.where(one, 1 - s, -s) * xs[j] for j in range(D)] + [jnp.where(one, 1 - s, -s)]


def _hand(points, n, loop=1, f32=False, inner=False, one_read=False, fm=False):
    """``f(q (points x D+1), x, y) -> (points, D+2)``: logp, gradient by beta, by alpha.
    ``fm``: ``x`` is stored feature by feature (D x n), so each column's load is contiguous."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plt

    blocks = -(-n // BLOCK)
    programs = -(-blocks // loop)
    dtype = jnp.float64

    def _columns(x_ref, safe, mask):
        at = (lambda j: j * n + safe) if fm else (lambda j: safe * D + j)
        return [plt.load(x_ref.at[at(j)], mask=mask, other=0) for j in range(D)]

    def body(q_ref, x_ref, y_ref, o_ref):
        if one_read:
            return _one_read(q_ref, x_ref, y_ref, o_ref)
        k, pid = (pl.program_id(1), pl.program_id(0)) if inner else (pl.program_id(0), pl.program_id(1))
        q = [q_ref[k * (D + 1) + j] for j in range(D + 1)]
        if f32:
            q = [v.astype(jnp.float32) for v in q]

        def block(i, acc):
            index = (pid * loop + i) * BLOCK + jnp.arange(BLOCK)
            mask = index < n
            safe = jnp.where(mask, index, 0)
            xs = _columns(x_ref, safe, mask)
            y = plt.load(y_ref.at[safe], mask=mask, other=0)
            if f32:
                xs = [v.astype(jnp.float32) for v in xs]
            vals = [jnp.where(mask, v, 0).astype(dtype) for v in _row_math(xs, y, q, jnp)]
            return tuple(a + v for a, v in zip(acc, vals))

        zeros = tuple(jnp.zeros((BLOCK,), dtype) for _ in range(D + 2))
        acc = block(0, zeros) if loop == 1 else jax.lax.fori_loop(0, loop, block, zeros)
        for m, a in enumerate(acc):
            o_ref[k * (D + 2) + m, pid] = jnp.sum(a)

    def _one_read(q_ref, x_ref, y_ref, o_ref):
        pid = pl.program_id(0)
        index = pid * BLOCK + jnp.arange(BLOCK)
        mask = index < n
        safe = jnp.where(mask, index, 0)
        xs = _columns(x_ref, safe, mask)
        y = plt.load(y_ref.at[safe], mask=mask, other=0)
        for k in range(points):
            q = [q_ref[k * (D + 1) + j] for j in range(D + 1)]
            for m, v in enumerate(_row_math(xs, y, q, jnp)):
                o_ref[k * (D + 2) + m, pid] = jnp.sum(jnp.where(mask, v, 0))

    grid = (programs,) if one_read else ((programs, points) if inner else (points, programs))
    params = {} if WARPS is None else dict(compiler_params=plt.CompilerParams(num_warps=WARPS))
    call = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((points * (D + 2), programs), dtype),
                          grid=grid, interpret=jax.default_backend() != "gpu", **params)
    def f(q, x, y):
        return jnp.sum(call(q.reshape(-1), x.reshape(-1), y), axis=1).reshape(points, D + 2)
    return jax.jit(f)


def _kernel(apart, family="bernoulli", xla=False):
    """The rows kernel as built, ``f(q, x, y)`` in the hand forms' layout
    (``q``: beta, alpha and the Normal's log_sigma), traced (at its first call)
    with softplus and sigmoid sharing their parts, or ``apart``; ``xla``: the
    batched graph it stands for, through XLA."""
    import jax
    import jax.numpy as jnp
    from _pymc_glm import glm, kernel_op
    from pytensor.link.jax.dispatch import jax_funcify

    from synkhronos._graph.jax_shapes import jax_mode
    from synkhronos.pymc import _blocks
    from synkhronos.pymc._kernel import Kernel, _rewritten, jax_form

    params, rows, single = glm(family, D, "float64")
    op = kernel_op(params, rows, single)
    kernel = jax_funcify(_rewritten(op.batched, jax_mode("JAX"))) if xla else jax_form(op)
    if not xla and not isinstance(kernel, Kernel):
        raise RuntimeError("the rows kernel did not take the %s graph (see the log)" % family)

    @jax.jit
    def jitted(q, x, y):
        logp, grad_beta, *rest = kernel(q[:, :D], *(q[:, j] for j in range(D, q.shape[1])), x, y)
        return jnp.concatenate([logp[:, None], grad_beta] + [r[:, None] for r in rest], axis=1)

    def f(q, x, y):
        with _shared(_blocks, not apart):
            return jitted(q, x, y)
    return f


@contextlib.contextmanager
def _shared(blocks, on):
    kept = blocks.shared_exponentials
    if not on:
        blocks.shared_exponentials = contextlib.nullcontext
    try:
        yield
    finally:
        blocks.shared_exponentials = kept


def _numpy(q, x, y, family="bernoulli"):
    from _pymc_glm import numpy_glm

    return np.array([np.hstack(numpy_glm(family, [qk[:D], *qk[D:]], x, y)) for qk in q])


def _ms(f, args, reps):
    f(*args).block_until_ready()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f(*args).block_until_ready()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def _floors(x, y, points, reps, rounds):
    """Two bounds of any form, timed through XLA: reading the rows once (their
    column sums), and the row math of ``points`` points alone (softplus and
    sigmoid through one exponential, float64, on values made in the kernel
    and summed: no memory traffic)."""
    import jax
    import jax.numpy as jnp

    read = jax.jit(lambda x, y: jnp.sum(x, axis=0) + jnp.sum(y))
    n = x.shape[0]

    def math_of(k):
        def f(scale):
            eta = jax.lax.iota(jnp.float64, k * n) * (1e-7 * scale) - 2
            e = jnp.exp(-jnp.abs(eta))
            return jnp.sum(jnp.log1p(e) + jnp.maximum(eta, 0)) + jnp.sum(jnp.where(eta >= 0, 1, e) / (1 + e))
        return jax.jit(f)

    out = {"read": min(_ms(read, (x, y), reps) for _ in range(rounds))}
    for k in points:
        out["math_%d" % k] = min(_ms(math_of(k), (jnp.float64(1),), reps) for _ in range(rounds))
    return out


def _make(form, points, n, family="bernoulli"):
    if form in ("kernel", "kernel_apart", "xla"):
        return _kernel(form == "kernel_apart", family, xla=form == "xla")
    return _hand(points, n, loop=8 if form in ("hand_loop", "fm_loop") else 1, f32=form == "hand_f32_math",
                 inner=form == "hand_points_inner", one_read=form in ("hand_one_read", "fm_one_read"),
                 fm=form in FEATURE_MAJOR)


def measure(args):
    import jax

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((args.rows, D))
    normal = args.family == "normal"
    y_host = rng.standard_normal(args.rows) if normal else rng.integers(0, 2, args.rows)
    x, y = jax.device_put(x_host), jax.device_put(y_host)
    xt = jax.device_put(np.ascontiguousarray(x_host.T))
    m = min(args.rows, 20_000)
    x_small, y_small = jax.device_put(x_host[:m]), jax.device_put(y_host[:m])
    xt_small = jax.device_put(np.ascontiguousarray(x_host[:m].T))
    records = []
    for k in args.points:
        q = jax.device_put(rng.standard_normal((k, D + 1 + normal)) * 0.3)
        want = _numpy(np.asarray(q), x_host[:m], y_host[:m], args.family)
        for form in args.forms:
            fm = form in FEATURE_MAJOR
            got = np.asarray(_make(form, k, m, args.family)(q, xt_small if fm else x_small, y_small))
            err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
            f = _make(form, k, args.rows, args.family)
            ms = min(_ms(f, (q, xt if fm else x, y), args.reps) for _ in range(args.rounds))
            records.append(dict(form=form, points=k, ms=ms, rel_err=err))
            print("  %-14s %d point(s): %.3f ms (max rel diff %.1e)" % (form, k, ms, err), flush=True)
    dev = jax.devices()[0]
    # (the row math bound is the logistic regression's)
    floors = _floors(x, y, args.points, args.reps, args.rounds) if args.family == "bernoulli" else {}
    return records, dict(device=str(dev.device_kind), platform=dev.platform, jax=jax.__version__,
                         floors=floors)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    p.add_argument("--points", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 4])
    p.add_argument("--reps", type=int, default=100, help="calls per median")
    p.add_argument("--rounds", type=int, default=2, help="medians per form and point count (the least kept)")
    p.add_argument("--family", choices=sorted(FAMILY_FORMS), default="bernoulli")
    p.add_argument("--forms", type=lambda s: s.split(","), default=None,
                   help="default: every form of the family")
    p.add_argument("--out", default=default_out(__file__))
    args = p.parse_args(argv)
    args.forms = args.forms or list(FAMILY_FORMS[args.family])
    unknown = set(args.forms) - set(FAMILY_FORMS[args.family])
    if unknown:
        p.error("forms %s are not written for --family %s" % (sorted(unknown), args.family))
    info = machine_info()
    print_machine(info)
    records, meta = measure(args)
    one = {r["form"]: r["ms"] for r in records if r["points"] == 1}
    print("\n%s (jax %s), %s, %g x %d float64 rows, float64 on every form but hand_f32_math's arithmetic"
          % (meta["device"], meta["jax"], args.family, args.rows, D))
    print(table(["form", "points", "ms", "of 1 point's", "max rel diff"],
                [[r["form"], r["points"], "%.3f" % r["ms"], "%.2fx" % (r["ms"] / one[r["form"]]),
                  "%.1e" % r["rel_err"]] for r in records]))
    floors = meta["floors"]
    if floors:
        maths = ", ".join("%d point(s) %.3f ms" % (k, floors["math_%d" % k]) for k in args.points)
        print("bounds (XLA): reading the rows %.3f ms; the row math alone, %s" % (floors["read"], maths))
    write_results(args.out, dict(benchmark="rows_kernel_forms", machine=info, gpu=gpu_name(), rows=args.rows,
                                 features=D, family=args.family, reps=args.reps, **meta, records=records))


if __name__ == "__main__":
    sys.exit(main())
