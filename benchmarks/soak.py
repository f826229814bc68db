"""Soak test: one Synkhronos session, many calls and collectives, results checked
along the way, memory of every rank watched.

The session (``--ranks`` ranks, CPU workers unless ``--gpu``) runs

* ``--calls`` function calls (default 100000): a small matrix function whose
  inputs are selected with ``batch=`` (all rows, a random index list, a slice,
  ``num_slices=2``) and, one call in ten, a parameter-update function with no
  inputs and no outputs (on GPUs this one is queued without waiting);
* ``--collectives`` collectives (default 10000), cycling through scatter,
  all_gather, gather, set_value, get_value, broadcast, all_reduce and reduce on a
  small shared vector, each cycle starting from a known value.

Every ``--check-every`` calls (default 1000) a call's outputs are compared with
numpy on the same rows, and the update function's counter with the number of
updates made; every collective cycle's results are compared with numpy.  The
resident memory (VmRSS) of the master and every worker is sampled after a
warm-up (2% of the calls) and then ten times; the table gives each rank's RSS at
the first sample and at the end, and the growth.  Growth within a few MB is the
allocator's noise; a leak grows with the number of calls.

Run ``python benchmarks/soak.py --quick`` for a smoke run.  Results go to
``benchmarks/results/soak.json`` unless ``--out`` says otherwise.
"""

import argparse
import glob
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import default_out, gpu_name, machine_info, print_machine, table, write_results  # noqa: E402

ROWS, COLS, OUT = 4096, 16, 8
BATCH_SIZES = (64, 256)  # a few shapes only: JAX traces once per shape
PRECISION = "highest"  # what the benchmark passes to fork() (GPU ranks; CPU workers compute in float32)
MASTER_RANK = 0  # likewise


def _rss_mb(pid):
    with open("/proc/%d/status" % pid) as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _children(pid):
    """PIDs of the live child processes of ``pid``, oldest first (Linux /proc):
    from ``/proc/<pid>/task/*/children`` where the kernel has it, else by
    scanning every ``/proc/<n>/stat`` for that parent."""
    paths = glob.glob("/proc/%d/task/*/children" % pid)
    kids = set()
    if paths:
        for path in paths:
            with open(path) as fh:
                kids.update(int(k) for k in fh.read().split())
    else:
        for path in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(path) as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
            except (OSError, IndexError):
                continue  # ended meanwhile
            if int(fields[1]) == pid:  # field 4, ppid
                kids.add(int(path.split("/")[2]))
    started = {}
    for k in kids:
        try:
            with open("/proc/%d/stat" % k) as fh:
                started[k] = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        except (OSError, IndexError):
            pass  # ended meanwhile
    return sorted(started, key=lambda k: (started[k], k))


def _rank_pids(n, master_rank):
    """Rank -> pid for every rank of this host's session.  ``fork()`` starts the
    workers as child processes of the master, running this Python, one per rank
    other than the master's, in rank order; they are found among this process's
    children.  Where that fails (no /proc, an MPI launch, other children), only
    the master is watched, and the reason is printed."""
    pids = {master_rank: os.getpid()}
    if not os.path.isdir("/proc"):
        print("note: no /proc on this system: the workers' memory is not watched, only the master's")
        return pids
    workers = []
    for k in _children(os.getpid()):
        try:
            with open("/proc/%d/cmdline" % k, "rb") as fh:
                argv0 = fh.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if os.path.realpath(argv0) == os.path.realpath(sys.executable):
            workers.append(k)
    ranks = [r for r in range(n) if r != master_rank]
    if len(workers) != len(ranks):
        print("note: found %d Python child processes of the master (pids %s), expected %d workers: "
              "the workers' memory is not watched, only the master's"
              % (len(workers), ", ".join(map(str, workers)) or "none", len(ranks)))
        return pids
    pids.update(zip(ranks, workers))
    return pids


def _check(got, want, what):
    if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
        raise AssertionError("%s: got %r, expected %r" % (what, got, want))


