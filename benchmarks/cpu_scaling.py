"""CPU scaling: Synkhronos ranks, with default settings, against the best single
process a user could write, at every rank count.

Workloads (``--workload``):

* ``mlp``: the gradients of all parameters of a 784-1024-1024-10 MLP (tanh hidden
  layers, softmax cross-entropy on one-hot targets), float32, over a total batch
  of ``--batch`` rows (default 4096);
* ``likelihood``: a logistic regression's log-likelihood and its gradient over
  ``--rows`` x 16 float64 rows (default 400,000): the shape of a PyMC model's
  likelihood.

Configurations, each in a fresh process (thread counts are read as libraries load):

* ``single:<linker>``: one plain ``pytensor.function`` with every core of the
  machine, the data held in shared variables (no copy per call).  Linkers:
  ``default`` (PyTensor's default mode), ``jax`` (``mode="JAX"``) and, for the
  float32 MLP, ``jax-f32``: JAX with ``floatX=float32``.  (Where ``floatX`` is
  float64, PyTensor's JAX backend returns a float32 sum as float64, and a float32
  network's gradient then runs in float64; setting ``floatX`` avoids that.)  The
  best single process of a round is the fastest of them.
* ``procs N``: N raw processes, each a plain JAX function on its share of the
  rows, pinned to a core of its own; a step starts at a barrier and lasts until
  the slowest is done: what N hand-managed processes give, before any reduction.
* ``synk N``: ``synk.function`` on N CPU ranks (the master is one) with default
  settings, the data in ``synk.Data``, the outputs reduced into the master.

N runs over every count from 1 to the usable cores (``--max-n`` caps it; ``--ns``
lists others).  Reported per N: the median step, the speedup of Synkhronos over
the best single process (medians of per-round ratios), that speedup per rank,
and Synkhronos against the raw processes.  Configurations are interleaved over
``--repeats`` rounds; compile time is excluded (a first process fills the
caches; not with ``--quick``) and each configuration's set-up time is recorded.

``python benchmarks/cpu_scaling.py --quick`` is a smoke run.  Results go to
``benchmarks/results/cpu_scaling[_likelihood].json`` unless ``--out`` says otherwise.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    default_out,
    machine_info,
    median,
    print_machine,
    table,
    time_calls,
    usable_cores,
    write_results,
)

SIZES = (784, 1024, 1024, 10)
FEATURES = 16
SINGLES = {"mlp": ("default", "jax", "jax-f32"), "likelihood": ("default", "jax")}
_MARK = "@@RESULT "
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


# ----------------------------------------------------------------- workloads
def _split(length, parts):
    q, r = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + q + (1 if i < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _make_data(rows, seed):
    """The MLP's inputs and one-hot targets."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, SIZES[0]), dtype=np.float32)
    y = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], rows)]
    return x, y


def _build_mlp(seed):
    """Symbolic inputs, parameters (shared) and gradients of the mean loss."""
    import numpy as np
    import pytensor
    import pytensor.tensor as pt

    rng = np.random.default_rng(seed + 12345)
    params = []
    for i, (n_in, n_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        b = np.zeros(n_out, np.float32)
        params += [pytensor.shared(w, name="W%d" % i), pytensor.shared(b, name="b%d" % i)]
    x = pt.matrix("x", dtype="float32")
    y = pt.matrix("y", dtype="float32")
    h = x
    for i in range(0, len(params) - 2, 2):
        h = pt.tanh(h.dot(params[i]) + params[i + 1])
    logp = pt.special.log_softmax(h.dot(params[-2]) + params[-1], axis=1)
    loss = -(y * logp).sum(axis=1).mean()
    return x, y, params, pt.grad(loss, params)


def _likelihood_data(rows, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES))
    y = (rng.random(rows) < 0.5).astype("float64")
    return x, y, rng.standard_normal(FEATURES) * 0.1


