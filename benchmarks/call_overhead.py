"""Per-call overhead, ``batch=`` scatter throughput and master memory of Synkhronos
functions on CPU workers.

What is measured (all ratios within one run; timings interleaved and repeated,
medians reported, because the machine may be shared and noisy):

(a) Call overhead.  A tiny function (a 64x32 float32 matrix input, output the
    mean of ``x.dot(w)`` with a 32x16 shared ``w``) called through
    ``synk.function`` on n = 1, 2, 4 ranks (``--ranks``), against the same graph
    compiled with plain ``pytensor.function`` and called on the same numpy data.
    Reported: median (and p90) microseconds per call and the added overhead
    ``synk - plain``.  Both are also timed "cold", each call right after a
    200 us sleep: on some machines (virtual ones especially) code runs several
    times slower just after the thread slept, and with workers the master (and
    every worker) sleeps once per call, so this shows how much of the overhead
    is that effect.  For context, the median round trip of a small pickled
    message between two plain processes is measured too, over a socket pair and
    through the shared-memory channel Synkhronos's workers use (``_wire.channel``):
    the floor of a master/worker protocol on each.
    Target: added overhead <= 150 us median with 2 ranks on a 2-core machine.

(b) Scatter throughput of ``batch=`` with a random index array: a function whose
    work is trivial (sum of x) called with ``batch=idx`` on a large Data, so each
    rank gathers its own rows from shared memory.  Compared, as GB/s of gathered
    rows, with one process doing ``np.copyto`` of the same number of contiguous
    bytes (memcpy), ``np.take`` of the same rows into a preallocated buffer, and
    the plain PyTensor function on ``x[idx]`` (gather + sum in one process).

(c) Master memory.  A float32 Data of each size in ``--sizes`` (MB; default 16
    and 1024) and a call with ``batch=`` a random index array of ``--mem-rows``
    rows.  The master's private memory (``RssAnon`` in /proc/self/status) and its
    peak resident memory (``VmHWM``, reset through /proc/self/clear_refs before
    each call) must grow by about the master's share of the gathered rows, not
    with the Data size.  A full copy of the Data is measured the same way as a
    control that the method sees copies.  This part runs in a child process with
    ``MALLOC_MMAP_THRESHOLD_=131072`` so that every transient allocation over
    128 KiB is a fresh mapping and shows in VmHWM (otherwise malloc may reuse
    pages it already holds and hide a copy).  /dev/shm and RAM are checked first;
    sizes that do not fit are scaled down (and the output says so).

(p) Profile (``--parts p``, not in the default): cProfile of the master and of
    every worker over the tiny calls of (a), as microseconds per call per
    function, written beside the JSON (``call_overhead_profile.txt``); see
    ``_call_profile.py``.

Run ``python benchmarks/call_overhead.py --quick`` for a smoke run.  Results go to
``benchmarks/results/call_overhead.json`` unless ``--out`` says otherwise.
"""

import argparse
import contextlib
import gc
import io
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    default_out,
    gpu_name,
    machine_info,
    median,
    percentile,
    print_machine,
    table,
    usable_cores,
    write_results,
)

ROW_FLOATS = 256  # float32 columns of the big Data in (b) and (c): 1 KiB rows
ROW_BYTES = ROW_FLOATS * 4
TARGET_OVERHEAD_US = 150.0
_MARK = "@@RESULT "
COLD_SLEEP_S = 200e-6


def _quiet():
    """Hide Synkhronos' progress messages (fork/distribute/close)."""
    return contextlib.redirect_stdout(io.StringIO())


def _status_kb(*keys):
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                out[k] = int(v.split()[0])
    return out


