"""Collective bandwidth on GPU ranks: synk.all_reduce / broadcast / all_gather on flat
float32 shared variables of 1 MB to 1 GB, against raw CuPy NCCL on buffers of the
same sizes, measured in the same run.

Raw NCCL runs in its own processes (one per GPU, the same CuPy communicator calls
Synkhronos makes).  Both are timed two ways: back to back with one synchronisation
at the end (what nccl-tests reports; the target applies to this), and with a
synchronisation after every call (``synk.synchronize()``, a round trip to every
rank, against a bare stream synchronisation).  Bus bandwidth follows nccl-tests: all-reduce
``size/t * 2(n-1)/n``, broadcast ``size/t``, all-gather ``size_out/t * (n-1)/n``.
Target: synk >= 0.95x raw NCCL from 64 MB up.

Back to back runs 100 calls by default: at 64 MB a call takes about 250 us on
H200s, so over 20 calls the start of the pipeline (the first command's trip to
the workers, about 0.2 ms for synk, and a start-up cost that raw NCCL also shows
from run to run) weighs several percent.  ``--iters 20`` shows that.  Each back
to back timing is repeated (``--repeats``, default 3) and the fastest kept, for
raw NCCL and synk alike: the machine may be shared, and a stray pause in one pass
would otherwise decide the ratio.

all_gather grows its variable n-fold, so each timed synk call needs a fresh
variable; a third of the GPU's memory holds as many as fit (up to ``--iters``).
Raw NCCL is timed over the same number of calls.

``all_reduce_split`` all-reduces the same number of bytes split into ``--split``
variables (16 by default) in one ``synk.all_reduce`` call, as a step that
all-reduces a model's gradients does; raw NCCL makes one call per part, inside
one NCCL group (``groupStart``/``groupEnd``), as Synkhronos does.
"""

import argparse
import multiprocessing as mp
import os
import time

import numpy as np
from _common import default_out, gpu_name, machine_info, median, print_machine, table, write_results

OPS = ("all_reduce", "all_reduce_split", "broadcast", "all_gather")
TINY = np.zeros(1, dtype="float32")  # the variables' size when not being timed


def _busbw(op, n, nbytes, seconds):
    """Bus bandwidth in GB/s, as nccl-tests defines it."""
    factor = {"all_reduce": 2 * (n - 1) / n, "all_reduce_split": 2 * (n - 1) / n, "broadcast": 1.0,
              "all_gather": (n - 1) / n}[op]
    return nbytes / seconds * factor / 1e9


def _raw_worker(rank, n, gpu, uid, sizes, iters, repeats, gather_calls, split, conn):
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
        for op, call in _raw_calls(nccl, comm, stream, x, y, g, count, split).items():
            for _ in range(3):
                call()
            stream.synchronize()
            calls = gather_calls[nbytes] if op == "all_gather" else iters
            piped = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                stream.synchronize()
                piped = min(piped, (time.perf_counter() - t0) / calls)
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


def _raw_calls(nccl, comm, stream, x, y, g, count, split):
    f32 = nccl.NCCL_FLOAT32
    part = count // split
    parts = [(x[k * part:(k + 1) * part], y[k * part:(k + 1) * part]) for k in range(split)]

    def split_all_reduce():
        nccl.groupStart()
        for a, b in parts:
            comm.allReduce(a.data.ptr, b.data.ptr, part, f32, nccl.NCCL_SUM, stream.ptr)
        nccl.groupEnd()

    return {
        "all_reduce": lambda: comm.allReduce(x.data.ptr, y.data.ptr, count, f32, nccl.NCCL_SUM, stream.ptr),
        "all_reduce_split": split_all_reduce,
        "broadcast": lambda: comm.bcast(x.data.ptr, count, f32, 0, stream.ptr),
        "all_gather": lambda: comm.allGather(x.data.ptr, g.data.ptr, count, f32, stream.ptr),
    }


def raw_nccl(n, gpus, sizes, iters, repeats=1, gather_calls=None, split=16):
    from cupy.cuda import nccl

    uid = nccl.get_unique_id()
    gather_calls = gather_calls or {nb: iters for nb in sizes}
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for r in range(n):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_raw_worker, args=(r, n, gpus[r], uid, sizes, iters, repeats,
                                                  gather_calls, split, b))
        p.start()
        pipes.append(a)
        procs.append(p)
    results = [a.recv() for a in pipes]
    for p in procs:
        p.join()
    return results[0]


