"""The picture of ``call_timeline.py``: each case's median call as bars per
process (a row each), one panel per case and rank count."""

from _plot_common import _machine_line

__all__ = ["plot_call_timeline"]

# The steps drawn, outermost first (nested ones are drawn narrower on top).
_STEPS = ("call", "call_all_reduce", "call_sync", "deliver", "reply", "recv", "on_call", "on_collective",
          "on_sync", "share_reduced", "run_share", "run_whole", "to_host", "reduce_outputs", "output_buffer",
          "dev_all_reduce", "dev_sync", "outputs", "retire", "take_reduced", "take_outputs", "send")


def plot_call_timeline(payload, png):
    """Bars of each process's steps in the median call (start and end medians).

    Parameters
    ----------
    payload : dict
        What ``call_timeline.py`` wrote: ``results``, each with ``case``,
        ``ranks``, ``median_us`` and ``rows`` (``process``, ``what``,
        ``start_us``, ``end_us``).
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    from _plot_common import DPI, _finish
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    results = payload.get("results") or []
    if not results:
        raise ValueError("call_timeline payload has no results to plot")
    fig = Figure(figsize=(13.0, 2.2 + 1.9 * len(results)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(results), 1, squeeze=False)[:, 0]
    colors = {s: colormaps["tab20"](i % 20) for i, s in enumerate(_STEPS)}
    used = {}
    for ax, res in zip(axes, results):
        procs = sorted({r["process"] for r in res["rows"]}, key=lambda p: (p != "master", p))
        for y, proc in enumerate(procs):
            for r in res["rows"]:
                base = r["what"].split("#")[0]
                if r["process"] != proc or base not in colors:
                    continue
                depth = _STEPS.index(base) / len(_STEPS)
                height = 0.8 - 0.45 * depth
                used[base] = ax.barh(y, r["end_us"] - r["start_us"], left=r["start_us"], height=height,
                                     color=colors[base], edgecolor="0.3", linewidth=0.4)
        ax.set_yticks(range(len(procs)), procs)
        ax.invert_yaxis()
        ax.set_xlabel("us from the master's call")
        ax.set_title("%s on %d %s ranks: median %.0f us per call" % (
            res["case"], res["ranks"], "GPU" if payload.get("gpu") else "CPU", res["median_us"]), fontsize=10)
    fig.legend([used[s] for s in _STEPS if s in used], [s for s in _STEPS if s in used], loc="outside right")
    return _finish(fig, "Where a call's time goes (medians of each step)",
                   [_machine_line(payload, gpu=bool(payload.get("gpu")))], png)
