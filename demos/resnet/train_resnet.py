"""Train ResNet-50 (bottleneck blocks, batch norm) on synthetic ImageNet-shaped data
with Synkhronos, and report images/s and the speedup over one rank.

Like the original Synkhronos demo, the data is random (the point is throughput);
each step is one exact data-parallel SGD-with-momentum step
(``synkhronos.extensions.train``).  Batch norm uses each rank's batch statistics,
as PyTorch DDP does without SyncBatchNorm; running averages are not kept.
``--blocks``, ``--width``, ``--image-size`` and ``--classes`` shrink the network for
a quick run on CPU workers (``--cpu``).  ``--plot steps.png`` draws the loss and
images/s of every timed step.

The warmup steps compile the step function (Synkhronos says so on stderr when that
takes a while); later runs load it from PyTensor's cache (or, on GPUs, JAX
compiles it again).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def build_resnet(pytensor, pt, nnet, blocks, width, classes, rng):
    """Shared parameters and ``logits(x)`` of a bottleneck ResNet (NCHW input)."""
    fx = pytensor.config.floatX
    params = []

    def conv_w(o, c, k):
        w = (rng.standard_normal((o, c, k, k)) * np.sqrt(2.0 / (c * k * k))).astype(fx)
        params.append(pytensor.shared(w, shape=w.shape, name="conv%d" % len(params)))
        return params[-1]

    def bn_params(c):
        g = pytensor.shared(np.ones(c, fx), shape=(c,), name="gamma%d" % len(params))
        b = pytensor.shared(np.zeros(c, fx), shape=(c,), name="beta%d" % len(params))
        params.extend([g, b])
        return g, b

    def conv_bn(c_in, c_out, k, stride, relu):
        w, (g, b) = conv_w(c_out, c_in, k), bn_params(c_out)

        def apply(h):
            h = nnet.batch_norm(nnet.conv2d(h, w, stride=stride, padding=k // 2), g, b)
            return pt.maximum(h, 0) if relu else h
        return apply

    stem = conv_bn(3, width, 7, 2, True)
    layers, c_in = [], width
    for stage, n_blocks in enumerate(blocks):
        mid = width * 2 ** stage
        for i in range(n_blocks):
            stride = 2 if (i == 0 and stage > 0) else 1
            c_out = 4 * mid
            body = [conv_bn(c_in, mid, 1, 1, True), conv_bn(mid, mid, 3, stride, True),
                    conv_bn(mid, c_out, 1, 1, False)]
            short = conv_bn(c_in, c_out, 1, stride, False) if (stride != 1 or c_in != c_out) else None
            layers.append((body, short))
            c_in = c_out
    fc = pytensor.shared((rng.standard_normal((c_in, classes)) * np.sqrt(1.0 / c_in)).astype(fx),
                         shape=(c_in, classes), name="fc")
    fc_b = pytensor.shared(np.zeros(classes, fx), shape=(classes,), name="fc_b")
    params.extend([fc, fc_b])

    def logits(x):
        h = nnet.max_pool2d(stem(x), 3, stride=2, padding=1)
        for body, short in layers:
            out = h
            for f in body:
                out = f(out)
            h = pt.maximum(out + (short(h) if short is not None else h), 0)
        return h.mean(axis=(2, 3)).dot(fc) + fc_b

    return params, logits


def measure(args, n):
    """Train ``args.steps`` steps on ``n`` ranks; returns the median images/s and,
    per timed step, the loss and images/s."""
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk
    from synkhronos.extensions import nnet, train, updates

    pytensor.config.floatX = "float32"  # the model in float32 (PyTensor's default is float64)
    n = synk.fork(n, use_gpu=not args.cpu)
    rng = np.random.default_rng(0)
    blocks = [int(b) for b in args.blocks.split(",")]
    params, logits = build_resnet(pytensor, pt, nnet, blocks, args.width, args.classes, rng)
    x, y = pt.tensor4("x"), pt.matrix("y")
    loss = nnet.softmax_cross_entropy(logits(x), y)
    step = train.make_train_step([x, y], loss, params, rule=updates.momentum, learning_rate=0.1, momentum=0.9)
    synk.distribute()
    fx = pytensor.config.floatX
    batch = args.batch_size * n
    xd = synk.data(rng.standard_normal((batch, 3, args.image_size, args.image_size)).astype(fx))
    yd = synk.data(np.eye(args.classes, dtype=fx)[rng.integers(0, args.classes, batch)])
    rates, losses = [], []
    for s in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        value = float(step(xd, yd))
        dt = time.perf_counter() - t0
        if s >= args.warmup:
            rates.append(batch / dt)
            losses.append(value)
            print("  %d rank(s) step %d: loss %.3f, %.1f images/s" % (n, s - args.warmup, value, batch / dt),
                  flush=True)
    synk.close()
    return {"median": float(np.median(rates)), "losses": losses, "rates": rates, "ranks": n}


def plot_steps(path, runs, title):
    """Write the loss and images/s per timed step of each run (``runs``: ranks ->
    ``measure``'s result) to the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_rate) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for n, run in sorted(runs.items()):
        steps = np.arange(1, len(run["losses"]) + 1)
        label = "%d rank%s" % (n, "" if n == 1 else "s")
        ax_loss.plot(steps, run["losses"], "o-", ms=4, label=label)
        ax_rate.plot(steps, run["rates"], "o-", ms=4, label="%s (median %.1f)" % (label, run["median"]))
    ax_loss.set(title="Training loss (same synthetic batch each step)", xlabel="timed step",
                ylabel="loss (softmax cross-entropy)")
    ax_rate.set(title="Throughput", xlabel="timed step", ylabel="images/s (all ranks)")
    ax_rate.set_ylim(bottom=0)
    for ax in (ax_loss, ax_rate):
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=None,
                   help="ranks to use (default: all GPUs, or 2 with --cpu; under mpirun: every rank)")
    p.add_argument("--cpu", action="store_true", help="CPU workers instead of GPUs")
    p.add_argument("--batch-size", type=int, default=64, help="images per rank per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps (compilation) before timing")
    p.add_argument("--blocks", default="3,4,6,3", help="bottleneck blocks per stage (ResNet-50: 3,4,6,3)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="write the loss and images/s per step to this PNG file (needs matplotlib)")
    p.add_argument("--_child", dest="child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plot and args.child is None:  # fail now, not after training
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib: pip install matplotlib")
    if args.child is not None:
        print("RESULT " + json.dumps(measure(args, args.child)))
        return None
    import synkhronos as synk

    if synk.mpi_launched():  # under mpirun: every rank runs this one setting (rank 0 returns from fork)
        run = measure(args, args.gpus)
        print("Summary: ResNet blocks %s on %d MPI ranks: %.1f images/s"
              % (args.blocks, run["ranks"], run["median"]))
        return {run["ranks"]: run["median"]}
    if args.gpus is None:
        args.gpus = 2 if args.cpu else max(1, len(synk.gpus()))
    runs = {}
    for n in sorted({1, args.gpus}):  # one process per setting: a fresh fork each
        cmd = [sys.executable, os.path.abspath(__file__), "--_child", str(n)] + (argv or sys.argv[1:])
        # The child's stderr (Synkhronos' status lines: forking, compiling) goes straight to ours.
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        sys.stdout.write("".join(ln + "\n" for ln in out.stdout.splitlines() if ln.startswith("  ")))
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            raise SystemExit("run on %d rank(s) failed (exit code %d; its errors are above)"
                             % (n, out.returncode))
        runs[n] = json.loads(line[0][7:])
    rates = {k: run["median"] for k, run in runs.items()}
    n = args.gpus
    print("Summary: %s on %d %s: %.1f images/s (1 rank: %.1f), speedup %.2f, efficiency %.3f"
          % ("ResNet blocks " + args.blocks, n, "CPU ranks" if args.cpu else "GPUs", rates[n], rates[1],
             rates[n] / rates[1], rates[n] / rates[1] / n))
    if args.plot:
        plot_steps(args.plot, runs, "ResNet blocks %s, width %d, %dx%d images, %d per rank, %s"
                   % (args.blocks, args.width, args.image_size, args.image_size, args.batch_size,
                      "CPU ranks" if args.cpu else "GPUs"))
        print("Curves written to %s" % args.plot)
    return rates


if __name__ == "__main__":
    main()
