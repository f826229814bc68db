"""Pictures of the benchmark results: one PNG per results JSON, drawn next to it.

Each benchmark script writes its JSON with ``_common.write_results``, which calls
:func:`write_plot` here; ``benchmarks/plot.py`` redraws the PNG of JSON files
written earlier (no GPU needed).  Every plotting function takes the payload the
script wrote (the dict, as read back from JSON) and the PNG path.

Matplotlib is imported inside the functions, never at import time, so that a
benchmark runs and writes its JSON without it; :func:`write_plot` then prints one
line saying that the PNG was skipped.  Figures are ``matplotlib.figure.Figure``
objects drawn by the Agg canvas: no pyplot, no global backend switch.  Their
size in pixels is fixed (``FIGSIZE`` x ``DPI``; no tight bounding box), so a
page that shows them can rely on it; only the PyMC pictures' size follows their
panels (see ``_plots_pymc``).

This module is the entry point: :func:`write_plot`, :func:`benchmark_name`,
:func:`png_path` and the ``PLOTTERS`` table.  The plotting functions live in
``_plots_gpu`` (resnet50_scaling, resnet50_profile, gpu_scaling, collectives,
bf16_loss_curve), ``_plots_inputs`` (gpu_inputs), ``_plots_cpu`` (cpu_scaling,
cpu_backends, call_overhead, soak,
mpi_collectives, session_start) and ``_plots_pymc`` (pymc_likelihood, jax_batched_forms,
rows_kernel_blocks), the figure and caption helpers with ``FIGSIZE`` and ``DPI`` in ``_plot_common``; all of
them are re-exported here.  None of them imports a benchmark script: a picture is
drawn from the payload alone, so ``plot.py`` redraws it without the script's
dependencies.
"""

import json
import os

from _plot_common import DPI, FIGSIZE
from _plots_cpu import (
    plot_call_overhead,
    plot_cpu_backends,
    plot_cpu_scaling,
    plot_mpi_collectives,
    plot_session_start,
    plot_soak,
)
from _plots_gpu import (
    plot_bf16_loss_curve,
    plot_collectives,
    plot_gpu_scaling,
    plot_resnet50_profile,
    plot_resnet50_scaling,
)
from _plots_inputs import plot_gpu_inputs
from _plots_pymc import (
    plot_jax_batched_forms,
    plot_pymc_libraries,
    plot_pymc_likelihood,
    plot_pymc_loo,
    plot_rows_kernel_blocks,
)
from _plots_timeline import plot_call_timeline

__all__ = [
    "DPI",
    "FIGSIZE",
    "PLOTTERS",
    "benchmark_name",
    "plot_bf16_loss_curve",
    "plot_call_overhead",
    "plot_call_timeline",
    "plot_collectives",
    "plot_cpu_backends",
    "plot_cpu_scaling",
    "plot_gpu_inputs",
    "plot_gpu_scaling",
    "plot_jax_batched_forms",
    "plot_mpi_collectives",
    "plot_pymc_likelihood",
    "plot_pymc_libraries",
    "plot_pymc_loo",
    "plot_resnet50_profile",
    "plot_resnet50_scaling",
    "plot_rows_kernel_blocks",
    "plot_session_start",
    "plot_soak",
    "png_path",
    "write_plot",
]

INSTALL_HINT = "pip install matplotlib"

PLOTTERS = {
    "bf16_loss_curve": plot_bf16_loss_curve,
    "call_overhead": plot_call_overhead,
    "call_timeline": plot_call_timeline,
    "collectives": plot_collectives,
    "cpu_backends": plot_cpu_backends,
    "cpu_scaling": plot_cpu_scaling,
    "gpu_inputs": plot_gpu_inputs,
    "gpu_scaling": plot_gpu_scaling,
    "jax_batched_forms": plot_jax_batched_forms,
    "mpi_collectives": plot_mpi_collectives,
    "pymc_likelihood": plot_pymc_likelihood,
    "pymc_libraries": plot_pymc_libraries,
    "pymc_loo": plot_pymc_loo,
    "resnet50_profile": plot_resnet50_profile,
    "rows_kernel_blocks": plot_rows_kernel_blocks,
    "rows_kernel_forms": plot_jax_batched_forms,
    "resnet50_scaling": plot_resnet50_scaling,
    "session_start": plot_session_start,
    "soak": plot_soak,
}


def benchmark_name(json_path, payload, kind=None):
    """Which benchmark wrote ``payload``.

    Parameters
    ----------
    json_path : str
        The results file (its name is the fallback).
    payload : dict
        Its contents.
    kind : str, optional
        An explicit name, which wins.

    Returns
    -------
    str
        A key of ``PLOTTERS``: ``kind``, else the payload's ``"benchmark"`` key,
        else the file name stem, else the longest benchmark name the stem starts
        with (``collectives_h200.json`` -> ``collectives``).

    Raises
    ------
    ValueError
        Where none of these names a known benchmark; the message names the file.
    """
    stem = os.path.splitext(os.path.basename(json_path))[0]
    name = kind or (payload.get("benchmark") if isinstance(payload, dict) else None)
    if name is None:
        name = stem if stem in PLOTTERS else max(
            (k for k in PLOTTERS if stem.startswith(k)), key=len, default=stem)
    if name not in PLOTTERS:
        raise ValueError("%s: unknown benchmark %r (%s); known: %s" % (
            json_path, name, "given" if kind else "from its 'benchmark' key" if name != stem
            else "from the file name, no 'benchmark' key", ", ".join(sorted(PLOTTERS))))
    return name


def png_path(json_path):
    """The PNG beside ``json_path``: the same path ending in ``.png``."""
    root, ext = os.path.splitext(json_path)
    return (root if ext.lower() == ".json" else json_path) + ".png"


def write_plot(json_path, payload, kind=None, required=False):
    """Draw the PNG beside a results JSON and print its path.

    Parameters
    ----------
    json_path : str
        The results file just written (or being re-plotted).
    payload : dict
        Its contents.  It goes through a JSON round trip first, so the plot sees
        exactly what the file holds (string keys, no tuples), whether called
        right after ``write_json`` or on a file read back later.
    kind : str, optional
        The benchmark; see :func:`benchmark_name`.
    required : bool, optional
        If False (the benchmarks), a missing matplotlib prints one line and
        returns None; if True (``plot.py``), it raises ImportError.

    Returns
    -------
    str or None
        The PNG path, or None where matplotlib is missing.
    """
    name = benchmark_name(json_path, payload, kind)
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        if required:
            raise ImportError("matplotlib is needed to draw %s (%s)"
                              % (png_path(json_path), INSTALL_HINT)) from exc
        print("PNG skipped: matplotlib is not installed (%s, then: python benchmarks/plot.py %s)"
              % (INSTALL_HINT, json_path))
        return None
    payload = json.loads(json.dumps(payload, default=str))
    png = PLOTTERS[name](payload, png_path(json_path))
    print("picture written to %s" % png)
    return png
