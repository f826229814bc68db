"""Pictures of the GPU benchmarks: ``resnet50_scaling``, ``gpu_scaling``, ``collectives``,
``bf16_loss_curve``.

Each function takes the payload its script wrote (as read back from JSON) and the
PNG path, and returns the path; ``_plots.write_plot`` calls them through
``_plots.PLOTTERS``.  ``call_overhead``, drawn for CPU and GPU runs alike, is in
``_plots_cpu``.
"""

from _plot_common import (
    _GREY,
    _figure,
    _finish,
    _headroom,
    _int_ticks,
    _machine_line,
    _nan,
    _style,
    _thousands,
)

__all__ = ["plot_bf16_loss_curve", "plot_collectives", "plot_gpu_scaling", "plot_resnet50_profile",
           "plot_resnet50_scaling"]


# What PyTorch runs for each --precision of resnet50_scaling.py.
_TORCH_PRECISION = {"highest": "full fp32 (allow_tf32=False)", "fp32": "full fp32 (allow_tf32=False)",
                    "tf32": "TF32 (allow_tf32=True)", "bf16": "bf16 autocast + channels_last"}
# resnet50_scaling's --precision names, by fork()'s (fp32 is fork's "highest").
_FORK_PRECISION = {"fp32": "highest"}


def _gpu_precision_label(precision):
    labels = {"highest": "full fp32", "fp32": "full fp32", "tf32": "TF32", "bf16": "bf16 mixed"}
    return labels.get(precision, str(precision))


# ------------------------------------------------------------ resnet50_scaling
_RESNET_SIDES = (("synk", "Synkhronos", "C0", "o"), ("ddp", "PyTorch DDP", "C1", "s"),
                 ("flax", "Flax + optax", "C4", "D"), ("synk_mpi", "Synkhronos, mpirun, a host per rank",
                                                       "C2", "^"))
# What Flax runs for each --precision.
_FLAX_PRECISION = {"highest": "full fp32 (matmul precision highest)", "fp32": "full fp32 (matmul precision "
                   "highest)", "tf32": "TF32", "bf16": "layers in bf16, fp32 parameters and loss"}


def plot_resnet50_scaling(payload, png):
    """Images/s of Synkhronos, PyTorch DDP and Flax: against GPUs, with the parallel
    efficiency, or for a run on one GPU count, as bars with Synkhronos's ratio to
    each peer.

    Parameters
    ----------
    payload : dict
        What ``resnet50_scaling.py`` wrote: ``args`` (``precision``, ``batch_size``,
        ``blocks``, ``image_size``), ``results`` (one record per GPU count with
        ``gpus`` and, per side, ``<side>_images_per_s`` and ``<side>_efficiency``;
        a side not run or failed has None) and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    args = payload.get("args") or {}
    recs = payload["results"]
    precision = args.get("precision")
    prec = _gpu_precision_label(precision)
    sides = [side for side in _RESNET_SIDES
             if any(r.get(side[0] + "_images_per_s") is not None for r in recs)]
    fig, axes = _figure("resnet50_scaling", 2)
    if len(recs) == 1:
        _resnet_bars(axes, recs[0], sides, prec)
    else:
        _resnet_lines(axes, recs, sides, prec)
    title = "ResNet training throughput: Synkhronos, PyTorch DDP and Flax"
    caption = [
        _machine_line(payload, gpu=True),
        "precision: Synkhronos %s (fork(precision=%r)), PyTorch %s, Flax %s; "
        "fp32 parameters; synk convolution layout %s; blocks %s, batch %s images per GPU, %s px, "
        "median of %s steps"
        % (prec, _FORK_PRECISION.get(precision, precision), _TORCH_PRECISION.get(precision, prec),
           _FLAX_PRECISION.get(precision, prec), args.get("layout", "NCHW"), args.get("blocks"),
           args.get("batch_size"), args.get("image_size"), args.get("steps")),
    ]
    return _finish(fig, title, caption, png)


def _resnet_bars(axes, rec, sides, prec):
    """One GPU count: images/s per side, and Synkhronos's ratio to each peer."""
    ax, ax_ratio = axes
    rates = [rec[key + "_images_per_s"] for key, *_ in sides]
    bars = ax.bar([label for _, label, _, _ in sides], _nan(rates), color=[c for _, _, c, _ in sides])
    _label_bars(ax, bars, rates, "%.0f")
    _headroom(ax, [v for v in rates if v is not None], 1.15)
    _thousands(ax)
    _style(ax, "", "training throughput (images/s)", "Throughput on %d GPU(s), %s" % (rec["gpus"], prec),
           legend=False)
    peers = [(key, label, color) for key, label, color, _ in sides if key in ("ddp", "flax")]
    ratios = [rec.get("synk_over_" + key) for key, _, _ in peers]
    bars = ax_ratio.bar(["Synkhronos / " + label for _, label, _ in peers], _nan(ratios),
                        color=[c for _, _, c in peers])
    _label_bars(ax_ratio, bars, ratios, "%.2f")
    ax_ratio.axhline(1.0, color="0.3", lw=1, ls="--", label="equal (1.0)")
    _headroom(ax_ratio, [v for v in ratios if v is not None] + [1.0], 1.2)
    _style(ax_ratio, "", "ratio of images/s", "Synkhronos against each peer")


def _label_bars(ax, bars, values, fmt):
    """Each bar's value above it (none over a failed run's missing bar)."""
    for bar, v in zip(bars, values):
        if v is not None:
            ax.annotate(fmt % v, (bar.get_x() + bar.get_width() / 2, v), textcoords="offset points",
                        xytext=(0, 3), ha="center", fontsize=9)


