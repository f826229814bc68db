"""A tiny call on n GPUs written by hand: n processes, one per GPU, each with the
same jitted JAX function; the master posts a call number in shared memory, every
process computes its rows and copies its result to the host, and the master sums
them.  Both sides spin (no sleeping anywhere): the floor of a control path.

Also timed: each process calling its function alone in a loop while the others do
the same on their GPUs (no coordination), to see whether concurrent processes slow
each other's JAX calls.

    python benchmarks/_raw_tiny_call.py --ranks 1,2,4 --calls 2000

A diagnostic beside ``call_overhead.py --gpu`` (the docs page "Benchmarks", *Several
GPUs*): it prints its table and writes its JSON (no picture).
"""

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

ROWS, COLS, OUT = 64, 32, 16


def _setup(rank):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_default_matmul_precision", "highest")
    rng = np.random.default_rng(0)
    w = jax.device_put(rng.standard_normal((COLS, OUT)).astype("float32"))
    f = jax.jit(lambda x, w: jnp.mean(x @ w))
    return f, w


def _alone(rank, n, flags, alone, calls):
    """Rank ``rank``'s function and rows, warmed up, after every process timed its
    own calls at once (``alone[rank]``: the median)."""
    f, w = _setup(rank)
    rows = np.random.default_rng(rank).standard_normal((ROWS // n, COLS)).astype("float32")
    for _ in range(50):
        np.asarray(f(rows, w))
    flags[n + rank] = 1
    while min(flags[n:2 * n]) < 1:
        pass
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        np.asarray(f(rows, w))
        times.append(time.perf_counter() - t)
    alone[rank] = statistics.median(times)
    flags[n + rank] = 2
    return f, w, rows


def _worker(rank, n, flags, results, alone, calls):
    f, w, rows = _alone(rank, n, flags, alone, calls)
    # Coordinated: wait for call k, compute, post the result.
    k = 0
    while True:
        while flags[rank] == k:
            pass
        k = flags[rank]
        if k < 0:
            return
        results[rank] = float(np.asarray(f(rows, w)))
        flags[2 * n + rank] = k


def run(n, calls):
    ctx = mp.get_context("spawn")
    flags = ctx.RawArray("q", 3 * n)
    results = ctx.RawArray("d", n)
    alone = ctx.RawArray("d", n)
    procs = [ctx.Process(target=_worker, args=(r, n, flags, results, alone, calls)) for r in range(1, n)]
    for p in procs:
        p.start()
    f, w, rows = _alone(0, n, flags, alone, calls)
    while min(flags[n:2 * n]) < 2:
        pass
    times = []
    for k in range(1, calls + 1):
        t = time.perf_counter()
        for r in range(1, n):
            flags[r] = k
        total = float(np.asarray(f(rows, w)))
        for r in range(1, n):
            while flags[2 * n + r] != k:
                pass
            total += results[r]
        times.append(time.perf_counter() - t)
    for r in range(1, n):
        flags[r] = -1
    for p in procs:
        p.join()
    times.sort()
    return dict(ranks=n, coordinated_us=statistics.median(times) * 1e6,
                coordinated_p90_us=times[int(0.9 * len(times))] * 1e6,
                alone_us=[a * 1e6 for a in alone])


def main():
    from _common import default_out, machine_info, module_version, print_machine, write_json

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2,4", help="comma-separated process counts [%(default)s]")
    p.add_argument("--calls", type=int, default=2000, help="timed calls per count [%(default)s]")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/_raw_tiny_call.json)")
    args = p.parse_args()
    info = machine_info()
    print_machine(info)
    print("jax %s, float32 products in full float32" % module_version("jax"))
    print("ranks  coordinated  p90   each process alone at once (us)")
    rows = []
    for n in [int(r) for r in args.ranks.split(",")]:
        r = run(n, args.calls)
        rows.append(r)
        print("%5d  %11.1f  %5.1f  %s" % (n, r["coordinated_us"], r["coordinated_p90_us"],
                                          " ".join("%.1f" % a for a in r["alone_us"])), flush=True)
    write_json(args.out or default_out(__file__), {"benchmark": "raw_tiny_call", "machine": info,
                                                     "settings": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
