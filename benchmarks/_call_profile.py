"""Where a tiny call's time goes: cProfile of the master and of every worker
over the same calls (``call_overhead.py --parts p``).

The workers are started with ``fork(profile_workers=True)``; each writes its
profile when the session closes.  The report lists, per process, the functions
with the most own time and the most cumulative time, as microseconds per call
(the profiler itself slows Python down, so read the shares, not the totals).
"""

import contextlib
import glob
import io
import os
import pstats
import tempfile
import time

__all__ = ["profile_calls"]


def _top(stats, calls, key, limit, per_call_only):
    """Lines of ``stats``' ``limit`` functions with the most ``key`` time, in us
    per call; with ``per_call_only``, only functions that ran in most calls."""
    entries = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        if per_call_only and ncalls < 0.9 * calls:
            continue
        where = "%s:%d(%s)" % (os.path.basename(path), line, name) if line else name
        entries.append((tottime if key == "tottime" else cumtime, tottime, cumtime, ncalls, where))
    entries.sort(reverse=True)
    out = ["  %9s %9s %9s  %s" % ("own us", "cum us", "calls", "function")]
    for _, tottime, cumtime, ncalls, where in entries[:limit]:
        out.append("  %9.1f %9.1f %9.2f  %s" % (tottime / calls * 1e6, cumtime / calls * 1e6,
                                                 ncalls / calls, where))
    return out


def _report(title, stats, calls, limit, per_call_only=False):
    lines = ["== %s: per call, %d calls" % (title, calls), "-- most own time"]
    lines += _top(stats, calls, "tottime", limit, per_call_only)
    lines += ["-- most cumulative time"] + _top(stats, calls, "cumtime", limit, per_call_only)
    return lines


def profile_calls(n, use_gpu, calls, rng, limit=30):
    """Profile ``calls`` tiny calls on ``n`` ranks; returns the report's lines."""
    import cProfile

    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    started = time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        synk.fork(n, use_gpu=use_gpu, profile_workers=True)
    try:
        x = pt.matrix("x", dtype="float32")
        w = pytensor.shared(rng.standard_normal((32, 16)).astype("float32"), name="w")
        f_tiny = synk.function([x], outputs=x.dot(w).mean())
        with contextlib.redirect_stdout(io.StringIO()):
            synk.distribute()
        x_d = synk.data(rng.standard_normal((64, 32)).astype("float32"))
        for _ in range(200):  # compile and warm up outside the profile
            f_tiny(x_d)
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        for _ in range(calls):
            f_tiny(x_d)
        profiler.disable()
        wall = (time.perf_counter() - t0) / calls
        x_d.free_memory()
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            synk.close()
    lines = ["%d rank(s), %s: %.1f us per call under the profiler" % (n, "GPU" if use_gpu else "CPU",
                                                                      wall * 1e6)]
    lines += _report("master", pstats.Stats(profiler), calls, limit)
    pattern = os.path.join(tempfile.gettempdir(), "synkhronos_worker_*.prof")
    for path in sorted(glob.glob(pattern)):
        if os.path.getmtime(path) < started:
            continue  # an earlier session's
        # Workers profile their whole life: start-up and compilation are left
        # out by listing only functions that ran in (nearly) every call.
        lines += _report("worker %s" % os.path.basename(path), pstats.Stats(path), calls + 200, limit,
                         per_call_only=True)
        os.remove(path)
    return lines