def _resnet_lines(axes, recs, sides, prec):
    """Several GPU counts: images/s with each side's ideal, and the efficiencies."""
    ax, ax_eff = axes
    ns = [r["gpus"] for r in recs]
    for key, label, color, marker in sides:
        rates = [r.get(key + "_images_per_s") for r in recs]
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
    effs = [r.get(k + "_efficiency") for r in recs for k in ("synk", "ddp", "flax")]
    lo = min([0.8] + [e for e in effs if e is not None])
    ax_eff.set_ylim(max(0.0, lo - 0.05), 1.06)
    _int_ticks(ax_eff, ns)
    _style(ax_eff, "GPUs", "parallel efficiency\n(images/s  /  (n x 1-GPU images/s))",
           "Scaling efficiency")


# ------------------------------------------------------------ resnet50_profile
def plot_resnet50_profile(payload, png):
    """GPU time per step by kernel category, one bar per side, and each category's
    difference (Synkhronos minus Flax).

    Parameters
    ----------
    payload : dict
        What ``resnet50_profile.py`` wrote: ``args`` (``batch_size``, ``precision``,
        ``layout``), ``results`` (per side: ``ms_per_step`` by category,
        ``wall_ms_per_step``, ``images_per_s``; None where a side failed) and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    args = payload.get("args") or {}
    res = {side: r for side, r in payload["results"].items() if r}
    sides = list(res)
    cats = sorted({c for r in res.values() for c in r["ms_per_step"]},
                  key=lambda c: -max(r["ms_per_step"].get(c, 0.0) for r in res.values()))
    fig, (ax, ax_diff) = _figure("resnet50_profile", 2)
    bottoms = [0.0] * len(sides)
    for i, cat in enumerate(cats):
        ms = [res[s]["ms_per_step"].get(cat, 0.0) for s in sides]
        ax.bar(sides, ms, bottom=bottoms, color="C%d" % i, label=cat)
        bottoms = [b + m for b, m in zip(bottoms, ms)]
    walls = [res[s]["wall_ms_per_step"] for s in sides]
    ax.scatter(sides, walls, marker="_", s=900, color="k", zorder=3, label="step, wall clock")
    for x, (s, w) in enumerate(zip(sides, walls)):
        ax.annotate("%.1f ms, %.0f images/s" % (w, res[s]["images_per_s"]), (x, w),
                    textcoords="offset points",
                    xytext=(0, 5), ha="center", fontsize=8.5)
    _headroom(ax, walls, 2.0)
    _style(ax, "", "GPU kernel time per step (ms)", "Kernel time by category", loc="upper center")
    if "synk" in res and "flax" in res:
        synk, flax = res["synk"]["ms_per_step"], res["flax"]["ms_per_step"]
        diffs = [synk.get(c, 0.0) - flax.get(c, 0.0) for c in cats]
        ax_diff.barh(cats, diffs, color=["C3" if d > 0 else "C2" for d in diffs])
        ax_diff.axvline(0.0, color=_GREY, lw=1)
        ax_diff.invert_yaxis()
    _style(ax_diff, "Synkhronos minus Flax (ms per step)", "", "Where the difference is", legend=False)
    shown = tuple(args.get(k) for k in ("blocks", "batch_size", "precision", "layout", "steps"))
    caption = [_machine_line(payload, gpu=True),
               "ResNet blocks %s, batch %s, precision %s, Synkhronos convolution layout %s; kernels from "
               "JAX's profiler over %s steps" % shown]
    return _finish(fig, "Where a ResNet training step spends the GPU: Synkhronos and Flax", caption, png)


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


# ------------------------------------------------------------- bf16_loss_curve
def plot_bf16_loss_curve(payload, png):
    """Training loss per step with full float32 and bf16 mixed precision, and their
    difference.

    Parameters
    ----------
    payload : dict
        What ``bf16_loss_curve.py`` wrote: ``runs`` (``highest`` and ``bf16``, each
        with ``losses`` and ``images_per_s``, or None for a failed run),
        ``difference`` (bf16 minus float32 loss per step, or None), ``args`` and
        ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    args = payload.get("args") or {}
    runs = payload["runs"]
    fig, (ax, ax_rel) = _figure("bf16_loss_curve", 2)
    for precision, color in (("highest", "C0"), ("bf16", "C1")):
        run = runs.get(precision)
        if run:
            ax.plot(range(1, len(run["losses"]) + 1), run["losses"], color=color, lw=1.5,
                    label="%s (%.0f images/s)" % (_gpu_precision_label(precision), run["images_per_s"]))
    _style(ax, "training step", "loss (softmax cross-entropy)", "Loss")
    diff = payload.get("difference")
    if diff:
        ax_rel.plot(range(1, len(diff) + 1), diff, color="C3", lw=1.2)
        ax_rel.axhline(0, color=_GREY, lw=0.8)
    _style(ax_rel, "training step", "bf16 loss - fp32 loss", "Difference", legend=False)
    blocks = args.get("blocks")
    model = "ResNet-50" if blocks == "3,4,6,3" and args.get("width") == 64 else "ResNet (blocks %s)" % blocks
    title = "%s trained with bf16 mixed precision against full float32" % model
    caption = [
        _machine_line(payload, gpu=not args.get("cpu")),
        "fork(precision='highest') and fork(precision='bf16') on 1 rank, same initial parameters, "
        "the same %s synthetic batches of %s images (%s px, %s classes) cycled, momentum SGD, "
        "learning rate %s"
        % (args.get("batches"), args.get("batch_size"), args.get("image_size"), args.get("classes"),
           args.get("learning_rate")),
    ]
    return _finish(fig, title, caption, png)
