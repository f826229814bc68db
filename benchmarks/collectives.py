"""Collective bandwidth on GPU ranks: synk.all_reduce / broadcast / all_gather on flat
float32 shared variables of 1 MB to 1 GB, against raw CuPy NCCL on buffers of the
same sizes, measured in the same run.

Raw NCCL runs in its own processes (one per GPU, the same CuPy communicator calls
Synkhronos makes), timed two ways: back to back with one synchronisation at the end
(what nccl-tests reports), and synchronised after every call (what one synchronous
``synk.all_reduce`` is).  Bus bandwidth follows nccl-tests: all-reduce
``size/t * 2(n-1)/n``, broadcast ``size/t``, all-gather ``size_out/t * (n-1)/n``.
Target: synk >= 0.95x raw NCCL from 64 MB up.
"""

import argparse
import multiprocessing as mp
import os
import time

import numpy as np
from _common import default_out, machine_info, median, print_machine, table, write_json

OPS = ("all_reduce", "broadcast", "all_gather")


def _busbw(op, n, nbytes, seconds):
    """Bus bandwidth in GB/s, as nccl-tests defines it."""
    factor = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0, "all_gather": (n - 1) / n}[op]
    return nbytes / seconds * factor / 1e9


def _raw_worker(rank, n, gpu, uid, sizes, iters, conn):
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import cupy
    from cupy.cuda import nccl

    comm = nccl.NcclCommunicator(n, uid, rank)
    stream = cupy.cuda.Stream(non_blocking=True)
    out = {}
    for nbytes in sizes:
        count = nbytes // 4
        x = cupy.ones(count, dtype=cupy.float32)
        y = cupy.empty_like(x)
        g = cupy.empty(count * n, dtype=cupy.float32)
        for op, call in _raw_calls(nccl, comm, stream, x, y, g, count).items():
            for _ in range(3):
                call()
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            stream.synchronize()
            piped = (time.perf_counter() - t0) / iters
            ts = []
            for _ in range(iters):
                t = time.perf_counter()
                call()
                stream.synchronize()
                ts.append(time.perf_counter() - t)
            out[(op, nbytes)] = (piped, median(ts))
        del x, y, g
        cupy.get_default_memory_pool().free_all_blocks()
    conn.send(out)


def _raw_calls(nccl, comm, stream, x, y, g, count):
    f32 = nccl.NCCL_FLOAT32
    return {
        "all_reduce": lambda: comm.allReduce(x.data.ptr, y.data.ptr, count, f32, nccl.NCCL_SUM, stream.ptr),
        "broadcast": lambda: comm.bcast(x.data.ptr, count, f32, 0, stream.ptr),
        "all_gather": lambda: comm.allGather(x.data.ptr, g.data.ptr, count, f32, stream.ptr),
    }


def raw_nccl(n, gpus, sizes, iters):
    from cupy.cuda import nccl

    uid = nccl.get_unique_id()
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for r in range(n):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_raw_worker, args=(r, n, gpus[r], uid, sizes, iters, b))
        p.start()
        pipes.append(a)
        procs.append(p)
    results = [a.recv() for a in pipes]
    for p in procs:
        p.join()
    return results[0]


def synk_collectives(n, sizes, iters):
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    synk.fork(n, use_gpu=True)
    try:
        shareds = [pytensor.shared(np.ones(nb // 4, dtype="float32"), name="s%d" % nb,
                                   shape=(nb // 4,)) for nb in sizes]
        synk.function([], outputs=pt.add(*[s[0] for s in shareds]) if len(shareds) > 1 else shareds[0][0])
        synk.distribute()
        out = {}
        for s, nbytes in zip(shareds, sizes):
            calls = {"all_reduce": lambda s=s: synk.all_reduce(s, op="sum"),
                     "broadcast": lambda s=s: synk.broadcast(s),
                     "all_gather": None}
            for op in OPS:
                if op == "all_gather":
                    # all_gather grows the variable n-fold: time it on a fresh copy each call.
                    ts = []
                    for _ in range(max(3, iters // 4)):
                        synk.broadcast(s, np.ones(nbytes // 4, dtype="float32"))
                        t = time.perf_counter()
                        synk.all_gather(s)
                        ts.append(time.perf_counter() - t)
                    synk.broadcast(s, np.ones(nbytes // 4, dtype="float32"))
                    out[(op, nbytes)] = median(ts)
                    continue
                for _ in range(3):
                    calls[op]()
                ts = []
                for _ in range(iters):
                    t = time.perf_counter()
                    calls[op]()
                    ts.append(time.perf_counter() - t)
                out[(op, nbytes)] = median(ts)
        ok = bool(np.allclose(synk.get_value(n - 1, shareds[0])[:4], shareds[0].get_value()[:4]))
        return out, ok
    finally:
        synk.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=None, help="GPU ranks (default: all)")
    p.add_argument("--sizes-mb", default="1,16,64,256,512,1024", help="comma-separated sizes in MB")
    p.add_argument("--iters", type=int, default=20, help="timed calls per size and op")
    p.add_argument("--quick", action="store_true", help="1,64 MB and 5 calls")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/collectives.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes_mb, args.iters = "1,64", 5
    from synkhronos._devices.gpu import visible_gpus

    gpus = visible_gpus()
    n = args.n or len(gpus)
    if n < 2:
        raise SystemExit("collectives.py needs at least 2 GPUs, found %d" % len(gpus))
    sizes = [int(float(mb) * 2**20) for mb in args.sizes_mb.split(",")]
    info = machine_info()
    info["gpus"] = n
    print_machine(info)
    raw = raw_nccl(n, gpus, sizes, args.iters)
    synk_t, ok = synk_collectives(n, sizes, args.iters)
    rows, records = [], []
    for op in OPS:
        for nb in sizes:
            piped, synced = raw[(op, nb)]
            st = synk_t[(op, nb)]
            moved = nb * (n if op == "all_gather" else 1)
            rec = dict(op=op, mb=nb / 2**20, raw_ms=piped * 1e3, raw_synced_ms=synced * 1e3,
                       synk_ms=st * 1e3, raw_busbw=_busbw(op, n, moved, piped),
                       synk_busbw=_busbw(op, n, moved, st),
                       ratio=piped / st, ratio_synced=synced / st)
            records.append(rec)
            target = "" if nb < 64 * 2**20 else ("PASS" if rec["ratio"] >= 0.95 else "FAIL")
            rows.append([op, "%g" % rec["mb"], "%.3f" % rec["raw_ms"], "%.3f" % rec["raw_synced_ms"],
                         "%.3f" % rec["synk_ms"], "%.0f" % rec["raw_busbw"], "%.0f" % rec["synk_busbw"],
                         "%.2f" % rec["ratio"], "%.2f" % rec["ratio_synced"], target])
    print("\nCollectives on %d GPUs (median of %d calls; busbw in GB/s)" % (n, args.iters))
    print(table(["op", "MB", "raw ms", "raw sync ms", "synk ms", "raw busbw", "synk busbw",
                 "synk/raw", "synk/raw sync", ">=0.95 from 64MB"], rows))
    print("values correct after the runs: %s" % ok)
    write_json(args.out or default_out(__file__), {"machine": info, "results": records, "correct": ok})


if __name__ == "__main__":
    main()