class _Session:
    def __init__(self, args):
        import pytensor
        import pytensor.tensor as pt

        import synkhronos as synk

        self.synk = synk
        self.n = synk.fork(args.ranks, use_gpu=True if args.gpu else False, master_rank=MASTER_RANK,
                           precision=PRECISION)
        rng = np.random.default_rng(0)
        x = pt.matrix("x", dtype="float32")
        self.w_val = rng.standard_normal((COLS, OUT)).astype("float32")
        w = pytensor.shared(self.w_val, name="w", shape=self.w_val.shape)
        self.c = pytensor.shared(np.zeros(4, dtype="float32"), name="counter", shape=(4,))
        self.v = pytensor.shared(np.zeros(4 * self.n, dtype="float32"), name="v")
        self.f = synk.function([x], [(x.dot(w).sum(), "sum"), (x.max(), "max")], name="soak_f")
        self.step = synk.function([], updates=[(self.c, self.c + 1.0)], name="soak_step")
        self.touch = synk.function([], (self.v.sum(), "sum"), name="soak_touch")  # v lives on every rank
        synk.distribute()
        self.x_val = rng.standard_normal((ROWS, COLS)).astype("float32")
        self.data = synk.data(self.x_val)
        self.rng = rng
        self.steps = 0
        self.pids = _rank_pids(self.n, MASTER_RANK)

    def rss(self):
        return {r: _rss_mb(pid) for r, pid in sorted(self.pids.items())}

    def call(self, i, check):
        """Call number ``i``; returns how it was called."""
        rng = self.rng
        if i % 10 == 9:
            self.step()
            self.steps += 1
            if check:
                for r in range(self.n):
                    _check(self.synk.get_value(r, self.c), np.full(4, self.steps), "update counter")
            return "update"
        kind = i % 4
        if kind == 0:
            kwargs, rows = {}, np.arange(ROWS)
        elif kind == 1:
            rows = rng.integers(0, ROWS, BATCH_SIZES[i % len(BATCH_SIZES)])
            kwargs = {"batch": rows}
        elif kind == 2:
            a = int(rng.integers(0, ROWS - BATCH_SIZES[-1]))
            rows = np.arange(a, a + BATCH_SIZES[-1])
            kwargs = {"batch": slice(a, a + BATCH_SIZES[-1])}
        else:
            rows = np.arange(BATCH_SIZES[0])
            kwargs = {"batch": BATCH_SIZES[0], "num_slices": 2}
        total, top = self.f(self.data, **kwargs)
        if check:
            xs = self.x_val[rows]
            _check(total, xs.dot(self.w_val).sum(), "call %d sum" % i)
            _check(top, xs.max(), "call %d max" % i)
        return "call"

    def collective_cycle(self, j):
        """Eight collectives on ``v`` from a known value, each result checked;
        returns how many collectives ran."""
        synk, n, v = self.synk, self.n, self.v
        base = (np.arange(4 * n, dtype="float32") + j % 97)
        synk.scatter(v, np.tile(base, n))  # each rank gets 4n rows: a copy of base
        synk.all_gather(v)  # every rank: base repeated n times (broadcast below makes it base again)
        big = synk.gather(v)
        _check(big, np.tile(np.tile(base, n), (n, 1)), "all_gather + gather")
        r = j % n
        synk.broadcast(v, base)
        synk.set_value(r, v, base * 2)
        _check(synk.get_value(r, v), base * 2, "set_value + get_value")
        synk.all_reduce(v, op="sum")
        _check(synk.reduce(v, op="max", in_place=False), base * (n + 1), "all_reduce + reduce")
        self.touch()  # the session stays usable between cycles
        return 8


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--collectives", type=int, default=10000)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--check-every", type=int, default=1000)
    ap.add_argument("--gpu", action="store_true", help="GPU workers (one rank per GPU)")
    ap.add_argument("--quick", action="store_true", help="2000 calls, 400 collectives")
    ap.add_argument("--out", default=default_out(__file__))
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.collectives = 2000, 400
    info = machine_info()
    if args.gpu:
        info["gpu_name"] = gpu_name()
    print_machine(info)
    session = _Session(args)
    synk = session.synk
    device = synk.device_kind()
    precision = PRECISION if device == "gpu" else "float32 (CPU)"
    print("%d %s ranks; %d calls, %d collectives; precision %s"
          % (session.n, device.upper(), args.calls, args.collectives, precision))

    warmup = max(1, args.calls // 50)
    marks = set(np.linspace(warmup, args.calls, 11).astype(int))
    samples = []
    counts = {"call": 0, "update": 0, "checked": 0}
    t0 = time.monotonic()
    coll_done, cycle = 0, 0
    coll_per_call = args.collectives / max(args.calls, 1)
    for i in range(1, args.calls + 1):
        check = i % args.check_every == 0 or i == args.calls
        counts[session.call(i, check)] += 1
        counts["checked"] += check
        while coll_done < coll_per_call * i and coll_done < args.collectives:
            coll_done += session.collective_cycle(cycle)
            cycle += 1
        if i in marks:
            synk.synchronize()
            samples.append({"calls": i, "collectives": coll_done, "seconds": time.monotonic() - t0,
                            "rss_mb": session.rss()})
    elapsed = time.monotonic() - t0
    synk.close()

    first, last = samples[0], samples[-1]
    rows = []
    for r in sorted(first["rss_mb"]):
        a, b = first["rss_mb"][r], last["rss_mb"][r]
        rows.append([r, "master" if r == MASTER_RANK else "worker", "%.1f" % a, "%.1f" % b, "%+.1f" % (b - a),
                     "%+.1f" % (b - max(s["rss_mb"][r] for s in samples[:-1]))])
    print(table(["rank", "", "RSS MB at %d calls" % first["calls"], "at %d calls" % last["calls"],
                 "growth MB", "end - earlier max"], rows))
    print("%d calls (%d updates) and %d collectives in %.1f s: %.0f calls/s overall; %d results checked, "
          "all equal to numpy" % (args.calls, counts["update"], coll_done, elapsed, args.calls / elapsed,
                                  counts["checked"] + cycle))
    write_results(args.out, {"benchmark": "soak", "machine": info, "args": vars(args), "ranks": session.n,
                             "device": device, "precision": precision,
                             "calls": args.calls, "collectives": coll_done, "seconds": elapsed,
                             "checked_calls": counts["checked"], "checked_collective_cycles": cycle,
                             "samples": samples})


if __name__ == "__main__":
    main()
