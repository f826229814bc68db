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
page that shows them can rely on it.
"""

import json
import math
import os
import textwrap

__all__ = [
    "DPI",
    "FIGSIZE",
    "PLOTTERS",
    "benchmark_name",
    "plot_call_overhead",
    "plot_collectives",
    "plot_cpu_scaling",
    "plot_gpu_scaling",
    "plot_resnet50_scaling",
    "plot_soak",
    "png_path",
    "write_plot",
]

DPI = 100
#: Figure size in inches per benchmark (pixels: these times ``DPI``).
FIGSIZE = {
    "call_overhead": (15.0, 5.0),
    "collectives": (13.0, 5.5),
    "cpu_scaling": (12.0, 5.0),
    "gpu_scaling": (12.0, 5.0),
    "resnet50_scaling": (12.0, 5.0),
    "soak": (12.0, 5.0),
}
INSTALL_HINT = "pip install matplotlib"
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


def _gpu_precision_label(precision):
    return {"highest": "full fp32", "tf32": "TF32"}.get(precision, str(precision))


# ------------------------------------------------------------ resnet50_scaling
def plot_resnet50_scaling(payload, png):
    """Images/s and parallel efficiency of Synkhronos and PyTorch DDP against GPUs.

    Parameters
    ----------
    payload : dict
        What ``resnet50_scaling.py`` wrote: ``args`` (``precision``, ``batch_size``,
        ``blocks``, ``image_size``), ``results`` (one record per GPU count with
        ``gpus``, ``synk_images_per_s``, ``ddp_images_per_s``, ``synk_efficiency``,
        ``ddp_efficiency``; a failed run has None) and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    args = payload.get("args") or {}
    recs = payload["results"]
    ns = [r["gpus"] for r in recs]
    prec = _gpu_precision_label(args.get("precision"))
    fig, (ax, ax_eff) = _figure("resnet50_scaling", 2)
    sides = (("synk", "Synkhronos", "C0", "o"), ("ddp", "PyTorch DDP", "C1", "s"))
    for key, label, color, marker in sides:
        rates = [r.get(key + "_images_per_s") for r in recs]
        if all(v is None for v in rates):
            continue  # e.g. --skip-ddp
        ax.plot(ns, _nan(rates), marker=marker, color=color, lw=2, label="%s (%s)" % (label, prec))
        first = recs[0].get(key + "_images_per_s")
        if first is not None:  # the efficiencies are relative to the first count too
            ax.plot(ns, [first * n / ns[0] for n in ns], ls=":", color=color, lw=1.3,
                    label="%s ideal (%d-GPU figure x n%s)" % (label, ns[0], "/%d" % ns[0] if ns[0] != 1
                                                              else ""))
        effs = [r.get(key + "_efficiency") for r in recs]
        ax_eff.plot(ns, _nan(effs), marker=marker, color=color, lw=2, label="%s (%s)" % (label, prec))
        for x, y in zip(ns, effs):
            if y is not None:
                ax_eff.annotate("%.3f" % y, (x, y), textcoords="offset points",
                                xytext=(0, 7 if key == "synk" else -13), ha="center", fontsize=8,
                                color=color)
    # The ideal lines rise to the right: the legend goes top left, above the data.
    _headroom(ax, [v for line in ax.get_lines() for v in line.get_ydata()], 1.35)
    _thousands(ax)
    _int_ticks(ax, ns)
    _style(ax, "GPUs", "training throughput (images/s)", "Throughput", loc="upper left")
    ax_eff.axhline(1.0, color="0.3", lw=1, ls="--", label="ideal (1.0)")
    ax_eff.axhline(0.97, color="C3", lw=1, ls=":", label="Synkhronos target at 2 GPUs (0.97)")
    effs = [r.get(k + "_efficiency") for r in recs for k in ("synk", "ddp")]
    lo = min([0.8] + [e for e in effs if e is not None])
    ax_eff.set_ylim(max(0.0, lo - 0.05), 1.06)
    _int_ticks(ax_eff, ns)
    _style(ax_eff, "GPUs", "parallel efficiency\n(images/s  /  (n x 1-GPU images/s))",
           "Scaling efficiency")
    title = "ResNet training throughput: Synkhronos vs PyTorch DDP"
    caption = [
        _machine_line(payload, gpu=True),
        "precision of products and convolutions: Synkhronos %s (fork(precision=%r)), PyTorch %s "
        "(allow_tf32=%s); fp32 values; blocks %s, batch %s images per GPU, %s px, median of %s steps"
        % (prec, args.get("precision"), prec, args.get("precision") == "tf32", args.get("blocks"),
           args.get("batch_size"), args.get("image_size"), args.get("steps")),
    ]
    return _finish(fig, title, caption, png)


