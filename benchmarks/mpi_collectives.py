"""Collectives on CPU ranks launched by MPI: synk.all_reduce / broadcast / all_gather
on float32 shared variables, against raw mpi4py on numpy buffers of the same sizes,
and against the single-host runtime (shared memory through the master), measured
in the same run.

Three settings, each in its own processes, ``--n`` ranks each:

* ``raw``: ``Allreduce`` / ``Bcast`` / ``Allgather`` of mpi4py on numpy buffers,
  under ``mpirun -n N`` (the floor: what MPI itself gives on this machine);
* ``synk_mpi``: Synkhronos under the same ``mpirun``, every rank its own host
  (``SYNKHRONOS_HOST_PER_RANK=1``): each collective is a command to every rank
  plus the same MPI collective on the shared variables' buffers;
* ``synk_host``: Synkhronos on one host without MPI (``fork(N, use_gpu=False)``):
  values travel through shared memory and are reduced in the master.

Each timing is ``--iters`` calls back to back, then one ``synk.synchronize()``
(synk) or ``Barrier`` (raw), repeated ``--repeats`` times, the fastest kept (the
machine may be shared).  Reported: milliseconds per call and algorithm bandwidth
(bytes of the variable per second).  ``--quick``: 1 and 8 MB, 3 calls, 1 pass.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np
from _common import (
    default_out,
    machine_info,
    mpirun_host_per_rank,
    mpirun_path,
    print_machine,
    table,
    write_results,
)

OPS = ("all_reduce", "broadcast", "all_gather")
SETTINGS = ("raw", "synk_mpi", "synk_host")
_MARK = "RESULT "


def _best(call, finish, iters, repeats):
    """Seconds per call: ``iters`` calls then ``finish()``, fastest of ``repeats``."""
    call()
    finish()  # warm: first-call costs are not the collective's
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        finish()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def raw_child(args):
    """Raw mpi4py collectives, every rank (rank 0 reports)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, out = comm.Get_size(), {}
    for mb in args.sizes:
        x = np.ones(int(mb * 2**20) // 4, "float32")
        y, g = np.empty_like(x), np.empty(x.size * n, "float32")
        calls = {"all_reduce": functools.partial(comm.Allreduce, x, y),
                 "broadcast": functools.partial(comm.Bcast, x, root=0),
                 "all_gather": functools.partial(comm.Allgather, x, g)}
        for op in OPS:
            out["%s:%g" % (op, mb)] = _best(calls[op], comm.Barrier, args.iters, args.repeats)
    return out if comm.Get_rank() == 0 else None


def synk_child(args):
    """Synkhronos collectives (on MPI ranks if launched so, else on one host)."""
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    synk.fork(args.n, use_gpu=False)
    variables = {mb: pytensor.shared(np.ones(int(mb * 2**20) // 4, "float32")) for mb in args.sizes}
    synk.function([], [pt.sum(v) for v in variables.values()])  # so that every rank has them
    synk.distribute()
    out = {}
    for mb, v in variables.items():
        base = v.get_value()

        def gather_again(v=v, base=base):
            synk.broadcast(v, base)  # all_gather grows the variable: give it its size back
            synk.all_gather(v)

        calls = {"all_reduce": lambda v=v: synk.all_reduce(v, op="sum"),
                 "broadcast": lambda v=v: synk.broadcast(v)}
        for op in ("all_reduce", "broadcast"):
            out["%s:%g" % (op, mb)] = _best(calls[op], synk.synchronize, args.iters, args.repeats)
        # all_gather: time it alone, the restoring broadcast timed separately and taken off.
        both = _best(gather_again, synk.synchronize, args.iters, args.repeats)
        restore = _best(lambda v=v, base=base: synk.broadcast(v, base), synk.synchronize, args.iters,
                        args.repeats)
        out["all_gather:%g" % mb] = max(both - restore, 0.0)
    synk.close()
    return out


def _run(setting, args, argv):
    """One setting in its own processes; its results (None if it failed)."""
    cmd, env = [sys.executable, os.path.abspath(__file__), "--_child", setting] + argv, None
    if setting != "synk_host":
        cmd, env = mpirun_host_per_rank(args.n, cmd)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith(_MARK)]
    if out.returncode or not line:
        print("%s failed:\n%s" % (setting, out.stderr[-2000:]), flush=True)
        return None
    return json.loads(line[0][len(_MARK):])


def make_records(args, results):
    """One record per op and size: seconds and GB/s of each setting, and the ratios."""
    records = []
    for op in OPS:
        for mb in args.sizes:
            rec = dict(op=op, mb=mb)
            for setting in SETTINGS:
                t = (results.get(setting) or {}).get("%s:%g" % (op, mb))
                rec[setting + "_ms"] = None if t is None else t * 1e3
                rec[setting + "_gbps"] = None if not t else mb * 2**20 / t / 1e9
            for setting in ("synk_mpi", "synk_host"):
                a, b = rec[setting + "_ms"], rec["raw_ms"]
                rec[setting + "_over_raw"] = None if not a or not b else b / a  # speed relative to raw
            records.append(rec)
    return records


def parse_args(argv=None):
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2, help="ranks in each setting")
    p.add_argument("--sizes-mb", default="1,16,64", help="comma-separated sizes in MB")
    p.add_argument("--iters", type=int, default=10, help="calls per timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1 and 8 MB, 3 calls, 1 pass")
    p.add_argument("--timeout", type=int, default=600, help="seconds per setting")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/)")
    p.add_argument("--_child", dest="child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes_mb, args.iters, args.repeats = "1,8", 3, 1
    args.sizes = [float(s) for s in args.sizes_mb.split(",")]
    return args


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child is not None:
        result = raw_child(args) if args.child == "raw" else synk_child(args)
        if result is not None:
            print(_MARK + json.dumps(result), flush=True)
        return None
    if mpirun_path() is None:
        raise SystemExit("mpi_collectives.py needs mpirun and mpi4py: pip install synkhronos[mpi]")
    info = machine_info()
    print_machine(info)
    results = {setting: _run(setting, args, argv) for setting in SETTINGS}
    records = make_records(args, results)

    def cell(v, fmt):
        return "-" if v is None else fmt % v

    print("\n%d ranks, float32 variables: ms per call (GB/s of the variable)" % args.n)
    rows = [[r["op"], "%g" % r["mb"]]
            + ["%s (%s)" % (cell(r[s + "_ms"], "%.3f"), cell(r[s + "_gbps"], "%.2f")) for s in SETTINGS]
            + [cell(r["synk_mpi_over_raw"], "%.2f"), cell(r["synk_host_over_raw"], "%.2f")] for r in records]
    print(table(["op", "MB", "raw mpi4py", "synk, mpirun (host per rank)", "synk, one host (no MPI)",
                 "mpirun/raw", "one host/raw"], rows))
    payload = {"benchmark": "mpi_collectives", "machine": info, "settings": vars(args), "records": records}
    write_results(args.out or default_out(__file__), payload)
    return records


if __name__ == "__main__":
    main()
