"""Picture of ``gpu_inputs``: how fast a function's input reaches GPU ranks.

The function takes the payload the script wrote (as read back from JSON) and the
PNG path, and returns the path; ``_plots.write_plot`` calls it through
``_plots.PLOTTERS``.
"""

from _plot_common import _figure, _finish, _machine_line, _style

__all__ = ["plot_gpu_inputs"]

_PLAIN = (("plain_pageable", "plain PyTensor (JAX), numpy input as given", "C1", "s", "--"),
          ("plain_locked", "plain PyTensor (JAX), input page-locked by hand", "C2", "D", ":"),
          ("plain_gathered", "plain PyTensor (JAX), rows gathered first (x[idx])", "C7", "v", "--"))


def plot_gpu_inputs(payload, png):
    """GB/s of input and ms per call against the input's size, for each side.

    Parameters
    ----------
    payload : dict
        What ``gpu_inputs.py`` wrote: ``records`` (``ranks``, ``side``, ``mb``,
        ``ms``, ``gbps`` each), ``machine``, ``versions``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    recs = payload["records"]
    ranks = sorted({r["ranks"] for r in recs})
    fig, (ax_bw, ax_ms) = _figure("gpu_inputs", 2)
    first = [r for r in recs if r["ranks"] == ranks[0]]
    for side, label, color, marker, style in _PLAIN:
        pts = sorted((r["mb"], r["gbps"], r["ms"]) for r in first if r["side"] == side)
        for ax, k in ((ax_bw, 1), (ax_ms, 2)):
            ax.plot([p[0] for p in pts], [p[k] for p in pts], marker=marker, ls=style, color=color,
                    label=label)
    for i, n in enumerate(ranks):
        for side, how, style in (("synk", "Data", "o-"), ("synk_gathered", "batch=idx", "o--")):
            pts = sorted((r["mb"], r["gbps"], r["ms"]) for r in recs if r["ranks"] == n and r["side"] == side)
            label = "Synkhronos, %d GPU rank%s (%s)" % (n, "s" if n > 1 else "", how)
            for ax, k in ((ax_bw, 1), (ax_ms, 2)):
                ax.plot([p[0] for p in pts], [p[k] for p in pts], style, lw=2, label=label,
                        color="C%d" % (0 if i == 0 else 3 + i))
    sizes = sorted({r["mb"] for r in recs})
    for ax in (ax_bw, ax_ms):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels(["%.3g" % s for s in sizes])
        ax.minorticks_off()
    ax_ms.set_yscale("log")
    _style(ax_bw, "input (MiB)", "input GB/s (size / time per call)", "Throughput", loc="upper left")
    _style(ax_ms, "input (MiB)", "ms per call (log)", "Time per call", loc="upper left")
    v = payload.get("versions") or {}
    caption = [_machine_line(payload, gpu=True),
               "a sum of a float32 input, called and waited for (output to the host); median of each side's "
               "calls, sides alternated in one session; JAX %s, CuPy %s" % (v.get("jax"), v.get("cupy"))]
    return _finish(fig, "Inputs to GPU ranks: Data page-locked against plain numpy", caption, png)