def workload(args):
    """``(data inputs, other inputs, outputs, reduce modes, data, other values)``."""
    import pytensor.tensor as pt

    if args.workload == "mlp":
        x, y, _, grads = _build_mlp(args.seed)
        return [x, y], [], grads, ["avg"] * len(grads), _make_data(args.batch, args.seed), []
    x, y = pt.matrix("x", dtype="float64"), pt.vector("y", dtype="float64")
    beta = pt.vector("beta", dtype="float64")
    eta = x.dot(beta)
    logp = (y * eta - pt.softplus(eta)).sum()
    x_np, y_np, b_np = _likelihood_data(args.rows, args.seed)
    return [x, y], [beta], [logp, pt.grad(logp, beta)], ["sum", "sum"], (x_np, y_np), [b_np]


def _mode(linker):
    return "JAX" if linker.startswith("jax") else None


def _resident(args, linker, data_slice=slice(None)):
    """A plain function of the workload with its data in shared variables, and its arguments."""
    import pytensor

    data_vars, others, outputs, _, data, values = workload(args)
    givens = [(v, pytensor.shared(d[data_slice].copy())) for v, d in zip(data_vars, data)]
    f = pytensor.function(others, outputs, givens=givens, mode=_mode(linker))
    return f, values


# ----------------------------------------------------------------- child side
def _call(f, values):
    import numpy as np

    return [np.asarray(o) for o in f(*values)]


def child_single(args):
    t0 = time.perf_counter()
    f, values = _resident(args, args.linker)
    _call(f, values)  # compiles (JAX) or loads (C, Numba)
    return {"setup_s": time.perf_counter() - t0, "step_s": time_calls(lambda: _call(f, values), args.steps)}


def _proc_worker(rank, n, args, barrier, queue):
    try:
        os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[rank]])  # before JAX sizes its pool
        start, stop = _split(args.batch if args.workload == "mlp" else args.rows, n)[rank]
        f, values = _resident(args, "jax", slice(start, stop))
        _call(f, values)
        marks = []
        for _ in range(args.steps):
            barrier.wait()
            t0 = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
            _call(f, values)
            marks.append((t0, time.perf_counter()))
        queue.put((rank, marks, None))
    except BaseException as exc:  # reported by the parent
        barrier.abort()
        queue.put((rank, None, repr(exc)))


def child_procs(args):
    import multiprocessing

    n = args.n
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters, env already set
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_proc_worker, args=(r, n, args, barrier, queue)) for r in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=1800) for _ in range(n)]
    for p in procs:
        p.join(60)
    errors = [e for _, _, e in results if e]
    if errors:
        raise RuntimeError("raw process failed: %s" % errors[0])
    marks = [m for _, m, _ in sorted(results)]
    return {"step_s": [max(m[s][1] for m in marks) - min(m[s][0] for m in marks) for s in range(args.steps)]}


def child_synk(args):
    import contextlib
    import io

    import numpy as np

    import synkhronos as synk

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        synk.fork(args.n, use_gpu=False)
    try:
        data_vars, others, outputs, modes, data, values = workload(args)
        f = synk.function(data_vars, bcast_inputs=others, outputs=list(zip(outputs, modes)))
        with contextlib.redirect_stdout(io.StringIO()):
            synk.distribute()
        inputs = [synk.data(d) for d in data] + [synk.data(v) for v in values]
        got = f(*inputs)  # first call: every rank compiles or loads its code
        setup = time.perf_counter() - t0
        steps = time_calls(lambda: f(*inputs), args.steps)
        want = f.as_pytensor(*data, *values)  # every row in the master alone
        same = all(np.allclose(g, w, rtol=1e-3, atol=1e-5) for g, w in zip(got, want))
        return {"setup_s": setup, "step_s": steps, "same_result": bool(same)}
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            synk.close()


CHILDREN = {"single": child_single, "procs": child_procs, "synk": child_synk}


