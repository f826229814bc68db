"""CPU scaling of an MLP gradient: Synkhronos ranks vs BLAS threads vs raw processes.

The work: the gradients of all parameters of a 784-1024-1024-10 MLP (tanh hidden
layers, softmax cross-entropy on one-hot targets, float32) over a fixed total
batch (``--batch``, default 4096 rows).  For each N in 1, 2, 4, 8, 16 that the
usable cores allow (``len(os.sched_getaffinity(0))``, capped by ``--max-n``):

* threads: one process, plain ``pytensor.function``, N BLAS threads;
* procs:   N plain processes at once ("raw N processes"), each computing the plain
           gradient on its total/N rows with 1 BLAS thread; a step starts at a
           barrier and lasts until the slowest process is done;
* synk:    ``synk.function`` on N CPU ranks (the master is one), 1 BLAS thread
           each, inputs in ``synk.Data``, gradients averaged to the master.

Reported: throughput in rows/s (total batch / median step time) and the ratios
synk/procs (target >= 0.9: Synkhronos should cost little over N independent
processes) and procs/threads.  BLAS thread counts are fixed by environment
variables (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS), which only
work before numpy is imported, so every configuration runs in a fresh subprocess
of this script (``--_child``).  The PyTensor/Numba compile cache is warmed in a
first subprocess and compile time is excluded; each configuration's setup time is
recorded so that a cache miss shows.  Configurations are interleaved over
``--repeats`` rounds (rotating their order) and medians are reported, because
the machine may be shared and noisy; ratios are medians of per-round ratios.

Run ``python benchmarks/cpu_scaling.py --quick`` for a smoke run.  Results go to
``benchmarks/results/cpu_scaling.json`` unless ``--out`` says otherwise.
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
    usable_cores,
    write_results,
)

SIZES = (784, 1024, 1024, 10)
MODES = ("threads", "procs", "synk")
TARGET_SYNK_OVER_PROCS = 0.9
_MARK = "@@RESULT "
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# ----------------------------------------------------------------- child side
def _split(length, parts):
    q, r = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + q + (1 if i < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _make_data(rows, seed):
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

    pytensor.config.floatX = "float32"
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


def _mode(args):
    """The same linker for all three configurations: Synkhronos' CPU ranks would
    take JAX for a function naming no mode, the plain functions PyTensor's own."""
    import pytensor

    return args.mode or str(pytensor.config.mode)


def _timed_steps(fn, steps):
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def child_warm(args):
    """Compile the gradient once (fills the on-disk compile cache)."""
    import pytensor

    t0 = time.perf_counter()
    x, y, _, grads = _build_mlp(args.seed)
    f = pytensor.function([x, y], grads, mode=_mode(args))
    f(*_make_data(64, args.seed))
    return {"compile_s": time.perf_counter() - t0}


def child_threads(args):
    import pytensor

    t0 = time.perf_counter()
    x, y, _, grads = _build_mlp(args.seed)
    f = pytensor.function([x, y], grads, mode=_mode(args))
    xd, yd = _make_data(args.batch, args.seed)
    f(xd, yd)  # first call: loads the compiled code
    setup = time.perf_counter() - t0
    return {"setup_s": setup, "step_s": _timed_steps(lambda: f(xd, yd), args.steps)}


def _proc_worker(rank, n, args, barrier, queue):
    try:
        import pytensor

        x, y, _, grads = _build_mlp(args.seed)
        f = pytensor.function([x, y], grads, mode=_mode(args))
        start, stop = _split(args.batch, n)[rank]
        xd, yd = _make_data(args.batch, args.seed)
        xd, yd = xd[start:stop].copy(), yd[start:stop].copy()
        f(xd, yd)
        marks = []
        for _ in range(args.steps):
            barrier.wait()
            t0 = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
            f(xd, yd)
            marks.append((t0, time.perf_counter()))
        queue.put((rank, marks, None))
    except BaseException as exc:  # reported by the parent
        barrier.abort()
        queue.put((rank, None, repr(exc)))


def child_procs(args):
    import multiprocessing

    n = args.n
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters, env already set
    barrier = ctx.Barrier(n)
    queue = ctx.Queue()
    t0 = time.perf_counter()
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
    steps = [max(m[s][1] for m in marks) - min(m[s][0] for m in marks) for s in range(args.steps)]
    return {"wall_s": time.perf_counter() - t0, "step_s": steps}


def child_synk(args):
    import contextlib
    import io

    import numpy as np

    import synkhronos as synk

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        synk.fork(args.n, use_gpu=False)
    try:
        x, y, _, grads = _build_mlp(args.seed)
        f = synk.function([x, y], outputs=grads, mode=_mode(args))
        with contextlib.redirect_stdout(io.StringIO()):
            synk.distribute()
        xd, yd = _make_data(args.batch, args.seed)
        X, Y = synk.data(xd), synk.data(yd)
        got = f(X, Y)  # first call: every rank loads the compiled code
        setup = time.perf_counter() - t0
        steps = _timed_steps(lambda: f(X, Y), args.steps)
        want = f.as_pytensor(xd, yd)  # the whole batch in the master alone
        same = all(np.allclose(g, w, rtol=1e-3, atol=1e-5) for g, w in zip(got, want))
        return {"setup_s": setup, "step_s": steps, "same_result": bool(same)}
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            synk.close()


CHILDREN = {"warm": child_warm, "threads": child_threads, "procs": child_procs, "synk": child_synk}


# ---------------------------------------------------------------- parent side
def _child_env(threads):
    env = dict(os.environ)
    for v in _THREAD_VARS:
        env[v] = str(threads)
    return env