def _reset_hwm():
    """Reset VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _time_calls(fn, n, sleep_before=0.0):
    """Per-call seconds; with ``sleep_before`` the thread sleeps before each call
    (a "cold" call, as after waiting for workers)."""
    times = []
    pc = time.perf_counter
    for _ in range(n):
        if sleep_before:
            time.sleep(sleep_before)
        t0 = pc()
        fn()
        times.append(pc() - t0)
    return times


# ------------------------------------------------------------------- floors
def _echo_server(conn, names, spin):
    if names:
        from synkhronos._wire.channel import (
            ShmChannel,  # private on purpose: the floor is the library's channel
        )

        conn = ShmChannel(conn, spin, names, master=False)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send((True, msg))


def pipe_floor(calls, repeats, transport="socket"):
    """Median round trip of a small pickled message to another process and back:
    over a socket pair (``Connection``, blocking reads), or through Synkhronos's
    shared-memory channel (``"shm"``, as its workers wait: polling, then sleeping)."""
    # Private modules on purpose: this floor measures the library's own shared-memory channel.
    from synkhronos._common.env import spin_seconds
    from synkhronos._wire.channel import ShmChannel, shm_channel_names
    from synkhronos._wire.shared_memory import new_token

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    names = shm_channel_names(new_token(), 1) if transport == "shm" else None
    conn = Connection(ours.detach())
    if names:
        conn = ShmChannel(conn, spin_seconds(), names, master=True)
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with BLAS threads
    proc = ctx.Process(target=_echo_server, args=(Connection(theirs.detach()), names, spin_seconds()),
                       daemon=True)
    proc.start()
    # About the size of a CALL payload: a few names, offsets, shapes and slices.
    payload = (2, (0, [(("/synk_x_d0_1", 0, "<f4", (64, 32)), slice(32, 64))], [], None, (0,), 1))

    def once():
        conn.send(payload)
        conn.recv()

    try:
        _time_calls(once, min(200, calls))
        times = []
        for _ in range(repeats):
            times += _time_calls(once, calls)
        conn.send(None)
        proc.join(5)
    finally:
        if names:
            conn.unlink()
        conn.close()
    return times


# ------------------------------------------------------------------ (a) and (b)
def run_session(n, args, rng):
    """One fork(n) session: call overhead and scatter throughput."""
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    with _quiet():
        synk.fork(n, use_gpu=args.gpu)
    mode = "JAX" if args.gpu else None  # the plain function runs where synk's do
    try:
        x = pt.matrix("x", dtype="float32")
        w = pytensor.shared(rng.standard_normal((32, 16)).astype("float32"), name="w")
        tiny_out = x.dot(w).mean()
        f_tiny = synk.function([x], outputs=tiny_out)
        p_tiny = pytensor.function([x], tiny_out, mode=mode)
        if args.gpu:  # synk returns numpy: make the plain call wait for its value too
            p_jax = p_tiny

            def p_tiny(*a):
                return np.asarray(p_jax(*a))
        xb = pt.matrix("xb", dtype="float32")
        f_sum = synk.function([xb], outputs=(xb.sum(), "sum"))
        p_sum = pytensor.function([xb], xb.sum(), mode=mode)
        with _quiet():
            synk.distribute()

        res = {"ranks": n}
        if "a" in args.parts:
            res["a"] = _overhead(f_tiny, p_tiny, args, rng, synk)
        if "b" in args.parts:
            res["b"] = _scatter(f_sum, p_sum, args, rng, synk)
        return res
    finally:
        with _quiet():
            synk.close()


def _overhead(f_tiny, p_tiny, args, rng, synk):
    x_np = rng.standard_normal((64, 32)).astype("float32")
    x_d = synk.data(x_np)
    ok = bool(np.allclose(f_tiny(x_d), p_tiny(x_np), rtol=1e-4, atol=1e-5))
    _time_calls(lambda: f_tiny(x_d), min(200, args.calls))  # warm up both
    _time_calls(lambda: p_tiny(x_np), min(200, args.calls))
    synk_t, plain_t, synk_cold, plain_cold = [], [], [], []
    cold_calls = max(1, args.calls // 4)
    for _ in range(args.repeats):  # interleave blocks so both see the same noise
        plain_t += _time_calls(lambda: p_tiny(x_np), args.calls)
        synk_t += _time_calls(lambda: f_tiny(x_d), args.calls)
        plain_cold += _time_calls(lambda: p_tiny(x_np), cold_calls, COLD_SLEEP_S)
        synk_cold += _time_calls(lambda: f_tiny(x_d), cold_calls, COLD_SLEEP_S)
    x_d.free_memory()
    return overhead_stats(synk_t, plain_t, synk_cold, plain_cold, ok)


def overhead_stats(synk_t, plain_t, synk_cold, plain_cold, same_result):
    """Part (a) of one session from per-call seconds: synk and plain, warm and cold."""
    us = 1e6
    return {
        "plain_cold_us_median": median(plain_cold) * us,
        "synk_cold_us_median": median(synk_cold) * us,
        "same_result": same_result,
        "plain_us_median": median(plain_t) * us,
        "plain_us_p90": percentile(plain_t, 90) * us,
        "synk_us_median": median(synk_t) * us,
        "synk_us_p10": percentile(synk_t, 10) * us,
        "synk_us_p90": percentile(synk_t, 90) * us,
        "overhead_us_median": (median(synk_t) - median(plain_t)) * us,
        "calls_each": len(synk_t),
    }


def _fill(data, rng, chunk_rows=16384):
    """Write random values into a Data in chunks (no full-size temporary)."""
    rows = len(data)
    block = rng.standard_normal((min(chunk_rows, rows), ROW_FLOATS)).astype("float32")
    for start in range(0, rows, chunk_rows):
        stop = min(rows, start + chunk_rows)
        data.data[start:stop] = block[:stop - start]
        block[:, 0] += 1.0  # make chunks differ a little


def _scatter(f_sum, p_sum, args, rng, synk):
    total_rows = max(args.gather_rows, int(args.scatter_mb * 2**20) // ROW_BYTES)
    big = synk.data(shape=(total_rows, ROW_FLOATS), dtype="float32")
    _fill(big, rng)
    src = big.data
    idx = rng.permutation(total_rows)[:args.gather_rows].astype(np.int64)
    buf = np.empty((args.gather_rows, ROW_FLOATS), dtype="float32")
    contig = src[:args.gather_rows]

    methods = {
        "synk": lambda: f_sum(big, batch=idx),
        "plain_gather_sum": lambda: p_sum(src[idx]),
        "np_take": lambda: np.take(src, idx, axis=0, out=buf),
        "memcpy": lambda: np.copyto(buf, contig),
    }
    got, want = f_sum(big, batch=idx), p_sum(src[idx])
    ok = bool(np.isclose(got, want, rtol=1e-3))
    for fn in methods.values():
        fn()  # warm up
    times = {k: [] for k in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            times[name] += _time_calls(fn, args.b_calls)
    big.free_memory()
    return scatter_stats(times, total_rows, args.gather_rows, ok)


def scatter_stats(times, total_rows, index_rows, same_result):
    """Part (b) of one session from per-call seconds ``times[method]`` (methods:
    synk, plain_gather_sum, np_take, memcpy) gathering ``index_rows`` of ``total_rows``."""
    nbytes = index_rows * ROW_BYTES
    out = {"same_result": same_result, "gathered_mb": nbytes / 2**20,
           "data_mb": total_rows * ROW_BYTES / 2**20, "index_rows": index_rows}
    for name, t in times.items():
        out[name + "_ms_median"] = median(t) * 1e3
        out[name + "_gbps"] = nbytes / median(t) / 1e9
    out["synk_over_memcpy"] = out["synk_gbps"] / out["memcpy_gbps"]
    out["synk_over_plain"] = out["synk_gbps"] / out["plain_gather_sum_gbps"]
    return out


# ---------------------------------------------------------------------- (c)
def _fit_sizes(sizes_mb, notes):
    """Scale sizes down to what /dev/shm (and RAM, for the control copy) can hold."""
    shm_free = shutil.disk_usage("/dev/shm").free
    avail = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    fitted = []
    for mb in sizes_mb:
        want = int(mb * 2**20)
        # The Data lives in /dev/shm (counts against RAM too); the control copies it once.
        limit = min(shm_free * 0.8, (avail or shm_free) * 0.4)
        if want > limit:
            new = int(limit) // 2**20
            notes.append("size %d MB does not fit (/dev/shm free %.0f MB, MemAvailable %s MB): "
                         "scaled down to %d MB" % (mb, shm_free / 2**20,
                                                   "?" if avail is None else "%.0f" % (avail / 2**20), new))
            want = new * 2**20
        fitted.append(want)
    return fitted


def run_memory(args, notes):
    """Part (c), in the current process (the ``--_memory-child`` of ``main``)."""
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk

    pytensor.config.floatX = "float32"
    rng = np.random.default_rng(args.seed + 1)
    n = 2 if usable_cores() >= 2 else 1
    sizes = _fit_sizes(args.sizes, notes)
    if not _reset_hwm():
        notes.append("/proc/self/clear_refs not writable: VmHWM growth not measured")
        hwm_ok = False
    else:
        hwm_ok = True
    with _quiet():
        synk.fork(n, use_gpu=False)
    rows_out = []
    try:
        xb = pt.matrix("xb", dtype="float32")
        f_sum = synk.function([xb], outputs=(xb.sum(), "sum"))
        with _quiet():
            synk.distribute()
        # First call of the function (loads the compiled code, maps the exchange
        # buffers) on a small Data, so that the rows below show per-Data costs only.
        warm = synk.data(shape=(1024, ROW_FLOATS), dtype="float32")
        _fill(warm, rng)
        f_sum(warm, batch=rng.permutation(1024)[:100])
        warm.free_memory()
        del warm
        for nbytes in sizes:
            total_rows = max(args.mem_rows, nbytes // ROW_BYTES)
            d = synk.data(shape=(total_rows, ROW_FLOATS), dtype="float32")
            _fill(d, rng)
            idx = rng.permutation(total_rows)[:args.mem_rows].astype(np.int64)
            gc.collect()
            peaks = []
            before = _status_kb("RssAnon", "RssShmem")
            for _ in range(1 + args.mem_calls):  # the first call is reported apart
                if hwm_ok:
                    _reset_hwm()
                    h0 = _status_kb("VmHWM")["VmHWM"]
                f_sum(d, batch=idx)
                if hwm_ok:
                    peaks.append((_status_kb("VmHWM")["VmHWM"] - h0) / 1024)
            after = _status_kb("RssAnon", "RssShmem")
            row = memory_row(total_rows, args.mem_rows, n, before, after, peaks if hwm_ok else None)
            if hwm_ok:  # control: a real copy of the Data must show up
                gc.collect()
                _reset_hwm()
                c0 = _status_kb("VmHWM")["VmHWM"]
                copy = np.array(d.data, copy=True)
                row["control_full_copy_hwm_growth_mb"] = (_status_kb("VmHWM")["VmHWM"] - c0) / 1024
                del copy
            rows_out.append(row)
            d.free_memory()
            del d
            gc.collect()
    finally:
        with _quiet():
            synk.close()
    return rows_out


def memory_row(total_rows, index_rows, n, before, after, peaks):
    """Part (c) for one Data: ``before``/``after`` the calls, kB of RssAnon and
    RssShmem; ``peaks``: MB of VmHWM growth per call, the first call first (None
    where VmHWM could not be reset)."""
    return {
        "data_mb": total_rows * ROW_BYTES / 2**20,
        "index_rows": index_rows,
        "ranks": n,
        "master_share_mb": -(-index_rows // n) * ROW_BYTES / 2**20,
        "rss_anon_growth_mb": (after["RssAnon"] - before["RssAnon"]) / 1024,
        "rss_shmem_growth_mb": (after["RssShmem"] - before["RssShmem"]) / 1024,
        "vm_hwm_growth_first_call_mb": peaks[0] if peaks else None,
        "vm_hwm_growth_mb": max(peaks[1:]) if peaks and len(peaks) > 1 else None,
    }


def memory_in_child(args, notes):
    """Run part (c) in a fresh process whose malloc serves every allocation over
    128 KiB with its own mmap (``MALLOC_MMAP_THRESHOLD_``), so that any transient
    copy shows up in VmHWM instead of hiding in memory the heap already holds."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_memory-child",
           "--sizes", ",".join(str(s) for s in args.sizes), "--mem-rows", str(args.mem_rows),
           "--mem-calls", str(args.mem_calls), "--seed", str(args.seed)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            payload = json.loads(line[len(_MARK):])
            notes.extend(payload["notes"])
            return payload["rows"]
    sys.stderr.write(proc.stdout + proc.stderr)
    raise RuntimeError("memory child failed (exit code %d)" % proc.returncode)


