"""How fast a function's input reaches GPU ranks.

A function that only sums its float32 input (rows of 1 KiB) is called with a
``synk.data`` input of each size in ``--sizes`` through ``synk.function`` on each
count of GPU ranks in ``--ranks``.  The same graph compiled with plain
``pytensor.function`` (JAX) is called in the master process, on its GPU, with
the same values as a numpy array: from ordinary (pageable) memory, as a user's
script gives it, and from page-locked memory (``cudaHostRegister``, then JAX's
own copy), the fastest such a script gets by hand.  Synkhronos page-locks a Data
of 1 MiB or more on every GPU rank (``_devices/gpu/_pinning.py``).  Then the
same with every row chosen in a random order: ``batch=`` an index array (each
rank gathers its rows into a page-locked buffer) against the plain function on
``x[idx]`` (a user's gather, then JAX's copy).

Every call waits for its outputs, copied to the host.  Reported per size: ms per
call (median of each side's calls, the sides alternated over ``--repeats``
rounds in one session) and the input's GB/s.  float32 on every side.  Prints a
table, writes JSON and a PNG (``benchmarks/plot.py`` redraws it).
"""

import argparse
import contextlib
import io
import mmap
import sys

import numpy as np
from _common import (
    default_out,
    gpu_name,
    machine_info,
    median,
    module_version,
    print_machine,
    table,
    time_calls,
    write_results,
)

COLS = 256  # float32 columns: a row is 1 KiB
SIDES = ("plain_pageable", "plain_locked", "synk", "plain_gathered", "synk_gathered")


@contextlib.contextmanager
def _quiet():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _calls(mb):
    return int(max(5, min(200, 400 / max(mb, 1e-3))))


def _size_records(n, mb, fn, plain, synk, repeats, rng):
    from cupy.cuda import runtime

    from synkhronos._devices.gpu._pinning import address_of, page_locked

    rows = max(1, int(mb * 2**20) // (COLS * 4))
    values = rng.standard_normal((rows, COLS)).astype(np.float32)
    pageable = values.copy()
    page = mmap.mmap(-1, values.nbytes)  # page-aligned, as a user would lock it
    locked = np.frombuffer(page, dtype=np.float32).reshape(values.shape)
    locked[:] = values
    runtime.hostRegister(locked.ctypes.data, locked.nbytes, 1)
    data = synk.data(values)
    want = np.asarray(plain(pageable))
    same = bool(np.allclose(fn(data), want, rtol=1e-4, atol=1e-2)) and bool(
        np.allclose(fn(data, batch=rng.permutation(rows)), want, rtol=1e-4, atol=1e-2))
    idx = rng.permutation(rows)
    calls = {"plain_pageable": lambda: np.asarray(plain(pageable)),
             "plain_locked": lambda: np.asarray(plain(locked)), "synk": lambda: fn(data),
             "plain_gathered": lambda: np.asarray(plain(pageable[idx])),
             "synk_gathered": lambda: fn(data, batch=idx)}
    times = {side: [] for side in SIDES}
    for call in calls.values():
        call()
    for _ in range(repeats):
        for side in SIDES:
            times[side] += time_calls(calls[side], _calls(mb))
    is_locked = page_locked(address_of(data._memory.segment))
    data.free_memory()
    runtime.hostUnregister(locked.ctypes.data)  # (the mapping goes with its last view)
    nbytes = rows * COLS * 4
    return [dict(ranks=n, side=side, mb=nbytes / 2**20, ms=median(t) * 1e3, gbps=nbytes / median(t) / 1e9,
                 same_result=same, data_locked=is_locked) for side, t in times.items()]


def run_session(n, args):
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    rng = np.random.default_rng(n)
    with _quiet():
        synk.fork(n, use_gpu=True)
    try:
        x = pt.matrix("x", dtype="float32")
        fn = synk.function([x], outputs=(x.sum(), "sum"))
        plain = pytensor.function([x], x.sum(), mode="JAX")
        with _quiet():
            synk.distribute()
        return [r for mb in args.sizes for r in _size_records(n, mb, fn, plain, synk, args.repeats, rng)]
    finally:
        with _quiet():
            synk.close()


def make_payload(info, args, records):
    info = dict(info, gpus=max(args.ranks), gpu_name=gpu_name())
    return dict(benchmark="gpu_inputs", machine=info, gpu=info["gpu_name"], cols=COLS, dtype="float32",
                sizes_mb=args.sizes, ranks=args.ranks, repeats=args.repeats, records=records,
                versions={m: module_version(m) for m in ("jax", "cupy", "pytensor")})


def _table_rows(records):
    by = {(r["ranks"], r["mb"], r["side"]): r for r in records}
    rows = []
    for r in records:
        if r["side"] != "synk":
            continue
        side = {k: by[(r["ranks"], r["mb"], k)] for k in SIDES}
        rows.append(["%.4g" % r["mb"], r["ranks"]] + ["%.3f (%.1f)" % (side[k]["ms"], side[k]["gbps"])
                                                    for k in SIDES]
                    + ["%.2fx" % (side["plain_pageable"]["ms"] / r["ms"]),
                       "%.2fx" % (side["plain_gathered"]["ms"] / side["synk_gathered"]["ms"]),
                       "yes" if r["data_locked"] else "no", "yes" if r["same_result"] else "NO"])
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [float(v) for v in s.split(",")],
                   default=[0.0625, 1, 16, 128, 512], help="input sizes in MiB (comma-separated)")
    p.add_argument("--ranks", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=default_out(__file__))
    args = p.parse_args(argv)
    info = machine_info()
    print_machine(info)
    records = [r for n in args.ranks for r in run_session(n, args)]
    print("a sum of a float32 input, called with the input and waited for; ms per call (GB/s of input)")
    print(table(["MiB", "GPU ranks", "plain, pageable", "plain, page-locked", "synk", "plain, x[idx]",
                 "synk, batch=idx", "synk vs plain", "gathered: synk vs plain", "Data locked", "same sum"],
                _table_rows(records)))
    write_results(args.out, make_payload(info, args, records))


if __name__ == "__main__":
    sys.exit(main())
