"""Does bf16 mixed precision train like float32?  ResNet training losses, step by step,
with ``fork(precision='highest')`` and ``fork(precision='bf16')`` on the same data.

Both runs train the ResNet of ``demos/resnet`` (ResNet-50 by default) on one GPU (or
CPU workers with ``--cpu``, where bf16 is emulated and slow: use a small model) from
the same initial parameters, on the same synthetic batches (a fixed set of
``--batches`` random batches with random labels, cycled, so the loss must fall), with
momentum SGD.  Each run is its own process.  Reported: the two loss curves and their
difference per step, and images/s of each (the images travel from ``synk.Data`` every
step, so these rates are below those of ``resnet50_scaling.py``, whose images live on
the GPU).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from _common import default_out, gpu_name, machine_info, print_machine, table, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
PRECISIONS = ("highest", "bf16")


def child(args):
    """Losses of ``args.steps`` steps at ``args.precision``; printed as JSON."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "demos", "resnet"))
    import pytensor
    import pytensor.tensor as pt
    from train_resnet import build_resnet

    import synkhronos as synk
    from synkhronos.extensions import nnet, train, updates

    pytensor.config.floatX = "float32"  # the model in float32 (PyTensor's default is float64)
    synk.fork(1, use_gpu=not args.cpu, precision=args.precision)
    try:
        fx = pytensor.config.floatX
        rng = np.random.default_rng(0)
        blocks = [int(b) for b in args.blocks.split(",")]
        params, logits = build_resnet(pytensor, pt, nnet, blocks, args.width, args.classes, rng)
        b, size = args.batch_size, args.image_size
        x, y = pt.tensor4("x"), pt.matrix("y")
        step = train.make_train_step([x, y], nnet.softmax_cross_entropy(logits(x), y), params,
                                     rule=updates.momentum, learning_rate=args.learning_rate, momentum=0.9)
        synk.distribute()
        n = b * args.batches
        xd = synk.data(rng.standard_normal((n, 3, size, size)).astype(fx))
        yd = synk.data(np.eye(args.classes, dtype=fx)[rng.integers(0, args.classes, n)])
        losses, t0 = [], None
        for s in range(args.steps):
            if s == 2:
                t0 = time.perf_counter()  # after the compiling steps
            k = s % args.batches
            losses.append(float(step(xd, yd, batch=slice(k * b, (k + 1) * b))))
        rate = b * (args.steps - 2) / (time.perf_counter() - t0)
        return {"losses": losses, "images_per_s": rate}
    finally:
        synk.close()


def make_payload(info, args, runs):
    """The JSON results: each precision's losses and images/s, and the difference of the
    bf16 losses from the float32 ones, per step (None where a run failed)."""
    ref, mixed = runs.get("highest"), runs.get("bf16")
    diff = None
    if ref and mixed:
        diff = (np.array(mixed["losses"]) - np.array(ref["losses"])).tolist()
    return {"benchmark": "bf16_loss_curve", "machine": info, "args": vars(args), "runs": runs,
            "difference": diff}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=4, help="distinct synthetic batches, cycled")
    p.add_argument("--blocks", default="3,4,6,3", help="bottleneck blocks per stage (ResNet-50: 3,4,6,3)")
    p.add_argument("--width", type=int, default=64, help="channels of the first stage")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--cpu", action="store_true", help="CPU workers (bf16 emulated: use a small model)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/)")
    p.add_argument("--_precision", dest="precision", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.precision is not None:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return None
    info = machine_info()
    info["gpu_name"] = None if args.cpu else gpu_name()
    print_machine(info)
    passed = list(argv if argv is not None else sys.argv[1:])
    runs = {}
    for precision in PRECISIONS:
        cmd = [sys.executable, os.path.abspath(__file__), "--_precision", precision] + passed
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
            print("%s run failed:\n%s" % (precision, out.stderr[-3000:]), flush=True)
            runs[precision] = None
            continue
        runs[precision] = json.loads(line[0][7:])
    payload = make_payload(info, args, runs)
    diff = payload["difference"]
    rows = []
    for precision, run in runs.items():
        if run:
            ls = run["losses"]
            rows.append([precision, "%.4f" % ls[0], "%.4f" % np.mean(ls[-10:]), "%.0f" % run["images_per_s"]])
    print(table(["precision", "first loss", "mean of last 10", "images/s"], rows))
    if diff:
        a = np.abs(diff)
        print("bf16 - float32 loss: median |difference| %.4f, max %.4f (step %d), first loss %.4f"
              % (np.median(a), a.max(), int(np.argmax(a)) + 1, runs["highest"]["losses"][0]))
    write_results(args.out or default_out(__file__), payload)
    return payload


if __name__ == "__main__":
    main()
