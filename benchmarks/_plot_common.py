"""Shared pieces of the benchmark pictures: the figure, its caption, axis styling.

Used by the plotting functions in ``_plots_gpu`` and ``_plots_cpu``; the entry
point is ``_plots`` (``write_plot``, ``PLOTTERS``), which re-exports ``FIGSIZE``
and ``DPI``.  Matplotlib is imported inside the functions, never at import time.
Figures are ``matplotlib.figure.Figure`` objects drawn by the Agg canvas (no
pyplot), of a fixed size in pixels: ``FIGSIZE`` x ``DPI``, no tight bounding box.
"""

import math
import textwrap

# The helpers keep their leading underscore: they are for the _plots* modules only.
__all__ = [
    "DPI",
    "FIGSIZE",
    "_GREY",
    "_figure",
    "_finish",
    "_headroom",
    "_int_ticks",
    "_machine_line",
    "_nan",
    "_style",
    "_thousands",
]

DPI = 100
#: Figure size in inches per benchmark (pixels: these times ``DPI``).
FIGSIZE = {
    "bf16_loss_curve": (12.0, 5.0),
    "call_overhead": (15.0, 5.0),
    "collectives": (13.0, 5.5),
    "cpu_backends": (13.0, 5.0),
    "cpu_scaling": (12.0, 5.0),
    "gpu_scaling": (12.0, 5.0),
    "mpi_collectives": (15.0, 5.0),
    "resnet50_profile": (13.0, 5.0),
    "resnet50_scaling": (12.0, 5.0),
    "gpu_inputs": (12.0, 5.0),
    "session_start": (12.0, 5.0),
    "soak": (12.0, 5.0),
}
_CAPTION_PT = 8.5
_GREY = "0.35"


# ------------------------------------------------------------------ helpers
def _figure(kind, ncols):
    """A constrained-layout figure of ``FIGSIZE[kind]`` with ``ncols`` panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE[kind], dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def _finish(fig, title, caption_lines, png):
    """Title, a small grey caption under the panels, and the PNG at fixed size."""
    # Wrap to the figure's width (DejaVu Sans averages about 0.6 em per character).
    width = int(fig.get_figwidth() * 72 / (_CAPTION_PT * 0.6))
    lines = [w for ln in caption_lines if ln for w in textwrap.wrap(ln, width, subsequent_indent="  ")]
    height_pt = fig.get_figheight() * 72
    bottom = (len(lines) * _CAPTION_PT * 1.35 + 8) / height_pt
    fig.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))
    fig.suptitle(title, fontsize=13, fontweight="bold")
    if lines:
        fig.text(0.008, 0.012, "\n".join(lines), ha="left", va="bottom", fontsize=_CAPTION_PT,
                 color=_GREY, linespacing=1.35)
    fig.savefig(png, dpi=DPI)
    return png


def _date(machine):
    return (machine.get("time") or "")[:10] or "date not recorded"


def _versions(machine):
    parts = ["%s %s" % (name, machine[key]) for name, key in
             (("synkhronos", "synkhronos"), ("PyTensor", "pytensor"), ("Python", "python"))
             if machine.get(key)]
    return ", ".join(parts)


def _machine_line(payload, gpu=False):
    """'GPU: ... | host CPU ... | date | versions' or 'CPU: ... | date | versions'."""
    m = payload.get("machine") or {}
    cpu = m.get("cpu_model") or "CPU model not recorded"
    if gpu:
        count = m.get("gpus")
        name = m.get("gpu_name") or "GPU model not recorded"
        where = "GPUs: %s%s (host CPU %s)" % (name, " x%s" % count if count else "", cpu)
    else:
        cores = m.get("usable_cores")
        load = m.get("load_avg_at_start")
        where = "CPU: %s%s%s" % (cpu, ", %s usable of %s logical cores" % (cores, m.get("logical_cpus"))
                                 if cores else "", ", load avg %.2f at start" % load[0] if load else "")
    return " | ".join(p for p in (where, _date(m), _versions(m)) if p)


def _style(ax, xlabel, ylabel, title=None, legend=True, loc="best"):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8.5, framealpha=0.85, loc=loc)


def _int_ticks(ax, values):
    """Ticks at the measured counts only, with room beside the outer points."""
    ax.set_xticks(sorted(set(values)))
    ax.set_xticklabels([str(v) for v in sorted(set(values))])
    ax.margins(x=0.08)


def _nan(values):
    """None (a failed run) as NaN: the line breaks there instead of bridging the gap."""
    return [math.nan if v is None else v for v in values]


def _thousands(ax):
    """Plain numbers with thousands separators on the y axis (no 1e6 offset)."""
    from matplotlib.ticker import StrMethodFormatter

    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))


def _headroom(ax, values, factor):
    """y from 0 to ``factor`` x the largest value: room for the legend above the data."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if finite:
        ax.set_ylim(0, max(finite) * factor)