def _timed(call, iters, synchronize, repeats, between=None, warm=3):
    """(seconds per call back to back with one synchronisation at the end, the
    fastest of ``repeats`` passes; median seconds of one call followed by a
    synchronisation)."""
    for i in range(warm):
        call(i)
    synchronize()
    piped = float("inf")
    for _ in range(repeats):
        if between is not None:
            between()
        t0 = time.perf_counter()
        for i in range(iters):
            call(i)
        synchronize()
        piped = min(piped, (time.perf_counter() - t0) / iters)
    if between is not None:
        between()
    ts = []
    for i in range(iters):
        t = time.perf_counter()
        call(i)
        synchronize()
        ts.append(time.perf_counter() - t)
    return piped, median(ts)


def _gather_copies(nbytes, n, iters, memory):
    """all_gather grows its variable n-fold, so each timed call needs a fresh one:
    this many copies (input and output each), within ``memory`` bytes."""
    return max(3, min(iters, memory // (nbytes * (n + 1))))


def _gpu_memory(gpu):
    """Total memory of GPU ``gpu`` in bytes (nvidia-smi; 16 GB if it cannot say)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-i", str(gpu), "--query-gpu=memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout
        return int(float(out.split()[0])) << 20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 16 << 30


def _time_size(synk, nb, s, parts, gs, iters, repeats):
    """Time the ops on ``nb`` bytes: ``s`` for all_reduce and broadcast, the
    variables ``parts`` (``nb`` bytes together) for all_reduce_split, the copies
    ``gs`` for all_gather."""
    zeros = np.zeros(nb // 4, dtype="float32")
    out = {}
    synk.broadcast(s, zeros)  # all-reducing zeros keeps the values finite
    out[("all_reduce", nb)] = _timed(lambda i: synk.all_reduce(s, op="sum"), iters, synk.synchronize,
                                     repeats)
    part = zeros[:nb // 4 // len(parts)]
    for v in parts:
        synk.broadcast(v, part)
    out[("all_reduce_split", nb)] = _timed(lambda i: synk.all_reduce(parts, op="sum"), iters,
                                           synk.synchronize, repeats)
    out[("broadcast", nb)] = _timed(lambda i: synk.broadcast(s), iters, synk.synchronize, repeats)

    def reset():
        for g in gs:
            synk.broadcast(g, zeros)
        synk.synchronize()

    reset()
    # One warm-up pass over every copy, so that the timed passes find their output
    # buffers in the memory pool, as any loop after its first step does.
    out[("all_gather", nb)] = _timed(lambda i: synk.all_gather(gs[i]), len(gs), synk.synchronize,
                                     repeats, between=reset, warm=len(gs))
    for v in gs + parts + [s]:
        synk.broadcast(v, TINY)  # give the memory back
    return out


def synk_collectives(n, sizes, iters, repeats, gather_calls, split=16):
    """Timings ``{(op, nbytes): (piped, synced)}`` of synk's collectives; the
    variables start tiny and are sized by a broadcast (so distribution is quick)."""
    import pytensor

    import synkhronos as synk

    synk.fork(n, use_gpu=True)
    try:
        tiny = TINY
        main = {nb: pytensor.shared(tiny, name="s%d" % nb) for nb in sizes}
        split_parts = {nb: [pytensor.shared(tiny, name="p%d_%d" % (nb, k)) for k in range(split)]
                       for nb in sizes}
        copies = {nb: [pytensor.shared(tiny, name="g%d_%d" % (nb, k))
                       for k in range(gather_calls[nb])] for nb in sizes}
        every = (list(main.values()) + [g for gs in copies.values() for g in gs]
                 + [v for vs in split_parts.values() for v in vs])
        synk.function([], outputs=sum(v[0] for v in every))
        synk.distribute()
        out = {}
        for nb in sizes:
            out.update(_time_size(synk, nb, main[nb], split_parts[nb], copies[nb], iters, repeats))
        # Correctness after all that: rank r holds r + 1; all_reduce and all_gather agree with numpy.
        nb = sizes[0]
        s, g = main[nb], copies[nb][0]
        for r in range(n):
            synk.set_value(r, [s, g], [np.full(nb // 4, r + 1, dtype="float32")] * 2)
        synk.all_reduce(s, op="sum")
        synk.all_gather(g)
        want = np.repeat(np.arange(1, n + 1, dtype="float32"), nb // 4)
        ok = all(np.all(synk.get_value(r, s) == n * (n + 1) / 2)
                 and np.array_equal(synk.get_value(r, g), want) for r in range(n))
        return out, bool(ok)
    finally:
        synk.close()


def make_records(n, sizes, raw, synk_t):
    """One results record per op and size from the timings ``{(op, nbytes):
    (piped_s, synced_s)}`` of raw NCCL and synk on ``n`` GPUs."""
    records = []
    for op in OPS:
        for nb in sizes:
            piped, synced = raw[(op, nb)]
            st, st_synced = synk_t[(op, nb)]
            moved = nb * (n if op == "all_gather" else 1)
            records.append(dict(op=op, mb=nb / 2**20, raw_ms=piped * 1e3, raw_synced_ms=synced * 1e3,
                                synk_ms=st * 1e3, synk_synced_ms=st_synced * 1e3,
                                raw_busbw=_busbw(op, n, moved, piped), synk_busbw=_busbw(op, n, moved, st),
                                ratio=piped / st, ratio_synced=synced / st_synced))
    return records


def make_payload(info, settings, records, correct):
    """The JSON results file's contents (``info["gpus"]``: the number of GPU ranks)."""
    return {"benchmark": "collectives", "machine": info, "settings": settings, "results": records,
            "correct": correct}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=None, help="GPU ranks (default: all)")
    p.add_argument("--sizes-mb", default="1,16,64,256,512,1024", help="comma-separated sizes in MB")
    p.add_argument("--iters", type=int, default=100, help="timed calls per size and op")
    p.add_argument("--repeats", type=int, default=3,
                   help="back-to-back passes per timing; the fastest is kept (default 3)")
    p.add_argument("--split", type=int, default=16,
                   help="variables that all_reduce_split divides each size into (default 16)")
    p.add_argument("--quick", action="store_true", help="1,64 MB, 5 calls, 1 pass")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/collectives.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes_mb, args.iters, args.repeats = "1,64", 5, 1
    import synkhronos as synk

    gpus = synk.gpus()
    n = args.n or len(gpus)
    if n < 2:
        raise SystemExit("collectives.py needs at least 2 GPUs, found %d" % len(gpus))
    sizes = [int(float(mb) * 2**20) for mb in args.sizes_mb.split(",")]
    info = machine_info()
    info["gpus"] = n
    info["gpu_name"] = gpu_name()
    print_machine(info)
    for name in ("iters", "repeats", "split"):
        if getattr(args, name) < 1:
            p.error("--%s must be at least 1, got %d" % (name, getattr(args, name)))
    memory = min(_gpu_memory(g) for g in gpus[:n]) // 3
    gather_calls = {nb: _gather_copies(nb, n, args.iters, memory) for nb in sizes}
    small = [mb for mb, nb in zip(args.sizes_mb.split(","), sizes) if nb // 4 < args.split]
    if small:
        p.error("--split %d does not divide %s MB into float32 parts" % (args.split, small[0]))
    raw = raw_nccl(n, gpus, sizes, args.iters, args.repeats, gather_calls, args.split)
    synk_t, ok = synk_collectives(n, sizes, args.iters, args.repeats, gather_calls, args.split)
    records = make_records(n, sizes, raw, synk_t)
    rows = []
    for rec in records:
        target = "" if rec["mb"] < 64 else ("PASS" if rec["ratio"] >= 0.95 else "FAIL")
        rows.append([rec["op"], "%g" % rec["mb"], "%.3f" % rec["raw_ms"], "%.3f" % rec["synk_ms"],
                     "%.0f" % rec["raw_busbw"], "%.0f" % rec["synk_busbw"], "%.3f" % rec["ratio"],
                     "%.3f" % rec["raw_synced_ms"], "%.3f" % rec["synk_synced_ms"],
                     "%.2f" % rec["ratio_synced"], target])
    print("\nprecision: not applicable (collectives move and add float32 values; no products)")
    print("\nCollectives on %d GPUs (busbw in GB/s).  Back to back: ms per call over %d calls "
          "with one synchronisation at the end.  Synced: median of calls each followed by a "
          "synchronisation (synk.synchronize() for synk, a stream sync for raw)." % (n, args.iters))
    print(table(["op", "MB", "raw ms", "synk ms", "raw busbw", "synk busbw", "synk/raw",
                 "raw synced ms", "synk synced ms", "synced ratio", ">=0.95 from 64MB"], rows))
    print("all_reduce_split: the same bytes in %d variables, one synk call (raw: one NCCL call "
          "per variable, in one NCCL group)" % args.split)
    print("values correct after the runs: %s" % ok)
    settings = dict(iters=args.iters, repeats=args.repeats, split=args.split)
    write_results(args.out or default_out(__file__), make_payload(info, settings, records, ok))


if __name__ == "__main__":
    main()
