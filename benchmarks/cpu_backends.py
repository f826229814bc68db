"""Numba or JAX on CPU workers: first run (empty compile cache) and later runs.

Which linker should CPU ranks use by default?  The one that gets users their
results soonest without losing much per step once compiled.  This script runs
each workload as a user would, on 2 CPU ranks with default settings (nothing set
but the linker), once with an empty PyTensor compile cache ("cold") and once more
on the cache that run filled ("warm"), for each backend:

* ``jax``:   the default (``PYTENSOR_FLAGS`` without a mode): CPU ranks compile
             with JAX, its compiled code kept in a persistent cache;
* ``numba``: ``PYTENSOR_FLAGS=mode=NUMBA``, PyTensor 3's own default linker.

Workloads:

* ``mlp_demo``:   the README's command, ``demos/mnist/train_mnist.py`` (MLP, 30 epochs);
* ``cnn_demo``:   the same demo with ``--model cnn --epochs 5``;
* ``resnet``:     ``demos/resnet/train_resnet.py``'s small CPU configuration, 2 ranks;
* ``likelihood``: a logistic regression's log-likelihood and gradient over
  400,000 x 16 float64 rows (the shape of a PyMC model's likelihood), 2 ranks;
* ``mlp_grad``:   ``cpu_scaling.py``'s MLP 784-1024-1024-10 gradient, batch 4096, 2 ranks.

Reported per workload and backend: the whole command's wall time cold and warm,
and the work once compiled (warm): the median time per training step (the
demos' own figure, over the steps after their first epoch).  ``likelihood`` and
``mlp_grad`` also time the same graph as one plain ``pytensor.function`` (the faster
of Numba and JAX, every core) before forking: the speedup a user gets from 2 ranks.
The ratio ``jax / numba`` of the time per step is the per-step cost of JAX.
Every cold run gets a fresh cache directory of its own (``base_compiledir``, which
holds JAX's persistent cache too), so nothing is shared between backends or rounds.

``python benchmarks/cpu_backends.py --quick`` runs the two demos only, one round.
Results go to ``benchmarks/results/cpu_backends.json`` unless ``--out`` says otherwise.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    default_out,
    machine_info,
    median,
    print_machine,
    table,
    time_calls,
    write_results,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("numba", "jax")  # jax: the default
_MARK = "@@RESULT "
_DEMO = os.path.join(ROOT, "demos", "mnist", "train_mnist.py")
_RESNET = os.path.join(ROOT, "demos", "resnet", "train_resnet.py")
_RESNET_SMALL = ["--cpu", "--blocks", "1,1,1,1", "--image-size", "32", "--width", "8", "--classes", "10",
                 "--batch-size", "16", "--steps", "5", "--warmup", "1"]
_SUMMARY = re.compile(r"median step ([0-9.]+) ms")


# ----------------------------------------------------------------- child side
def _steps(fn, steps):
    fn()  # compiles (JAX) or loads (Numba)
    return median(time_calls(fn, steps))


def _plain_step(inputs, outputs, values, steps):
    """The same graph as one plain ``pytensor.function`` in this process, with
    every core: the faster of PyTensor's Numba and JAX modes, what a user runs
    without Synkhronos.  Timed before ``fork()``.  (``cpu_scaling.py`` compares
    with every single-process choice, ``floatX`` included, at every rank count.)"""
    import numpy as np
    import pytensor

    best = None
    for mode in ("NUMBA", "JAX"):
        f = pytensor.function(inputs, outputs, mode=mode)
        step = _steps(lambda f=f: [np.asarray(o) for o in f(*values)], steps)  # JAX returns before it is done
        best = step if best is None else min(best, step)
    return best


def child_likelihood(steps):
    """Logistic regression log-likelihood and gradient, float64, on 2 ranks."""
    import numpy as np
    import pytensor.tensor as pt

    import synkhronos as synk

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((400_000, 16))
    y_np = (rng.random(400_000) < 0.5).astype("float64")
    x, y = pt.matrix("x", dtype="float64"), pt.vector("y", dtype="float64")
    beta = pt.vector("b", dtype="float64")
    eta = x.dot(beta)
    logp = (y * eta - pt.softplus(eta)).sum()
    grad = pt.grad(logp, beta)
    b_np = rng.standard_normal(16) * 0.1
    plain = _plain_step([x, y, beta], [logp, grad], (x_np, y_np, b_np), steps)
    synk.fork(2)
    f = synk.function([x, y], bcast_inputs=[beta], outputs=[(logp, "sum"), (grad, "sum")])
    synk.distribute()
    xd, yd, bd = synk.data(x_np), synk.data(y_np), synk.data(b_np)
    step = _steps(lambda: f(xd, yd, bd), steps)
    synk.close()
    return {"step_s": step, "plain_step_s": plain}


def child_mlp_grad(steps):
    """cpu_scaling.py's MLP gradient at batch 4096 on 2 ranks."""
    from cpu_scaling import _build_mlp, _make_data

    import synkhronos as synk

    x, y, _, grads = _build_mlp(0)
    data = _make_data(4096, 0)
    plain = _plain_step([x, y], grads, data, steps)
    synk.fork(2)
    f = synk.function([x, y], outputs=grads)
    synk.distribute()
    xd, yd = (synk.data(a) for a in data)
    step = _steps(lambda: f(xd, yd), steps)
    synk.close()
    return {"step_s": step, "plain_step_s": plain}