# ---------------------------------------------------------------- gpu_scaling
def plot_gpu_scaling(payload, png):
    """Rows/s and speedup of the MLP gradient step against GPUs, with the ideal.

    Parameters
    ----------
    payload : dict
        What ``gpu_scaling.py`` wrote: ``results`` (``n``, ``rows_per_s``,
        ``speedup``, ``efficiency`` per GPU count), ``plain_step_ms``, ``batch``,
        ``layers``, ``precision`` and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    recs = payload["results"]
    ns = [r["n"] for r in recs]
    plain_rate = payload["batch"] / (payload["plain_step_ms"] / 1e3)
    prec = _gpu_precision_label(payload.get("precision"))
    fig, (ax, ax_sp) = _figure("gpu_scaling", 2)
    ax.plot(ns, [r["rows_per_s"] for r in recs], "o-", color="C0", lw=2,
            label="Synkhronos (%s)" % prec)
    ax.plot(ns, [plain_rate * n for n in ns], ":", color="0.3", label="ideal (plain 1-GPU x n)")
    ax.plot([1], [plain_rate], "D", color="C1", ms=8, label="plain PyTensor JAX, 1 GPU (%s)" % prec)
    ax.set_ylim(bottom=0)
    _thousands(ax)
    _int_ticks(ax, ns)
    _style(ax, "GPUs", "throughput (rows/s)", "Throughput")
    ax_sp.plot(ns, [r["speedup"] for r in recs], "o-", color="C0", lw=2, label="Synkhronos speedup")
    for r in recs:
        ax_sp.annotate("%.2fx (eff. %.3f)" % (r["speedup"], r["efficiency"]), (r["n"], r["speedup"]),
                       textcoords="offset points", xytext=(6, -12), fontsize=8, color="C0")
    ax_sp.plot(ns, ns, ":", color="0.3", label="ideal (speedup = n)")
    if 2 in ns:
        ax_sp.plot([2], [0.97 * 2], "_", color="C3", ms=22, mew=2, label="target at 2 GPUs (0.97 x 2)")
    ax_sp.set_ylim(0, max(ns) * 1.08)
    _int_ticks(ax_sp, ns)
    _style(ax_sp, "GPUs", "speedup over plain PyTensor on 1 GPU (x)", "Speedup")
    title = "GPU scaling: MLP gradient step + all_reduce (Synkhronos)"
    caption = [
        _machine_line(payload, gpu=True),
        "MLP %s, batch %s rows per step (all GPUs together); float32 products at precision %r on "
        "both sides (%s); plain JAX on 1 GPU: %.2f ms/step"
        % (payload.get("layers"), payload.get("batch"), payload.get("precision"), prec,
           payload["plain_step_ms"]),
    ]
    return _finish(fig, title, caption, png)


# ---------------------------------------------------------------- cpu_scaling
def plot_cpu_scaling(payload, png):
    """Rows/s of Synkhronos ranks, raw processes and BLAS threads against N.

    Parameters
    ----------
    payload : dict
        What ``cpu_scaling.py`` wrote: ``summary`` (per N: ``threads_rows_per_s``,
        ``procs_rows_per_s``, ``synk_rows_per_s``, ``synk_over_procs``,
        ``procs_over_threads``), ``runs`` (one record per configuration and
        round), ``settings`` and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    summ = payload["summary"]
    ns = [s["n"] for s in summ]
    settings = payload.get("settings") or {}
    fig, (ax, ax_r) = _figure("cpu_scaling", 2)
    modes = (("synk", "Synkhronos, N ranks", "C0", "o"),
             ("procs", "raw N processes", "C1", "s"),
             ("threads", "1 process, N BLAS threads", "C2", "^"))
    for mode, label, color, marker in modes:
        ax.plot(ns, [s[mode + "_rows_per_s"] for s in summ], marker=marker, color=color, lw=2,
                label=label + " (median)")
        runs = [r for r in payload.get("runs", []) if r.get("mode") == mode]
        if len(runs) > len(ns):  # several rounds: show the spread too
            ax.plot([r["n"] for r in runs], [r["rows_per_s"] for r in runs], marker=marker, ls="none",
                    color=color, alpha=0.35, ms=4)
    # At N = 1 all three are one process with one BLAS thread: the best of them is the reference.
    base = max(summ[0][m + "_rows_per_s"] for m, _, _, _ in modes) / summ[0]["n"]
    ax.plot(ns, [base * n for n in ns], ":", color="0.3", label="ideal (best N=1 figure x N)")
    ax.set_ylim(bottom=0)
    _thousands(ax)
    _int_ticks(ax, ns)
    _style(ax, "N (ranks / processes / threads)", "throughput (rows/s)", "Throughput")
    ax_r.plot(ns, [s["synk_over_procs"] for s in summ], "o-", color="C0", lw=2, label="synk / raw procs")
    ax_r.plot(ns, [s["procs_over_threads"] for s in summ], "s-", color="C1", lw=2,
              label="raw procs / threads")
    ax_r.axhline(1.0, color="0.3", lw=1, ls="--", label="1.0")
    ax_r.axhline(0.9, color="C3", lw=1, ls=":", label="target synk / procs >= 0.9")
    ax_r.set_ylim(bottom=0)
    _int_ticks(ax_r, ns)
    _style(ax_r, "N", "throughput ratio", "Ratios (medians of per-round ratios)")
    title = "CPU scaling: MLP 784-1024-1024-10 gradient"
    caption = [
        _machine_line(payload),
        "float32; total batch %s rows per step, %s timed steps per configuration, %s round(s); "
        "BLAS %s" % (settings.get("batch"), settings.get("steps"), settings.get("repeats"),
                     (payload.get("machine") or {}).get("blas")),
    ]
    return _finish(fig, title, caption, png)