# ---------------------------------------------------------------- parent side
def _child_env(kind, linker, workload):
    """The user's environment without thread settings; raw processes get one
    thread each, and JAX's float32 runs (``jax-f32``, the MLP's raw processes)
    ``floatX=float32``."""
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARS}
    if kind == "procs":
        env.update({v: "1" for v in _THREAD_VARS})
    if linker == "jax-f32" or (kind == "procs" and workload == "mlp"):
        flags = env.get("PYTENSOR_FLAGS", "")
        env["PYTENSOR_FLAGS"] = (flags + "," if flags else "") + "floatX=float32"
    return env


def run_child(kind, n, args, linker=""):
    """Run one configuration in a fresh interpreter; returns its result dict."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", kind, "--_n", str(n), "--_linker", linker,
           "--workload", args.workload, "--batch", str(args.batch), "--rows", str(args.rows),
           "--steps", str(args.steps), "--seed", str(args.seed)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_child_env(kind, linker, args.workload), capture_output=True, text=True,
                          timeout=args.child_timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            res = json.loads(line[len(_MARK):])
            res.update(kind=kind, n=n, linker=linker, child_wall_s=time.perf_counter() - t0)
            res["median_step_s"] = median(res["step_s"])
            return res
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
    raise RuntimeError("child %s %s n=%d failed (exit code %d)" % (kind, linker, n, proc.returncode))


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(SINGLES), default="mlp")
    p.add_argument("--batch", type=int, help="MLP: total rows per step [4096; quick 1024]")
    p.add_argument("--rows", type=int, help="likelihood: rows [400000; quick 40000]")
    p.add_argument("--steps", type=int, help="timed steps per configuration [10; quick 3]")
    p.add_argument("--max-n", type=int, default=None, help="largest N [the usable cores]")
    p.add_argument("--ns", default=None, help="comma-separated rank counts [every one from 1 to --max-n]")
    p.add_argument("--repeats", type=int, help="interleaved rounds over all configurations [2; quick 1]")
    p.add_argument("--no-procs", action="store_true", help="skip the raw processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child-timeout", type=float, default=1800, help="seconds per subprocess")
    p.add_argument("--quick", action="store_true", help="small, fast settings for a smoke run")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/cpu_scaling*.json)")
    p.add_argument("--_child", dest="child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--_n", dest="n", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--_linker", dest="linker", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick and not args.child
    for key, default, small in (("batch", 4096, 1024), ("rows", 400_000, 40_000), ("steps", 10, 3),
                                ("repeats", 2, 1)):
        if getattr(args, key) is None:  # explicit options win over --quick
            setattr(args, key, small if quick else default)
    if min(args.batch, args.rows, args.steps, args.repeats, args.max_n or 1) < 1:
        p.error("--batch, --rows, --steps, --repeats and --max-n must be positive")
    return args


def rank_counts(args):
    top = min(usable_cores(), args.max_n or usable_cores())
    if args.ns:
        return [n for n in (int(v) for v in args.ns.split(",")) if 1 <= n <= top]
    return [1, 2] if args.quick else list(range(1, top + 1))


def measure(args, ns):
    runs = []
    for rnd in range(args.repeats):
        configs = [("single", 0, linker) for linker in SINGLES[args.workload]]
        configs += [("synk", n, "") for n in ns] + ([] if args.no_procs else [("procs", n, "") for n in ns])
        if rnd % 2:
            configs.reverse()
        for kind, n, linker in configs:
            res = run_child(kind, n, args, linker)
            res["round"] = rnd
            runs.append(res)
            print("  round %d  %-6s %-8s N=%-2d median step %8.2f ms%s" % (
                rnd, kind, linker, n, res["median_step_s"] * 1e3,
                "  (set-up %.1f s)" % res["setup_s"] if "setup_s" in res else ""), flush=True)
    return runs


def summarize(runs, ns):
    rounds = sorted({r["round"] for r in runs})
    best = {}  # round -> (seconds, linker) of its fastest single process
    for rnd in rounds:
        best[rnd] = min((r["median_step_s"], r["linker"]) for r in runs
                        if r["kind"] == "single" and r["round"] == rnd)
    singles = {}
    for r in runs:
        if r["kind"] == "single":
            singles.setdefault(r["linker"], []).append(r["median_step_s"])
    summary = []
    for n in ns:
        mine = {k: {r["round"]: r for r in runs if r["kind"] == k and r["n"] == n} for k in ("synk", "procs")}
        speedups = [best[rnd][0] / mine["synk"][rnd]["median_step_s"] for rnd in mine["synk"]]
        row = {"n": n, "synk_step_s": median([r["median_step_s"] for r in mine["synk"].values()]),
               "speedup": median(speedups),
               "synk_same_result": all(r["same_result"] for r in mine["synk"].values())}
        row["speedup_per_rank"] = row["speedup"] / n
        if mine["procs"]:
            row["procs_step_s"] = median([r["median_step_s"] for r in mine["procs"].values()])
            row["synk_over_procs"] = median([
                mine["procs"][rnd]["median_step_s"] / mine["synk"][rnd]["median_step_s"]
                for rnd in mine["synk"] if rnd in mine["procs"]])
        summary.append(row)
    best_linkers = sorted({linker for _, linker in best.values()})
    return summary, {k: median(v) for k, v in singles.items()}, best_linkers


def _ms(v):
    return "-" if v is None else "%.1f" % (v * 1e3)


def report(args, summary, singles, best_linkers):
    print("\nsingle process, every core, median step (ms): " + ", ".join(
        "%s %.1f" % (k, v * 1e3) for k, v in singles.items()) + "; fastest: %s" % "/".join(best_linkers))
    rows = [[s["n"], _ms(s["synk_step_s"]), _ms(s.get("procs_step_s")), "%.2f" % s["speedup"],
             "%.2f" % s["speedup_per_rank"],
             "-" if "synk_over_procs" not in s else "%.2f" % s["synk_over_procs"],
             "ok" if s["synk_same_result"] else "DIFF"] for s in summary]
    print(table(["N", "synk ms", "raw procs ms", "speedup vs best single", "per rank", "synk / procs (speed)",
                 "result"], rows))


def main(argv=None):
    args = _parse(argv)
    if args.child:
        print(_MARK + json.dumps(CHILDREN[args.child](args)), flush=True)
        return
    info = machine_info()
    print_machine(info)
    ns = rank_counts(args)
    if args.workload == "mlp":
        what = "MLP %s gradient, float32, batch %d" % ("-".join(map(str, SIZES)), args.batch)
    else:
        what = "logistic log-likelihood and gradient, %d x %d float64" % (args.rows, FEATURES)
    print("%s; %d steps per configuration; N = %s; %d round(s)\n" % (what, args.steps, ns, args.repeats),
          flush=True)
    # Fills the compile caches (a smoke run takes its first round as it comes).
    warm = [] if args.quick else [run_child("single", 0, args, linker) for linker in SINGLES[args.workload]]
    runs = measure(args, ns)
    summary, singles, best_linkers = summarize(runs, ns)
    report(args, summary, singles, best_linkers)
    name = "cpu_scaling" if args.workload == "mlp" else "cpu_scaling_likelihood"
    results = {
        "benchmark": "cpu_scaling",
        "workload": args.workload,
        "what": what,
        "machine": info,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "child", "n", "linker")},
        "ns": ns,
        "warm_up_s": [w["setup_s"] for w in warm],
        "singles_step_s": singles,
        "best_single": best_linkers,
        "summary": summary,
        "runs": runs,
    }
    write_results(args.out or os.path.join(os.path.dirname(default_out(__file__)), name + ".json"), results)


if __name__ == "__main__":
    main()