def _memory_verdict(rows):
    """Passes if the peak growth does not follow the Data size."""
    if not rows or rows[0]["vm_hwm_growth_mb"] is None:
        return None

    def peak(r):
        return max(r["vm_hwm_growth_mb"], r["vm_hwm_growth_first_call_mb"])

    small, large = rows[0], rows[-1]
    share = max(r["master_share_mb"] for r in rows)
    slack = max(8.0, 2 * share)
    independent = peak(large) - peak(small) <= slack
    bounded = all(peak(r) <= slack + 0.1 * r["data_mb"] for r in rows)
    return bool(independent and bounded)


# ----------------------------------------------------------------------- main
DEFAULTS = dict(calls=2000, repeats=5, ranks="1,2,4", sizes="16,1024", scatter_mb=256.0,
                gather_rows=65536, b_calls=5, mem_rows=10000, mem_calls=3)
QUICK = dict(calls=300, repeats=3, ranks="1,2", sizes="16,128", scatter_mb=32.0,
             gather_rows=8192, b_calls=2, mem_rows=4000, mem_calls=2)


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d, q = DEFAULTS, QUICK
    p.add_argument("--calls", type=int, help="calls per timing block in (a) [%(d)s; quick %(q)s]"
                   % dict(d=d["calls"], q=q["calls"]))
    p.add_argument("--repeats", type=int, help="interleaved timing blocks per method [%s; quick %s]"
                   % (d["repeats"], q["repeats"]))
    p.add_argument("--ranks", help="comma-separated rank counts for (a) and (b) [%s; quick %s]"
                   % (d["ranks"], q["ranks"]))
    p.add_argument("--sizes", help="comma-separated Data sizes in MB for (c) [%s; quick %s]"
                   % (d["sizes"], q["sizes"]))
    p.add_argument("--scatter-mb", type=float, help="Data size in MB for (b) [%g; quick %g]"
                   % (d["scatter_mb"], q["scatter_mb"]))
    p.add_argument("--gather-rows", type=int, help="rows (1 KiB each) in the (b) index array [%s; quick %s]"
                   % (d["gather_rows"], q["gather_rows"]))
    p.add_argument("--b-calls", type=int, help="calls per method per block in (b) [%s; quick %s]"
                   % (d["b_calls"], q["b_calls"]))
    p.add_argument("--mem-rows", type=int, help="rows in the (c) index array [%s; quick %s]"
                   % (d["mem_rows"], q["mem_rows"]))
    p.add_argument("--mem-calls", type=int, help="calls measured in (c) [%s; quick %s]"
                   % (d["mem_calls"], q["mem_calls"]))
    p.add_argument("--parts", default="abc",
                   help="which parts to run, e.g. 'ac' [abc]; 'p' profiles the tiny call of (a) on "
                        "master and workers (cProfile) and writes the report beside the JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu", action="store_true", help="GPU ranks (JAX mode) instead of CPU workers")
    p.add_argument("--quick", action="store_true", help="small, fast settings for a smoke run")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/call_overhead.json)")
    p.add_argument("--_memory-child", dest="memory_child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    ranks_given = args.ranks is not None
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:  # explicit options win over --quick
            setattr(args, key, value)
    try:
        args.ranks = [int(r) for r in str(args.ranks).split(",") if r.strip()]
        args.sizes = [float(s) for s in str(args.sizes).split(",") if s.strip()]
    except ValueError as exc:
        p.error("--ranks and --sizes take comma-separated numbers (%s)" % exc)
    if not args.ranks or min(args.ranks) < 1 or args.calls < 1 or args.repeats < 1 or not args.sizes:
        p.error("--ranks, --sizes, --calls and --repeats must be positive")
    if set(args.parts) - set("abcp"):
        p.error("--parts takes letters from 'abcp'")
    if args.gpu:
        import synkhronos as synk

        gpus = len(synk.gpus())
        if ranks_given and max(args.ranks) > gpus:
            p.error("--ranks %s: only %d GPUs are visible" % (",".join(map(str, args.ranks)), gpus))
        args.ranks = [r for r in args.ranks if r <= gpus]  # the defaults, as far as there are GPUs
        if not args.ranks:
            p.error("--gpu needs a visible GPU")
    return args


def make_payload(info, args, sessions, pipe_times=None, memory=None, notes=()):
    """The JSON results file's contents: ``sessions`` from ``run_session`` (one per
    rank count), ``pipe_times`` the per-call seconds of ``pipe_floor`` (part a),
    ``memory`` the rows of part (c)."""
    results = {"benchmark": "call_overhead", "machine": info, "settings": {
        k: v for k, v in vars(args).items() if k != "out"}, "notes": list(notes), "sessions": sessions}
    if pipe_times is not None:  # {"socket": [...], "shm": [...]}
        results["pipe_round_trip_us_median"] = median(pipe_times["socket"]) * 1e6
        if "shm" in pipe_times:
            results["shm_round_trip_us_median"] = median(pipe_times["shm"]) * 1e6
    for s in sessions:
        if "a" in s and s["ranks"] == 2:
            overhead = s["a"]["overhead_us_median"]
            results["target_a"] = {"ranks": 2, "target_us": TARGET_OVERHEAD_US, "overhead_us": overhead,
                                   "pass": overhead <= TARGET_OVERHEAD_US,
                                   "two_core_machine": info["usable_cores"] == 2}
    if memory is not None:
        results["memory"] = memory
        results["memory_pass"] = _memory_verdict(memory)
    return results


def main(argv=None):
    args = _parse(argv)
    if args.memory_child:
        notes = []
        rows = run_memory(args, notes)
        print(_MARK + json.dumps({"rows": rows, "notes": notes}), flush=True)
        return
    import pytensor

    pytensor.config.floatX = "float32"
    info = machine_info()
    if args.gpu:
        import synkhronos as synk

        info["gpus"] = len(synk.gpus())
        info["gpu_name"] = gpu_name()
    print_machine(info)
    cores = info["usable_cores"]
    print("(timings on a shared machine are noisy: blocks are interleaved and medians reported)\n")
    rng = np.random.default_rng(args.seed)
    notes = []

    sessions = []
    if "a" in args.parts or "b" in args.parts:
        for n in args.ranks:
            print("running n=%d ranks ..." % n, flush=True)
            sessions.append(run_session(n, args, rng))
    floor = None
    if "a" in args.parts:
        floor = {t: pipe_floor(args.calls, args.repeats, t) for t in ("socket", "shm")}
    results = make_payload(info, args, sessions, floor, None, notes)  # (c) comes below

    if "a" in args.parts:
        rows = []
        target = results.get("target_a")
        for s in sessions:
            a = s["a"]
            mark = ""
            if target and s["ranks"] == target["ranks"]:
                mark = "PASS" if target["pass"] else "FAIL"
            rows.append([s["ranks"], "%.1f" % a["plain_us_median"], "%.1f" % a["synk_us_median"],
                         "%.1f" % a["synk_us_p90"], "%.1f" % a["overhead_us_median"],
                         "yes" if s["ranks"] > cores else "", mark,
                         "%.1f" % a["plain_cold_us_median"], "%.1f" % a["synk_cold_us_median"],
                         "ok" if a["same_result"] else "DIFF"])
        print("\n(a) call overhead, tiny function (us per call, median of %d calls each; %d usable cores)"
              % (sessions[0]["a"]["calls_each"], cores))
        if args.gpu:
            print("float32 products: full float32 on both sides (fork's precision='highest' also sets "
                  "the master's JAX, where the plain function runs)")
        print(table(["ranks", "plain", "synk", "synk p90", "added", "oversub", "<=150us @2",
                     "plain cold", "synk cold", "result"], rows))
        print("cold = the same call right after a %.0f us sleep (caches and predictors of an idle core "
              "lose state; a master waiting for workers sleeps every call)" % (COLD_SLEEP_S * 1e6))
        print("two-process round trip of the same payload, no synk: %.1f us over a socket pair, "
              "%.1f us through synk's shared-memory channel (medians)"
              % (results["pipe_round_trip_us_median"], results["shm_round_trip_us_median"]))

    if "b" in args.parts:
        rows = []
        for s in sessions:
            b = s["b"]
            rows.append([s["ranks"], "%.2f" % b["synk_gbps"], "%.2f" % b["plain_gather_sum_gbps"],
                         "%.2f" % b["np_take_gbps"], "%.2f" % b["memcpy_gbps"],
                         "%.2f" % b["synk_over_memcpy"], "%.2f" % b["synk_over_plain"],
                         "ok" if b["same_result"] else "DIFF"])
        b0 = sessions[0]["b"]
        print("\n(b) batch= scatter of %d random rows (%.0f MB of a %.0f MB Data), GB/s of gathered rows"
              % (b0["index_rows"], b0["gathered_mb"], b0["data_mb"]))
        print(table(["ranks", "synk", "1-proc gather+sum", "np.take", "memcpy", "synk/memcpy",
                     "synk/1-proc", "result"], rows))

    if "c" in args.parts:
        print("\nrunning (c) master memory ...", flush=True)
        results = make_payload(info, args, sessions, floor, memory_in_child(args, notes), notes)
        mem, verdict = results["memory"], results["memory_pass"]

        def fmt(v):
            return "n/a" if v is None else "%.1f" % v

        rows = [[fmt(r["data_mb"]), r["index_rows"], r["ranks"], fmt(r["master_share_mb"]),
                 fmt(r["rss_anon_growth_mb"]), fmt(r["vm_hwm_growth_first_call_mb"]),
                 fmt(r["vm_hwm_growth_mb"]), fmt(r.get("control_full_copy_hwm_growth_mb"))] for r in mem]
        print("\n(c) master memory, calls with batch=<random index array> (MB; peak = VmHWM growth "
              "within one call)")
        print(table(["Data", "idx rows", "ranks", "master share", "dRssAnon after",
                     "peak 1st call", "peak later calls", "control: peak of a full copy"], rows))
        print("peak growth independent of Data size: %s"
              % {True: "PASS", False: "FAIL", None: "not measured"}[verdict])
    out = args.out or default_out(__file__)
    if "p" in args.parts:
        from _call_profile import profile_calls

        lines = []
        for n in args.ranks:
            print("profiling n=%d ranks ..." % n, flush=True)
            lines += profile_calls(n, args.gpu, args.calls, rng) + [""]
        path = os.path.splitext(out)[0] + "_profile.txt"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(lines))
        print("profile written to %s" % path)
    for note in notes:
        print("note: " + note)
    write_results(out, results)


if __name__ == "__main__":
    main()