# ---------------------------------------------------------------- collectives
def plot_collectives(payload, png):
    """Bus bandwidth of synk and raw NCCL collectives against message size, and their ratio.

    Parameters
    ----------
    payload : dict
        What ``collectives.py`` wrote: ``results`` (one record per op and size with
        ``op``, ``mb``, ``raw_busbw``, ``synk_busbw``, ``ratio``), ``settings``,
        ``correct`` and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    from matplotlib.lines import Line2D

    recs = payload["results"]
    ops = list(dict.fromkeys(r["op"] for r in recs))
    settings = payload.get("settings") or {}
    fig, (ax, ax_r) = _figure("collectives", 2)
    handles = []
    for i, op in enumerate(ops):
        rs = sorted((r for r in recs if r["op"] == op), key=lambda r: r["mb"])
        mb = [r["mb"] for r in rs]
        color = "C%d" % i
        ax.plot(mb, [r["synk_busbw"] for r in rs], "o-", color=color, lw=2)
        ax.plot(mb, [r["raw_busbw"] for r in rs], "x--", color=color, lw=1.5)
        ax_r.plot(mb, [r["ratio"] for r in rs], "o-", color=color, lw=2)
        handles.append(Line2D([], [], color=color, lw=2, label=op))
    style = [Line2D([], [], color="0.2", ls="-", marker="o", label="synk"),
             Line2D([], [], color="0.2", ls="--", marker="x", label="raw NCCL (CuPy)")]
    sizes = sorted({r["mb"] for r in recs})
    for a in (ax, ax_r):
        a.set_xscale("log", base=2)
        a.set_xticks(sizes)
        a.set_xticklabels(["%g" % s for s in sizes])
        a.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.legend(handles=handles + style, fontsize=8.5, ncol=2, loc="upper left", framealpha=0.85)
    _style(ax, "message size (MB, log scale)", "bus bandwidth (GB/s)", "Bus bandwidth (nccl-tests)",
           legend=False)
    ax_r.axhline(1.0, color="0.3", lw=1, ls="--")
    ax_r.axhline(0.95, color="C3", lw=1, ls=":")
    if max(sizes) >= 64:
        ax_r.axvspan(min(sizes) / 1.3, 64 / 1.15, color="0.5", alpha=0.08, lw=0)
        ax_r.text(64 / 1.2, 0.98, "shaded: below 64 MB,\nno target", transform=ax_r.get_xaxis_transform(),
                  fontsize=8, color=_GREY, ha="right", va="top")
    ax_r.set_xlim(min(sizes) / 1.3, max(sizes) * 1.3)
    ratios = [r["ratio"] for r in recs]
    ax_r.set_ylim(min(0.8, min(ratios) - 0.03), max(1.1, max(ratios) + 0.03))
    ratio_handles = handles + [Line2D([], [], color="0.3", ls="--", label="1.0 (equal)"),
                               Line2D([], [], color="C3", ls=":", label="target 0.95")]
    ax_r.legend(handles=ratio_handles, fontsize=8.5, ncol=2, loc="lower right", framealpha=0.85)
    _style(ax_r, "message size (MB, log scale)", "synk speed / raw NCCL speed (raw time / synk time)",
           "synk vs raw NCCL", legend=False)
    n = (payload.get("machine") or {}).get("gpus")
    title = "Collectives on %s GPUs: synk vs raw NCCL" % (n if n else "?")
    caption = [
        _machine_line(payload, gpu=True),
        "precision: not applicable (float32 values moved and added, no products); back to back, "
        "%s calls per size, fastest of %s passes; all_reduce_split: %s variables in one call; "
        "values correct after the runs: %s"
        % (settings.get("iters"), settings.get("repeats"), settings.get("split"), payload.get("correct")),
    ]
    return _finish(fig, title, caption, png)


# -------------------------------------------------------------- call_overhead
def plot_call_overhead(payload, png):
    """Call latency against ranks; scatter throughput and master memory where recorded.

    The latency panel is always drawn.  Parts (b) and (c) get a panel each when
    the run measured them: (b) as GB/s per rank count, the one-process baselines
    beside Synkhronos; (c) as grouped bars on a log scale, since the full-copy
    control is the size of the Data while the measured peaks should be the
    master's share of rows, orders of magnitude less.

    Parameters
    ----------
    payload : dict
        What ``call_overhead.py`` wrote: ``sessions`` (per rank count, part ``a``
        with ``synk_us_median``, ``synk_us_p10``, ``synk_us_p90``,
        ``plain_us_median``, ``plain_us_p90``, cold medians; part ``b`` with GB/s
        per method), ``memory`` (part c rows), ``pipe_round_trip_us_median``,
        ``target_a``, ``settings`` and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    sessions = payload.get("sessions") or []
    with_a = [s for s in sessions if "a" in s]
    with_b = [s for s in sessions if "b" in s]
    memory = payload.get("memory") or []
    settings = payload.get("settings") or {}
    gpu = bool(settings.get("gpu"))
    panels = (["a"] if with_a else []) + (["b"] if with_b else []) + (["c"] if memory else [])
    if not panels:
        raise ValueError("call_overhead payload has no part a, b or c results to plot")
    fig, axes = _figure("call_overhead", len(panels))
    axes = dict(zip(panels, axes))
    plain = "plain pytensor.function%s" % (" (JAX, 1 GPU)" if gpu else "")
    if with_a:
        ax = axes["a"]
        ranks = [s["ranks"] for s in with_a]
        a = [s["a"] for s in with_a]
        med = [x["synk_us_median"] for x in a]
        ax.errorbar(ranks, med, yerr=[[m - x["synk_us_p10"] for m, x in zip(med, a)],
                                      [x["synk_us_p90"] - m for m, x in zip(med, a)]],
                    fmt="o-", color="C0", lw=2, capsize=4, label="synk (median, bars p10-p90)")
        pmed = [x["plain_us_median"] for x in a]
        ax.errorbar(ranks, pmed, yerr=[[0] * len(a), [x["plain_us_p90"] - m for m, x in zip(pmed, a)]],
                    fmt="s-", color="C1", lw=2, capsize=4, label=plain + " (median, bar to p90)")
        ax.plot(ranks, [x["synk_cold_us_median"] for x in a], "o", mfc="none", color="C0", ms=8,
                label="synk, cold call (after a 200 us sleep)")
        ax.plot(ranks, [x["plain_cold_us_median"] for x in a], "s", mfc="none", color="C1", ms=8,
                label="plain, cold call")
        pipe = payload.get("pipe_round_trip_us_median")
        if pipe:
            ax.axhline(pipe, color="0.4", ls=":", lw=1, label="2-process pipe round trip (%.0f us)" % pipe)
        target = payload.get("target_a")
        if target:
            p2 = [x["plain_us_median"] for s, x in zip(with_a, a) if s["ranks"] == target["ranks"]]
            if p2:
                ax.plot([target["ranks"]], [p2[0] + target["target_us"]], "_", color="C3", ms=24, mew=2,
                        label="target: plain + %.0f us at %d ranks (%s)"
                        % (target["target_us"], target["ranks"], "PASS" if target["pass"] else "FAIL"))
        _headroom(ax, [x[k] for x in a for k in ("synk_us_p90", "plain_us_p90", "synk_cold_us_median",
                                                 "plain_cold_us_median")], 1.75)
        _int_ticks(ax, ranks)
        _style(ax, "ranks", "time per call (us)", "(a) call latency, tiny function")
    if with_b:
        ax = axes["b"]
        ranks = [s["ranks"] for s in with_b]
        for key, label, fmt in (("synk", "synk, batch=idx (gathered on every rank)", "o-"),
                                ("plain_gather_sum", "1 process: plain x[idx] + sum", "s--"),
                                ("np_take", "1 process: np.take", "^--"),
                                ("memcpy", "1 process: memcpy (contiguous)", "v--")):
            ax.plot(ranks, [s["b"][key + "_gbps"] for s in with_b], fmt, lw=2 if key == "synk" else 1.3,
                    label=label)
        b0 = with_b[0]["b"]
        _headroom(ax, [s["b"][k + "_gbps"] for s in with_b for k in ("synk", "plain_gather_sum", "np_take",
                                                                     "memcpy")], 1.45)
        _int_ticks(ax, ranks)
        _style(ax, "ranks", "GB/s of gathered rows",
               "(b) batch= scatter: %d random rows\n(%.0f MB of a %.0f MB Data)"
               % (b0["index_rows"], b0["gathered_mb"], b0["data_mb"]))
    if memory:
        import numpy as np

        ax = axes["c"]
        bars = (("master_share_mb", "master's share of the rows"),
                ("vm_hwm_growth_first_call_mb", "peak growth, 1st call"),
                ("vm_hwm_growth_mb", "peak growth, later calls"),
                ("control_full_copy_hwm_growth_mb", "control: peak of a full copy"))
        bars = [(k, lab) for k, lab in bars if any(r.get(k) is not None for r in memory)]
        x = np.arange(len(memory))
        width = 0.8 / len(bars)
        for i, (key, label) in enumerate(bars):
            vals = [r.get(key) or 0.0 for r in memory]
            drawn = ax.bar(x + (i - (len(bars) - 1) / 2) * width, [max(v, 0.01) for v in vals], width,
                           label=label, color="C%d" % i)
            ax.bar_label(drawn, labels=["%.0f" % v if v >= 100 else "%.3g" % v for v in vals], fontsize=7,
                         padding=1)
        ax.set_yscale("log")
        top = max(max(r.get(k) or 0.01 for k, _ in bars) for r in memory)
        ax.set_ylim(top=top * 12)  # room for the legend above the bars (log scale)
        ax.set_xticks(x)
        ax.set_xticklabels(["%.0f MB Data" % r["data_mb"] for r in memory])
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[payload.get("memory_pass")]
        m0 = memory[0]
        _style(ax, "Data size (%d-row random index, %d ranks)" % (m0["index_rows"], m0["ranks"]),
               "master memory (MB, log scale)", "(c) master memory per call: %s" % verdict)
    title = "Synkhronos call overhead on %s" % ("GPU ranks" if gpu else "CPU workers")
    precision = ("float32; synk fork(precision='highest') and the plain JAX function at full float32"
                 if gpu else "float32")
    caption = [
        _machine_line(payload, gpu=gpu),
        "%s; %s calls per block x %s interleaved blocks%s" % (
            precision, settings.get("calls"), settings.get("repeats"),
            "; ranks above %s are oversubscribed" % (payload.get("machine") or {}).get("usable_cores")
            if not gpu and (payload.get("machine") or {}).get("usable_cores") else ""),
    ]
    return _finish(fig, title, caption, png)