def run_child(mode, n, args):
    """Run one configuration in a fresh interpreter; returns its result dict."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", mode, "--_n", str(n),
           "--batch", str(args.batch), "--steps", str(args.steps), "--seed", str(args.seed)]
    cmd += ["--mode", args.mode] if args.mode else []
    threads = n if mode == "threads" else 1
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_child_env(threads), capture_output=True, text=True,
                          timeout=args.child_timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            res = json.loads(line[len(_MARK):])
            res.update(mode=mode, n=n, blas_threads=threads, child_wall_s=time.perf_counter() - t0)
            return res
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
    raise RuntimeError("child %s n=%d failed (exit code %d)" % (mode, n, proc.returncode))


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, help="total rows per step [4096; quick 1024]")
    p.add_argument("--steps", type=int, help="timed steps per configuration [10; quick 3]")
    p.add_argument("--max-n", type=int, default=16, help="largest N to try [16]")
    p.add_argument("--repeats", type=int, help="interleaved rounds over all configurations [3; quick 1]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child-timeout", type=float, default=1800, help="seconds per subprocess")
    p.add_argument("--quick", action="store_true", help="small, fast settings for a smoke run")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/cpu_scaling.json)")
    p.add_argument("--_child", dest="child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--_n", dest="n", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--mode", default=None,
                   help="PyTensor mode of all three configurations [PyTensor's own, from its flags]")
    args = p.parse_args(argv)
    quick = args.quick and not args.child
    for key, default, small in (("batch", 4096, 1024), ("steps", 10, 3), ("repeats", 3, 1)):
        if getattr(args, key) is None:  # explicit options win over --quick
            setattr(args, key, small if quick else default)
    if args.batch < 1 or args.steps < 1 or args.repeats < 1 or args.max_n < 1:
        p.error("--batch, --steps, --repeats and --max-n must be positive")
    return args


def _fmt_rate(v):
    return "%.0f" % v if v is not None else "n/a"


def main(argv=None):
    args = _parse(argv)
    if args.child:
        print(_MARK + json.dumps(CHILDREN[args.child](args)), flush=True)
        return

    info = machine_info()
    print_machine(info)
    cores = usable_cores()
    ns = [n for n in (1, 2, 4, 8, 16) if n <= min(cores, args.max_n)]
    print("MLP %s gradient, float32, batch %d, %d steps per configuration, N = %s, %d round(s)"
          % ("-".join(map(str, SIZES)), args.batch, args.steps, ns, args.repeats))
    print("(timings on a shared machine are noisy: configurations interleaved, medians reported)\n",
          flush=True)

    warm = run_child("warm", 1, args)
    print("compile-cache warm-up: %.1f s (cold compile if long, cache hit if short)\n" % warm["compile_s"],
          flush=True)
    runs = []
    for rnd in range(args.repeats):
        for n in ns:
            order = MODES[rnd % 3:] + MODES[:rnd % 3]
            for mode in order:
                res = run_child(mode, n, args)
                res["round"] = rnd
                res["median_step_s"] = median(res["step_s"])
                res["rows_per_s"] = args.batch / res["median_step_s"]
                runs.append(res)
                print("  round %d  N=%-2d %-7s %8.0f rows/s  (median step %.3f s, setup %s)"
                      % (rnd, n, mode, res["rows_per_s"], res["median_step_s"],
                         "%.1f s" % res["setup_s"] if "setup_s" in res else "-"), flush=True)

    summary = []
    base = None
    for n in ns:
        by_mode = {m: [r for r in runs if r["n"] == n and r["mode"] == m] for m in MODES}
        rate = {m: median([r["rows_per_s"] for r in by_mode[m]]) for m in MODES}
        per_round = {}
        for r in runs:
            if r["n"] == n:
                per_round.setdefault(r["round"], {})[r["mode"]] = r["rows_per_s"]
        s_over_p = median([v["synk"] / v["procs"] for v in per_round.values()])
        p_over_t = median([v["procs"] / v["threads"] for v in per_round.values()])
        if n == 1:
            base = rate["threads"]
        summary.append({
            "n": n,
            "threads_rows_per_s": rate["threads"],
            "procs_rows_per_s": rate["procs"],
            "synk_rows_per_s": rate["synk"],
            "synk_over_procs": s_over_p,
            "procs_over_threads": p_over_t,
            "synk_speedup_vs_1_thread": None if base is None else rate["synk"] / base,
            "synk_same_result": all(r.get("same_result", True) for r in by_mode["synk"]),
            "target_met": s_over_p >= TARGET_SYNK_OVER_PROCS,
        })

    rows = [[s["n"], _fmt_rate(s["threads_rows_per_s"]), _fmt_rate(s["procs_rows_per_s"]),
             _fmt_rate(s["synk_rows_per_s"]), "%.2f" % s["synk_over_procs"],
             "PASS" if s["target_met"] else "FAIL", "%.2f" % s["procs_over_threads"],
             "n/a" if s["synk_speedup_vs_1_thread"] is None else "%.2f" % s["synk_speedup_vs_1_thread"],
             "ok" if s["synk_same_result"] else "DIFF"] for s in summary]
    print("\nthroughput, rows/s (median over rounds); %d usable cores" % cores)
    print(table(["N", "threads", "procs", "synk", "synk/procs", ">=0.9", "procs/threads",
                 "synk vs 1 thread", "result"], rows))
    results = {
        "benchmark": "cpu_scaling",
        "machine": info,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "child", "n")},
        "ns": ns,
        "warm_up": warm,
        "summary": summary,
        "runs": runs,
    }
    write_results(args.out or default_out(__file__), results)


if __name__ == "__main__":
    main()