CHILDREN = {"likelihood": child_likelihood, "mlp_grad": child_mlp_grad}


# ---------------------------------------------------------------- parent side
def _command(workload):
    py = sys.executable
    if workload == "mlp_demo":
        return [py, _DEMO]
    if workload == "cnn_demo":
        return [py, _DEMO, "--model", "cnn", "--epochs", "5"]
    if workload == "resnet":
        return [py, _RESNET, "--_child", "2"] + _RESNET_SMALL
    return [py, os.path.abspath(__file__), "--_child", workload]


def _work(workload, out):
    """(seconds of work once compiled, what they are) from a run's stdout."""
    if workload.endswith("_demo"):  # the demo's training steps after its first epoch
        return {"work_s": float(_SUMMARY.search(out).group(1)) / 1e3, "unit": "s/step"}
    if workload == "resnet":
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
        return {"work_s": 16 * 2 / json.loads(line[7:])["median"], "unit": "s/step"}
    res = json.loads([ln for ln in out.splitlines() if ln.startswith(_MARK)][-1][len(_MARK):])
    return {"work_s": res["step_s"], "plain_s": res["plain_step_s"], "unit": "s/step"}


def run_once(workload, backend, cache_dir, timeout):
    flags = "base_compiledir=%s%s" % (cache_dir, ",mode=NUMBA" if backend == "numba" else "")
    env = dict(os.environ, PYTENSOR_FLAGS=flags)
    env.pop("SYNKHRONOS_LOG_LEVEL", None)
    t0 = time.perf_counter()
    proc = subprocess.run(_command(workload), env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise RuntimeError("%s with %s failed (exit code %d)" % (workload, backend, proc.returncode))
    return dict(_work(workload, proc.stdout), wall_s=wall)


def measure(workloads, rounds, timeout):
    runs = []
    for rnd in range(rounds):
        for workload in workloads:
            for backend in (BACKENDS if rnd % 2 == 0 else BACKENDS[::-1]):
                with tempfile.TemporaryDirectory(prefix="synk_bench_cache_") as cache:
                    cold = run_once(workload, backend, cache, timeout)
                    warm = run_once(workload, backend, cache, timeout)
                runs.append(dict(round=rnd, workload=workload, backend=backend, cold=cold, warm=warm))
                print("  round %d  %-10s %-5s  cold %6.1f s  warm %6.1f s  work (warm) %.4g %s"
                      % (rnd, workload, backend, cold["wall_s"], warm["wall_s"], warm["work_s"],
                         warm["unit"]), flush=True)
    return runs


def summarize(runs, workloads):
    summary = []
    for workload in workloads:
        row = {"workload": workload}
        for backend in BACKENDS:
            mine = [r for r in runs if r["workload"] == workload and r["backend"] == backend]
            row[backend + "_cold_s"] = median([r["cold"]["wall_s"] for r in mine])
            row[backend + "_warm_s"] = median([r["warm"]["wall_s"] for r in mine])
            row[backend + "_work_s"] = median([r["warm"]["work_s"] for r in mine])
            row["unit"] = mine[0]["warm"]["unit"]
            if "plain_s" in mine[0]["warm"]:  # one plain process, timed in every run: all of them
                row["plain_work_s"] = median([r[k]["plain_s"] for r in runs if r["workload"] == workload
                                              for k in ("cold", "warm")])
                row[backend + "_speedup"] = row["plain_work_s"] / row[backend + "_work_s"]
        row["jax_over_numba_work"] = row["jax_work_s"] / row["numba_work_s"]
        summary.append(row)
    return summary


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="mlp_demo,cnn_demo,resnet,likelihood,mlp_grad",
                   help="comma-separated, from: mlp_demo, cnn_demo, resnet, likelihood, mlp_grad")
    p.add_argument("--rounds", type=int, default=2, help="cold+warm pairs per workload and backend [2]")
    p.add_argument("--steps", type=int, default=10, help="timed steps in likelihood and mlp_grad [10]")
    p.add_argument("--timeout", type=float, default=900, help="seconds per command [900]")
    p.add_argument("--quick", action="store_true", help="the two demos, one round")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/cpu_backends.json)")
    p.add_argument("--_child", dest="child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.workloads = ["mlp_demo", "cnn_demo"] if args.quick else args.workloads.split(",")
    args.rounds = 1 if args.quick else args.rounds
    unknown = [w for w in args.workloads if w not in ("mlp_demo", "cnn_demo", "resnet", *CHILDREN)]
    if unknown or args.rounds < 1 or args.steps < 1:
        p.error("--workloads %r: unknown %s; --rounds and --steps must be positive"
                % (args.workloads, unknown))
    return args


def main(argv=None):
    args = _parse(argv)
    if args.child:
        print(_MARK + json.dumps(CHILDREN[args.child](args.steps)), flush=True)
        return
    info = machine_info()
    print_machine(info)
    print("2 CPU ranks, default settings; each backend cold (empty cache) then warm, %d round(s);"
          " float32 demos and MLP, float64 likelihood, on both backends\n" % args.rounds, flush=True)
    runs = measure(args.workloads, args.rounds, args.timeout)
    summary = summarize(runs, args.workloads)
    print()
    print(table(["workload", "numba cold s", "numba warm s", "jax cold s", "jax warm s", "work once compiled",
                 "jax / numba", "2 ranks vs 1 plain process"],
                [[s["workload"]] + ["%.1f" % s[k] for k in ("numba_cold_s", "numba_warm_s", "jax_cold_s",
                                                             "jax_warm_s")]
                 + ["numba %.4g, jax %.4g %s" % (s["numba_work_s"], s["jax_work_s"], s["unit"]),
                    "%.2f" % s["jax_over_numba_work"],
                    "jax %.2fx, numba %.2fx" % (s["jax_speedup"], s["numba_speedup"]) if "jax_speedup" in s
                    else "-"] for s in summary]))
    write_results(args.out or default_out(__file__),
                  {"benchmark": "cpu_backends", "machine": info, "summary": summary, "runs": runs,
                   "settings": {"rounds": args.rounds, "steps": args.steps, "workloads": args.workloads}})


if __name__ == "__main__":
    main()