# ----------------------------------------------------------------------- soak
def plot_soak(payload, png):
    """RSS of the master and every worker against calls made, and growth since the first sample.

    Parameters
    ----------
    payload : dict
        What ``soak.py`` wrote: ``samples`` (each with ``calls``, ``collectives``,
        ``seconds`` and ``rss_mb``, a dict rank -> MB), ``calls``, ``collectives``,
        ``seconds``, ``ranks``, ``device`` and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    samples = payload["samples"]
    calls = [s["calls"] for s in samples]
    ranks = sorted(samples[0]["rss_mb"], key=int)
    gpu = str(payload.get("device", "cpu")).lower() == "gpu"
    fig, (ax, ax_g) = _figure("soak", 2)
    for i, r in enumerate(ranks):
        rss = [s["rss_mb"][r] for s in samples]
        label = "rank %s (%s)" % (r, "master" if int(r) == 0 else "worker")
        ax.plot(calls, rss, "o-", color="C%d" % i, lw=2, ms=4, label=label)
        ax_g.plot(calls, [v - rss[0] for v in rss], "o-", color="C%d" % i, lw=2, ms=4, label=label)
    ax.set_ylim(bottom=0)
    _style(ax, "function calls made", "resident memory, VmRSS (MB)", "RSS per process")
    ax_g.axhline(0, color="0.3", lw=1)
    lo, hi = ax_g.get_ylim()
    ax_g.set_ylim(min(lo, -2), max(hi, 2))  # a flat line should look flat, not like noise blown up
    _style(ax_g, "function calls made", "RSS growth since the first sample (MB)",
           "Growth after warm-up (%d calls)" % calls[0])
    for a in (ax, ax_g):
        a.ticklabel_format(axis="x", style="plain")
    title = "Soak: %s calls and %s collectives in one session, %s %s ranks" % (
        payload.get("calls"), payload.get("collectives"), payload.get("ranks"),
        str(payload.get("device", "?")).upper())
    args = payload.get("args") or {}
    caption = [
        _machine_line(payload, gpu=gpu),
        "precision %s; %.1f s in all; %s calls checked against numpy (every %s), %s collective cycles "
        "checked" % (payload.get("precision") or ("float32 (CPU)" if not gpu else "not recorded"),
                     payload.get("seconds", float("nan")), payload.get("checked_calls"),
                     args.get("check_every"), payload.get("checked_collective_cycles")),
    ]
    return _finish(fig, title, caption, png)


# --------------------------------------------------------------------- dispatch
PLOTTERS = {
    "call_overhead": plot_call_overhead,
    "collectives": plot_collectives,
    "cpu_scaling": plot_cpu_scaling,
    "gpu_scaling": plot_gpu_scaling,
    "resnet50_scaling": plot_resnet50_scaling,
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
