"""How long a session takes to start: CPU workers spawned, or forked by a template.

A user's script forks once; a notebook, a test suite or a server forks, closes
and forks again.  Each child process here is a fresh master that runs
``--sessions`` sessions of ``--ranks`` CPU ranks one after the other, each one
``fork()``, one small function, ``distribute()``, one call and ``close()``, and
times every step.  Both ways alternate, ``--rounds`` times:

* ``spawn``:    ``SYNKHRONOS_WORKER_START=spawn``: every worker starts a Python
                and imports NumPy, PyTensor and JAX itself;
* ``template``: the default: a template process, started at the first
                ``fork()``, forks each worker (``synkhronos._session.template``).

Reported: the first session's and the later sessions' time from ``fork()`` to
the first result (medians over rounds; later sessions: the median of each
round's later sessions), and the master's CPU time.

``python benchmarks/session_start.py --quick`` runs one round of 3 sessions.
Results go to ``benchmarks/results/session_start.json`` unless ``--out`` says otherwise.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import default_out, machine_info, median, print_machine, table, write_results  # noqa: E402

METHODS = ("spawn", "template")
STEPS = ("fork", "distribute", "call", "close")


def child(n_sessions, ranks):
    """One master: ``n_sessions`` sessions; prints one JSON line of step times."""
    import numpy as np
    import pytensor.tensor as pt

    import synkhronos as synk

    sessions = []
    for _ in range(n_sessions):
        t = [time.perf_counter()]
        synk.fork(ranks, use_gpu=False)
        t.append(time.perf_counter())
        x = pt.vector("x")
        f = synk.function([x], (x.sum(), "sum"))
        synk.distribute()
        t.append(time.perf_counter())
        total = f(synk.data(np.ones(4 * ranks, dtype=x.dtype)))
        t.append(time.perf_counter())
        synk.close()
        t.append(time.perf_counter())
        assert float(total) == 4 * ranks
        sessions.append({step: t[i + 1] - t[i] for i, step in enumerate(STEPS)})
    print("@@RESULT " + json.dumps(dict(sessions=sessions, master_cpu_s=time.process_time())))


def _run_child(method, n_sessions, ranks):
    env = dict(os.environ, SYNKHRONOS_WORKER_START=method)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", str(n_sessions),
                           "--ranks", str(ranks)], env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError("%s child failed:\n%s" % (method, proc.stderr[-3000:]))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT ")][-1]
    return dict(json.loads(line[9:]), method=method, wall_s=wall)


def _to_result(session):
    return session["fork"] + session["distribute"] + session["call"]


def summarize(runs):
    """Per method: medians over rounds of the first session's and the later
    sessions' time to the first result, and of each step."""
    out = []
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        row = dict(method=method,
                   first_s=median([_to_result(r["sessions"][0]) for r in mine]),
                   later_s=median([median([_to_result(s) for s in r["sessions"][1:]]) for r in mine]),
                   master_cpu_s=median([r["master_cpu_s"] for r in mine]))
        for step in STEPS:
            row["later_%s_s" % step] = median([median([s[step] for s in r["sessions"][1:]]) for r in mine])
        out.append(row)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="ranks per session (default 2)")
    p.add_argument("--sessions", type=int, default=6, help="sessions per master (default 6; at least 2)")
    p.add_argument("--rounds", type=int, default=5, help="alternations of the two ways (default 5)")
    p.add_argument("--quick", action="store_true", help="one round of 3 sessions")
    p.add_argument("--out", default=None)
    p.add_argument("--_child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child is not None:
        return child(args._child, args.ranks)
    if args.quick:
        args.sessions, args.rounds = 3, 1
    if args.sessions < 2:
        p.error("--sessions %d: at least 2 (the first session and a later one)" % args.sessions)
    info = machine_info()
    print_machine(info)
    runs = []
    for r in range(args.rounds):
        for method in METHODS if r % 2 == 0 else METHODS[::-1]:
            runs.append(dict(_run_child(method, args.sessions, args.ranks), round=r))
    summary = summarize(runs)
    print(table(["workers", "first session (s)", "later sessions (s)", "fork", "distribute", "call", "close",
                 "master CPU (s)"],
                [[s["method"], "%.3f" % s["first_s"], "%.3f" % s["later_s"]]
                 + ["%.3f" % s["later_%s_s" % step] for step in STEPS] + ["%.2f" % s["master_cpu_s"]]
                 for s in summary]))
    print("from fork() to the first result; steps: later sessions; medians of %d round(s), %d ranks, "
          "float64 on both sides" % (args.rounds, args.ranks))
    write_results(args.out or default_out(__file__), dict(
        benchmark="session_start", machine=info, summary=summary, runs=runs,
        settings=dict(ranks=args.ranks, sessions=args.sessions, rounds=args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
