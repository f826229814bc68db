"""Scaling on GPU ranks: a compute-bound training step, an MLP gradient over a large
batch held in ``synk.Data``, on 1, 2, 4 (and 8) GPUs, against a plain
``pytensor.function(mode="JAX")`` on one GPU.

One step is ``f(x, y, batch=...)`` (each rank computes the gradient of its rows into
one flat shared vector) followed by ``synk.all_reduce`` of that vector over NCCL;
the single-GPU reference computes the same gradient over the whole batch.
Throughput is rows per second; speedup is against the plain single-GPU function.
Both sides compute float32 products at ``--precision`` (``highest``: full float32,
``synk.fork(precision='highest')`` and JAX's ``highest`` matmul precision for the
plain function; ``tf32``: TensorFloat-32 on both).
Target: speedup >= 0.97 x n at n = 2.  Each n runs in its own process.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from _common import default_out, gpu_name, machine_info, median, print_machine, table, write_results

# JAX's matmul precision for the plain-JAX baseline, per --precision: mirrors what
# synk.fork(precision=...) sets on GPU ranks (bf16 rounds in the graph, so JAX stays at highest).
JAX_MATMUL_PRECISION = {"highest": "highest", "tf32": "tensorfloat32", "bf16": "highest"}


def _model(pt, pytensor, sizes, rng):
    params = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = rng.standard_normal((a, b)).astype("float32") * np.float32(1 / np.sqrt(a))
        params.append(pytensor.shared(w, name="W%d" % i, shape=(a, b)))
        params.append(pytensor.shared(np.zeros(b, dtype="float32"), name="b%d" % i, shape=(b,)))
    x = pt.matrix("x")
    y = pt.matrix("y")  # one-hot targets (PyTensor's JAX arange overflows an int8 past 32767 rows)
    h = x
    for i in range(0, len(params) - 2, 2):
        h = pt.maximum(h.dot(params[i]) + params[i + 1], 0)
    logits = h.dot(params[-2]) + params[-1]
    logp = logits - pt.logsumexp(logits, axis=1, keepdims=True)
    loss = -(logp * y).sum(axis=1).mean()
    grads = pytensor.grad(loss, params)
    flat = pt.concatenate([g.flatten() for g in grads])
    return x, y, params, loss, flat


def child(args):
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    n = args.child_n
    if n:
        synk.fork(n, use_gpu=True, precision=args.precision)
    else:
        import jax

        jax.config.update("jax_default_matmul_precision", JAX_MATMUL_PRECISION[args.precision])
    pytensor.config.floatX = "float32"
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in args.layers.split(",")]
    x, y, params, loss, flat = _model(pt, pytensor, sizes, rng)
    n_params = sum(int(np.prod(p.get_value().shape)) for p in params)
    gshared = pytensor.shared(np.zeros(n_params, dtype="float32"), name="grad", shape=(n_params,))
    x_np = rng.standard_normal((args.batch, sizes[0])).astype("float32")
    y_np = np.eye(sizes[-1], dtype="float32")[rng.integers(0, sizes[-1], args.batch)]
    if n:
        f = synk.function([x, y], outputs=loss, updates=[(gshared, flat)])
        synk.distribute()
        xd, yd = synk.data(x_np), synk.data(y_np)

        def step():
            out = f(xd, yd)
            synk.all_reduce(gshared, op="avg")
            return out
    else:
        import jax

        f = pytensor.function([x, y], loss, updates=[(gshared, flat)], mode="JAX")

        def step():
            out = f(x_np, y_np)
            jax.block_until_ready(gshared.get_value(borrow=True, return_internal_type=True))
            return out
    for _ in range(args.warmup):
        step()
    ts = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    if n:
        synk.close()
    print("RESULT " + json.dumps(child_result(n, ts, n_params)))


def child_result(n, step_times, n_params):
    """What one child reports: ``n`` GPUs (0: plain JAX), median seconds per step."""
    return {"n": n, "step_s": median(step_times), "params": n_params}


def parse_args(argv=None):
    """Command-line options (``--quick`` applied)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="784,8192,8192,10", help="MLP layer sizes")
    p.add_argument("--batch", type=int, default=32768, help="rows per step (all GPUs together)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-n", type=int, default=None, help="largest number of GPUs (default: all)")
    p.add_argument("--quick", action="store_true", help="small model and batch")
    p.add_argument("--precision", choices=("highest", "tf32"), default="highest",
                   help="float32 products on both sides: full float32 or TF32")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/gpu_scaling.json)")
    p.add_argument("--_child", dest="child_n", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.batch, args.steps = "784,1024,1024,10", 8192, 5
    return args


def make_payload(info, args, results, counts):
    """The JSON results file's contents from the children's results ``{n: {"n",
    "step_s", "params"}}`` (``n`` = 0: plain JAX on one GPU) for GPU counts ``counts``."""
    plain = results[0]["step_s"]
    records = []
    for n in counts:
        st = results[n]["step_s"]
        speedup = plain / st
        records.append(dict(n=n, step_ms=st * 1e3, rows_per_s=args.batch / st, speedup=speedup,
                            efficiency=speedup / n))
    return {"benchmark": "gpu_scaling", "machine": info, "layers": args.layers, "batch": args.batch,
            "precision": args.precision, "params": results[0]["params"], "plain_step_ms": plain * 1e3,
            "results": records}


def main(argv=None):
    args = parse_args(argv)
    if args.child_n is not None:
        return child(args)
    import synkhronos as synk

    gpus = len(synk.gpus())
    max_n = min(args.max_n or gpus, gpus)
    counts = [c for c in (1, 2, 4, 8) if c <= max_n]
    info = machine_info()
    info["gpus"] = gpus
    info["gpu_name"] = gpu_name()
    print_machine(info)
    results = {}
    base = [sys.executable, os.path.abspath(__file__), "--layers", args.layers, "--batch", str(args.batch),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--precision", args.precision]
    for n in [0] + counts:
        out = subprocess.run(base + ["--_child", str(n)], capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise SystemExit("run with n=%d failed:\n%s\n%s" % (n, out.stdout[-2000:], out.stderr[-4000:]))
        results[n] = json.loads(line[0][7:])
    plain = results[0]["step_s"]
    payload = make_payload(info, args, results, counts)
    rows = []
    for rec in payload["results"]:
        n, speedup = rec["n"], rec["speedup"]
        target = "PASS" if n != 2 else ("PASS" if speedup >= 0.97 * n else "FAIL")
        rows.append([n, "%.2f" % rec["step_ms"], "%.0f" % rec["rows_per_s"], "%.2f" % speedup,
                     "%.3f" % rec["efficiency"], target if n == 2 else ""])
    print("\nMLP %s, batch %d, %d params; plain JAX on 1 GPU: %.2f ms/step (%.0f rows/s)"
          % (args.layers, args.batch, results[0]["params"], plain * 1e3, args.batch / plain))
    print("float32 products: synk precision=%r, plain JAX precision=%r"
          % (args.precision, args.precision))
    print(table(["GPUs", "ms/step", "rows/s", "speedup", "efficiency", ">=0.97n @2"], rows))
    write_results(args.out or default_out(__file__), payload)


if __name__ == "__main__":
    main()
