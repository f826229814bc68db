"""ResNet-50 training throughput on 1, 2, 4, 8 GPUs: Synkhronos against PyTorch DDP
and against the same model written directly in Flax, on the same model shape, batch
and GPUs, measured in the same run.

Synkhronos trains the bottleneck ResNet of ``demos/resnet`` (3,4,6,3 blocks, batch
norm on batch statistics) with ``extensions.train.make_train_step`` (momentum SGD,
one flat-gradient all-reduce per step); the images live on the GPUs in sliceable
shared variables (the demo's gpu_data pattern).  PyTorch trains
``torchvision.models.resnet50`` with DDP (one process per GPU, NCCL), random images
already on the GPU.  Flax trains the model of ``_flax_resnet`` (Flax linen + optax,
NHWC, one jitted step; on n GPUs the batch sharded over a mesh).  All: fp32
parameters and data, the same ``--precision`` for
matrix products and convolutions (``highest``: full float32 on both sides, i.e.
``synk.fork(precision='highest')``, PyTorch with TF32 off for cuBLAS and cuDNN, and
Flax with JAX's default matmul precision ``highest``; ``tf32``: TensorFloat-32 on
every side; ``bf16``: mixed precision, i.e. ``synk.fork(precision='bf16')`` against
PyTorch's bf16 autocast with channels-last tensors, the configuration a speed-minded
PyTorch user picks, and Flax layers with ``dtype=bfloat16``), ``--batch-size`` images per GPU,
momentum SGD (learning rate 0.01), and the loss fetched to the host every step.
Each setting runs in its own processes; images/s is the median over the timed
steps.
``--layout NHWC`` transposes Synkhronos's convolutions to channels-last for XLA
(``SYNKHRONOS_CONV_LAYOUT``), to compare with the graph's NCHW.
``--peers`` picks the other sides (default ``ddp,flax``).
Targets: Synkhronos scaling efficiency >= 0.97 at 2 GPUs; on one GPU its images/s
>= 0.9x PyTorch's and >= 1.0x Flax's (bf16 batch 256: >= 1.05x).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
from _common import (
    default_out,
    gpu_name,
    machine_info,
    median,
    mpirun_host_per_rank,
    print_machine,
    table,
    write_results,
)

HERE = os.path.dirname(os.path.abspath(__file__))
# --precision: what each side runs (Synkhronos, PyTorch, Flax).
PRECISION_LABELS = {
    "fp32": ("full fp32 (fork(precision='highest'))", "full fp32 (allow_tf32=False for cuBLAS and cuDNN)",
             "full fp32 (jax_default_matmul_precision='highest')"),
    "tf32": ("TF32 (fork(precision='tf32'))", "TF32 (allow_tf32=True for cuBLAS and cuDNN)",
             "TF32 (jax_default_matmul_precision='tensorfloat32')"),
    "bf16": ("bf16 products, convolutions and activations; fp32 statistics, loss, parameters "
             "(fork(precision='bf16'))", "bf16 autocast + channels_last",
             "layers in bf16 (dtype=bfloat16), fp32 parameters and loss"),
}
PEERS = ("ddp", "flax")

PRECISION_LABELS["highest"] = PRECISION_LABELS["fp32"]  # the fork() name, kept as an alias
FORK_PRECISION = {"fp32": "highest"}


def synk_child(args, n):
    """Median images/s of Synkhronos on ``n`` GPUs."""
    t0 = time.perf_counter()
    step, finish = synk_step(args, n)
    return _time_steps(step, args.batch_size * n, args, "synk", n, t0, finish)


def synk_step(args, n):
    """Synkhronos's training step on ``n`` GPUs (returns the loss) and what ends the session."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "demos", "resnet"))
    import pytensor
    import pytensor.tensor as pt
    from train_resnet import build_resnet

    import synkhronos as synk
    from synkhronos.extensions import nnet, train, updates

    os.environ[nnet.LAYOUT_ENV] = args.layout
    pytensor.config.floatX = "float32"  # the model in float32 (PyTensor's default is float64)
    synk.fork(n, use_gpu=True, precision=FORK_PRECISION.get(args.precision, args.precision))
    fx = pytensor.config.floatX
    rng = np.random.default_rng(0)
    blocks = [int(b) for b in args.blocks.split(",")]
    params, logits = build_resnet(pytensor, pt, nnet, blocks, 64, args.classes, rng)
    b, size = args.batch_size, args.image_size
    xs = pytensor.shared(np.zeros((b, 3, size, size), fx), name="images", shape=(b, 3, size, size))
    ys = pytensor.shared(np.zeros((b, args.classes), fx), name="labels", shape=(b, args.classes))
    loss = nnet.softmax_cross_entropy(logits(xs), ys)
    step = train.make_train_step([], loss, params, rule=updates.momentum, sliceable_shareds=[xs, ys],
                                 learning_rate=0.01, momentum=0.9)
    synk.distribute()
    synk.scatter([xs, ys], [rng.standard_normal((b * n, 3, size, size)).astype(fx),
                            np.eye(args.classes, dtype=fx)[rng.integers(0, args.classes, b * n)]])
    return (lambda: float(step())), synk.close


