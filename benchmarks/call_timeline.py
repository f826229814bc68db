"""Where a call's time goes, process by process: a timeline of a tiny function
call and of all-reduces on n ranks, from probes in the master and every worker.

Each chosen Synkhronos function (sending and reading a command, the rank's
share of a call, its JAX call, the output reduction, DLPack imports...) is
wrapped as its module is imported (``_timeline_probes/sitecustomize.py``, put
on ``PYTHONPATH`` of a child process and so of the workers it spawns), and
records its start and end on the machine's one monotonic clock.  For each
call of the master, every process's events are placed relative to that call's
start; the table gives, per process and function, the median start, end and
duration over the timed calls (``#k``: the k-th run of that function within a
call).  A probe costs about a microsecond per run, so read the timeline, not
the totals, and take speed figures from ``call_overhead.py`` and
``collectives.py``.

Cases (``--cases``):

- ``tiny``: the tiny function of ``call_overhead.py`` (64x32 float32 rows per
  rank, output the mean of ``x.dot(w)``), after a warm-up;
- ``all_reduce_1mb``: ``synk.all_reduce`` of one 1 MB float32 variable, back
  to back;
- ``all_reduce_16x64kb``: the same bytes in 16 variables of 64 KB, one call;
- ``all_reduce_64mb_synced``: ``synk.all_reduce`` of one 64 MB float32
  variable, then ``synk.synchronize()``: a collective waited for.

The plain JAX-mode function's median time on the master's device is printed
beside the tiny call for scale.  Workers are named by start order (worker 1
is the first spawned, rank 1 with the default master rank).

Run ``python benchmarks/call_timeline.py --gpu --ranks 2,4``; results go to
``benchmarks/results/call_timeline.json`` and a picture of each median call
beside it.
"""

import argparse
import contextlib
import glob
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np
from _common import default_out, gpu_name, machine_info, print_machine, table, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
PROBES = os.path.join(HERE, "_timeline_probes")
CASES = ("tiny", "all_reduce_1mb", "all_reduce_16x64kb", "all_reduce_64mb_synced")
TOP = {"tiny": "call", "all_reduce_1mb": "call_all_reduce", "all_reduce_16x64kb": "call_all_reduce",
       "all_reduce_64mb_synced": "case"}


def _run_cases(n, use_gpu, cases, calls):
    """In the child: run ``cases`` on ``n`` ranks; returns {case: (start ns, end
    ns, median us per call)} and the plain function's median in us."""
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    rng = np.random.default_rng(0)
    xv = rng.standard_normal((64, 32)).astype("float32")
    wv = rng.standard_normal((32, 16)).astype("float32")
    with contextlib.redirect_stdout(io.StringIO()):
        synk.fork(n, use_gpu=use_gpu)
    x = pt.matrix("x", dtype="float32")
    f = synk.function([x], outputs=x.dot(pytensor.shared(wv, name="w")).mean())
    one = [pytensor.shared(np.ones(1 << 18, "float32"), name="one")]
    many = [pytensor.shared(np.ones(1 << 14, "float32"), name="v%d" % i) for i in range(16)]
    big_size = 1 << 24 if "all_reduce_64mb_synced" in cases else 1
    big = [pytensor.shared(np.ones(big_size, "float32"), name="big")]
    synk.function([], outputs=sum(v[0] for v in one + many + big))  # the variables must be in a function
    with contextlib.redirect_stdout(io.StringIO()):
        synk.distribute()
    xd = synk.data(np.tile(xv, (n, 1)))
    import sitecustomize  # the probes: a synced case is one traced "case" of two calls

    def synced():
        synk.all_reduce(big)
        synk.synchronize()

    runs = {"tiny": lambda: f(xd), "all_reduce_1mb": lambda: synk.all_reduce(one),
            "all_reduce_16x64kb": lambda: synk.all_reduce(many),
            "all_reduce_64mb_synced": sitecustomize._wrap(synced, "case")}
    spans = {}
    for case in cases:
        run = runs[case]
        for _ in range(min(500, calls)):
            run()
        synk.synchronize()
        times = []
        start = time.perf_counter_ns()
        for _ in range(calls):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        synk.synchronize()
        spans[case] = (start, time.perf_counter_ns(), float(np.median(times)) * 1e6)
    xd.free_memory()
    with contextlib.redirect_stdout(io.StringIO()):
        synk.close()
    plain = pytensor.function([x], x.dot(pytensor.shared(wv)).mean(), mode="JAX")
    for _ in range(500):
        np.asarray(plain(xv))
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        np.asarray(plain(xv))
        times.append(time.perf_counter() - t)
    return spans, float(np.median(times)) * 1e6