def flax_child(args, n):
    """Median images/s of the Flax model on ``n`` GPUs."""
    from _flax_resnet import flax_step

    t0 = time.perf_counter()
    step, _ = flax_step([int(b) for b in args.blocks.split(",")], args.classes, args.batch_size,
                        args.image_size, args.precision, n)
    return _time_steps(step, args.batch_size * n, args, "flax", n, t0, lambda: None)


def ddp_child(args, n):
    """Median images/s of PyTorch (DDP when n > 1) on ``n`` GPUs."""
    import torch.multiprocessing as tmp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = tmp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_ddp_rank, args=(r, n, port, args, queue)) for r in range(n)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return [r for r in results if r is not None][0]


def _ddp_rank(rank, n, port, args, queue):
    import torch
    import torchvision

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    tf32 = args.precision == "tf32"
    bf16 = args.precision == "bf16"  # autocast: convolutions and matmuls in bf16, the rest fp32
    torch.backends.cuda.matmul.allow_tf32 = tf32  # PyTorch's default: False
    torch.backends.cudnn.allow_tf32 = tf32  # PyTorch's default: True
    layout = torch.channels_last if bf16 else torch.contiguous_format
    model = torchvision.models.resnet50(num_classes=args.classes).cuda().to(memory_format=layout)
    if n > 1:
        torch.distributed.init_process_group("nccl", rank=rank, world_size=n)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()
    b, size = args.batch_size, args.image_size
    x = torch.randn(b, 3, size, size, device="cuda").to(memory_format=layout)
    y = torch.randint(0, args.classes, (b,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    t0 = time.perf_counter()
    result = _time_steps(step, b * n, args, "ddp", n, t0, lambda: None, quiet=rank != 0)
    if n > 1:
        torch.distributed.destroy_process_group()
    queue.put(result if rank == 0 else None)


def _time_steps(step, images, args, label, n, t0, finish, quiet=False):
    try:
        for _ in range(args.warmup):
            step()
        ready = time.perf_counter() - t0
        rates = []
        for _ in range(args.steps):
            t = time.perf_counter()
            loss = step()
            rates.append(images / (time.perf_counter() - t))
        if not quiet:
            print("  %s, %d GPU(s): %.0f images/s (median of %d steps; setup and warm-up %.0f s; "
                  "last loss %.3f)" % (label, n, median(rates), args.steps, ready, loss), flush=True)
        return child_result(rates, ready, loss)
    finally:
        finish()


def child_result(rates, setup_s, last_loss):
    """What one setting reports: images/s of each timed step and their median."""
    return dict(images_per_s=median(rates), rates=rates, setup_s=setup_s, last_loss=last_loss)


def _run_child(kind, n, argv, timeout, ranks_per_host=1):
    """One setting in its own processes: ``kind`` "synk", "ddp", or "synk_mpi"
    (Synkhronos on ``n`` MPI ranks launched by ``mpirun``, each its own host, so
    that Data, commands and NCCL take the cross-host paths)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", "%s:%d" % (kind, n)] + argv
    env = None
    if kind == "synk_mpi":
        cmd[cmd.index("%s:%d" % (kind, n))] = "synk:%d" % n
        cmd, env = mpirun_host_per_rank(n, cmd, ["--enable-recovery"], ranks_per_host)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print("  %s on %d GPU(s): no result within %d s" % (kind, n, timeout), flush=True)
        return None
    sys.stdout.write("".join(ln + "\n" for ln in out.stdout.splitlines() if ln.startswith("  ")))
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not line:
        print("  %s on %d GPU(s) failed:\n%s" % (kind, n, out.stderr[-2000:]), flush=True)
        return None
    return json.loads(line[0][7:])


def parse_args(argv=None):
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default=None, help="comma-separated GPU counts (default: 1,2,4,8 up to all)")
    p.add_argument("--batch-size", type=int, default=64, help="images per GPU per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (compilation) first")
    p.add_argument("--blocks", default="3,4,6,3", help="bottleneck blocks per stage (ResNet-50: 3,4,6,3)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--precision", choices=sorted(PRECISION_LABELS), default="fp32",
                   help="products and convolutions on both sides: full float32, TF32, or bf16 mixed "
                        "precision (PyTorch: autocast + channels_last)")
    p.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW",
                   help="layout Synkhronos's JAX convolutions hand to XLA (SYNKHRONOS_CONV_LAYOUT)")
    p.add_argument("--peers", default="ddp,flax",
                   help="comma-separated sides beside Synkhronos: ddp (PyTorch), flax; '' for none")
    p.add_argument("--mpi", action="store_true",
                   help="also run Synkhronos under mpirun, every rank its own host "
                        "(SYNKHRONOS_HOST_PER_RANK)")
    p.add_argument("--mpi-ranks-per-host", type=int, default=1,
                   help="with --mpi: GPUs per \"host\" (SYNKHRONOS_RANKS_PER_HOST; 2 on 4 GPUs: "
                        "2 hosts of 2)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per setting")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/)")
    p.add_argument("--_child", dest="child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_payload(info, args, ns, results):
    """The JSON results file's contents from each setting's ``child_result``
    (``results[(kind, n)]``, kind "synk", "ddp", "flax" or "synk_mpi"; None where a
    run failed)."""

    def rate(kind, n):
        r = results.get((kind, n))
        return None if r is None else r["images_per_s"]

    def efficiency(kind, n):
        # mpirun runs only from 2 ranks: its base is the single-host first figure.
        r, r1 = rate(kind, n), rate("synk" if kind == "synk_mpi" else kind, ns[0])
        return None if r is None or r1 is None else r / r1 / (n / ns[0])

    records = []
    for n in ns:
        s, d, f = rate("synk", n), rate("ddp", n), rate("flax", n)
        rec = dict(gpus=n, synk_images_per_s=s, ddp_images_per_s=d, flax_images_per_s=f,
                   synk_efficiency=efficiency("synk", n), ddp_efficiency=efficiency("ddp", n),
                   flax_efficiency=efficiency("flax", n),
                   synk_over_ddp=None if s is None or not d else s / d,
                   synk_over_flax=None if s is None or not f else s / f,
                   synk=results.get(("synk", n)), ddp=results.get(("ddp", n)), flax=results.get(("flax", n)))
        if ("synk_mpi", n) in results:
            m = rate("synk_mpi", n)
            rec.update(synk_mpi_images_per_s=m, synk_mpi_efficiency=efficiency("synk_mpi", n),
                       synk_mpi_over_synk=None if m is None or not s else m / s,
                       synk_mpi=results[("synk_mpi", n)])
        records.append(rec)
    return {"benchmark": "resnet50_scaling", "machine": info, "args": vars(args), "results": records}


def main(argv=None):
    args = parse_args(argv)
    peers = tuple(p for p in args.peers.split(",") if p)
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise SystemExit("--peers: unknown side(s) %s; choose from %s"
                         % (", ".join(unknown), ", ".join(PEERS)))
    if args.child is not None:
        kind, n = args.child.split(":")
        fn = {"synk": synk_child, "ddp": ddp_child, "flax": flax_child}[kind]
        print("RESULT " + json.dumps(fn(args, int(n))), flush=True)
        return None
    import synkhronos as synk

    available = len(synk.gpus())
    if available < 1:
        raise SystemExit("resnet50_scaling.py needs a GPU")
    ns = [int(g) for g in args.gpus.split(",")] if args.gpus else [g for g in (1, 2, 4, 8) if g <= available]
    info = machine_info()
    info["gpus"] = available
    info["gpu_name"] = gpu_name()
    print_machine(info)
    passed = list(argv if argv is not None else sys.argv[1:])
    results = {}
    for n in ns:
        # One MPI rank has no other host to reach: its figure would be the single-host one.
        mpi = ("synk_mpi",) if args.mpi and n > 1 else ()
        for kind in ("synk",) + mpi + peers:
            results[(kind, n)] = _run_child(kind, n, passed, args.timeout, args.mpi_ranks_per_host)
    payload = make_payload(info, args, ns, results)
    records = payload["results"]
    cols = [("synk_images_per_s", "%.0f"), ("synk_efficiency", "%.3f"), ("ddp_images_per_s", "%.0f"),
            ("ddp_efficiency", "%.3f"), ("flax_images_per_s", "%.0f"), ("flax_efficiency", "%.3f"),
            ("synk_over_ddp", "%.2f"), ("synk_over_flax", "%.2f")]
    rows = [[r["gpus"]] + ["-" if r[k] is None else fmt % r[k] for k, fmt in cols] for r in records]
    print("\nResNet (blocks %s), fp32 parameters, batch %d per GPU, %d px: images/s (median of %d steps)"
          % (args.blocks, args.batch_size, args.image_size, args.steps))
    print("precision: synk %s; PyTorch %s; Flax %s" % PRECISION_LABELS[args.precision])
    print("synk convolution layout handed to XLA: %s" % args.layout)
    print(table(["GPUs", "synk img/s", "synk eff.", "DDP img/s", "DDP eff.", "Flax img/s", "Flax eff.",
                 "synk/DDP", "synk/Flax"], rows))
    if args.mpi:
        cols = (("synk_mpi_images_per_s", "%.0f"), ("synk_mpi_efficiency", "%.3f"),
                ("synk_mpi_over_synk", "%.3f"))
        rows = [[r["gpus"]] + ["-" if r.get(k) is None else fmt % r[k] for k, fmt in cols] for r in records]
        print("\nSynkhronos under mpirun, %s (Data copies, commands over TCP, NCCL):"
              % ("every rank its own host" if args.mpi_ranks_per_host == 1 else
                 "every %d ranks one host" % args.mpi_ranks_per_host))
        print(table(["GPUs", "mpirun img/s", "mpirun efficiency", "mpirun / single-host"], rows))
    print("targets: synk efficiency >= 0.97 at 2 GPUs; on 1 GPU synk/DDP >= 0.9, synk/Flax >= 1.0 "
          "(bf16, batch 256: >= 1.05)")
    write_results(args.out or default_out(__file__), payload)
    return records


if __name__ == "__main__":
    main()