def child(args):
    """Run the cases with the probes loaded; write the events of every process."""
    import sitecustomize  # the probes (see _timeline_probes)

    spans, plain = _run_cases(args.ranks[0], args.gpu, args.cases, args.calls)
    sitecustomize.dump()
    time.sleep(1)  # the workers write theirs as they stop serving
    with open(os.path.join(os.environ["SYNK_TRACE_DIR"], "spans.json"), "w") as f:
        json.dump({"spans": spans, "plain_us": plain, "master": os.getpid()}, f)


def _processes(directory):
    spans = json.load(open(os.path.join(directory, "spans.json")))
    procs, workers = {}, []
    for path in glob.glob(os.path.join(directory, "trace-*.json")):
        d = json.load(open(path))
        if d["pid"] == spans["master"]:
            procs["master"] = d["events"]
        else:
            workers.append((d["pid"], d["events"]))
    for i, (_, events) in enumerate(sorted(workers)):
        procs["worker %d" % (i + 1)] = events
    return spans, procs


def timeline(procs, start, end, top):
    """Median (start, end, duration) in us from each call's start, per process,
    function and run within the call; and the number of calls."""
    calls = sorted((t0, t1) for name, t0, t1 in procs["master"] if name == top and start <= t0 <= end)
    starts = np.array([c[0] for c in calls])
    found = defaultdict(list)
    for proc, events in procs.items():
        runs = defaultdict(lambda: defaultdict(int))
        for name, t0, t1 in sorted(events, key=lambda e: e[2]):
            i = int(np.searchsorted(starts, t1, side="right")) - 1  # the call it ended in
            if i < 0 or t1 > calls[i][1]:
                continue
            k = runs[i][name]
            runs[i][name] += 1
            found[(proc, name, k)].append(((t0 - starts[i]) / 1e3, (t1 - starts[i]) / 1e3))
    rows = []
    for (proc, name, k), v in found.items():
        if len(v) < 0.5 * len(calls):  # not in most calls
            continue
        a = np.array(v)
        rows.append({"process": proc, "what": name + ("#%d" % k if k else ""),
                     "start_us": float(np.median(a[:, 0])), "end_us": float(np.median(a[:, 1])),
                     "duration_us": float(np.median(a[:, 1] - a[:, 0])), "calls": len(v)})
    rows.sort(key=lambda r: r["start_us"])
    return rows, len(calls)


def parent(args):
    info = machine_info()
    if args.gpu:
        import synkhronos as synk

        info["gpu_name"], info["gpus"] = gpu_name(), len(synk.gpus())
    print_machine(info)
    results = []
    for n in args.ranks:
        with tempfile.TemporaryDirectory(prefix="synk_timeline_") as directory:
            path = [PROBES] + [p for p in [os.environ.get("PYTHONPATH")] if p]
            env = dict(os.environ, SYNK_TRACE_DIR=directory, PYTHONPATH=os.pathsep.join(path))
            cmd = [sys.executable, os.path.abspath(__file__), "--_child", "--ranks", str(n), "--calls",
                   str(args.calls), "--cases", ",".join(args.cases)] + (["--gpu"] if args.gpu else [])
            subprocess.run(cmd, env=env, check=True)
            spans, procs = _processes(directory)
        for case in args.cases:
            start, end, per_call = spans["spans"][case]
            rows, calls = timeline(procs, start, end, TOP[case])
            print("\n== %s on %d %s ranks: median %.1f us per call (%d calls traced)%s"
                  % (case, n, "GPU" if args.gpu else "CPU", per_call, calls,
                     "; plain JAX-mode function %.1f us" % spans["plain_us"] if case == "tiny" else ""))
            print(table(["start us", "end us", "duration us", "process", "what"],
                        [["%.1f" % r["start_us"], "%.1f" % r["end_us"], "%.1f" % r["duration_us"],
                          r["process"], r["what"]] for r in rows]))
            results.append({"case": case, "ranks": n, "median_us": per_call, "plain_us": spans["plain_us"],
                            "calls": calls, "rows": rows})
    write_results(args.out or default_out(__file__),
                  {"benchmark": "call_timeline", "machine": info, "gpu": args.gpu, "results": results})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="GPU ranks (default: CPU workers)")
    p.add_argument("--ranks", default="2", help="comma-separated rank counts (default 2)")
    p.add_argument("--calls", type=int, default=2000, help="timed calls per case")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/call_timeline.json)")
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.ranks = [int(r) for r in args.ranks.split(",")]
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        p.error("--cases: unknown %s; known: %s" % (", ".join(unknown), ", ".join(CASES)))
    if args._child:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
