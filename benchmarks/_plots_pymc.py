"""Pictures of the PyMC benchmarks: ``pymc_likelihood``, ``pymc_loo``, ``pymc_libraries``,
``rows_kernel_blocks`` and ``jax_batched_forms`` (the JAX forms behind docs/pymc.md's note on what is left to
gain on a GPU).

Each function takes the payload its script wrote (as read back from JSON) and the
PNG path, and returns the path; ``_plots.write_plot`` calls them through
``_plots.PLOTTERS``.  Unlike the other pictures, their size follows the panels
(one per model, a second row for sampling and JAX) and their layout is
matplotlib's tight one, as these scripts drew them from the start.  Matplotlib
is imported inside the functions; no pyplot.
"""

from _plot_common import DPI

__all__ = ["plot_jax_batched_forms", "plot_pymc_libraries", "plot_pymc_likelihood", "plot_pymc_loo",
           "plot_rows_kernel_blocks"]


def _figure(nrows, ncols, size):
    """A figure of ``size`` inches with ``nrows`` x ``ncols`` axes (a 2-D array)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig, png):
    fig.tight_layout()
    fig.savefig(png, dpi=DPI)
    return png


def _bars(ax, labels, series):
    """Grouped bars: ``series`` is [(name, [value or None per label])]."""
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, v in enumerate(values) if v is not None]
        ax.bar(xs, [v for v in values if v is not None], width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.legend(fontsize=8)


# ------------------------------------------------------------ pymc_likelihood
def plot_pymc_likelihood(payload, png):
    """The copy's speedup over PyMC per evaluation against the rank count, one
    panel per model; under them, where the run had them, the samplers' wall
    times and the copy per evaluation against hand-written JAX.

    Parameters
    ----------
    payload : dict
        What ``pymc_likelihood.py`` wrote: ``likelihood``, ``sampling`` and
        ``jax_per_eval`` (lists of rows, the last two empty without ``--sample``)
        and ``machine``.
    png : str
        Where to write the picture.
    """
    records, sampled, jax_rows = payload["likelihood"], payload["sampling"], payload["jax_per_eval"]
    kinds = sorted({r["model"] for r in records})
    lower = [x for x in (sampled, jax_rows) if x]
    cols = max(len(kinds), len(lower), 1)
    fig, axes = _figure(1 + bool(lower), cols, (6.5 * cols, 4.5 * (1 + bool(lower))))
    for ax, kind in zip(axes[0], kinds):
        _draw_speedups(ax, kind, records)
    for ax in list(axes[0][len(kinds):]) + (list(axes[1][len(lower):]) if lower else []):
        ax.axis("off")
    if lower:
        axes_lower = iter(axes[1])
        if sampled:
            _draw_sampling(next(axes_lower), sampled)
        if jax_rows:
            _draw_jax(next(axes_lower), jax_rows)
    machine = payload.get("machine") or {}
    where = "%s usable cores" % machine.get("usable_cores", "?")
    if machine.get("gpu_name"):
        where = "%s, %s" % (machine["gpu_name"], where)
    fig.suptitle("PyMC logp+dlogp per evaluation and sampling, float64 both sides (%s; PyMC %s, PyTensor %s)"
                 % (where, machine.get("pymc"), machine.get("pytensor")), fontsize=10, wrap=True)
    return _save(fig, png)


def _draw_speedups(ax, kind, records):
    """Speedup over PyMC against ranks, or (where PyMC was not timed) the copy's
    ms per evaluation against ranks."""
    mine = [r for r in records if r["model"] == kind]
    timed = all(r.get("speedup") is not None for r in mine)
    key = "speedup" if timed else "synk_ms"
    for rows in sorted({r["rows"] for r in mine}):
        rs = [r for r in mine if r["rows"] == rows]
        ax.plot([r["ranks"] for r in rs], [r[key] for r in rs], "o-", label="%g rows" % rows)
    ax.set_xticks(sorted({r["ranks"] for r in records}))
    if timed:
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set(title="%s: logp+dlogp vs PyMC, one process" % kind, xlabel="ranks",
               ylabel="speedup (PyMC ms / Synkhronos ms)")
    else:
        ax.set_yscale("log")
        from matplotlib.ticker import ScalarFormatter

        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set(title="%s: the copy's logp+dlogp per evaluation" % kind, xlabel="ranks",
               ylabel="ms per evaluation")
    ax.legend()


def _draw_sampling(ax, sampled):
    labels = ["%s\n%s %g rows" % (s["sampler"], s["model"], s["rows"]) for s in sampled]
    _bars(ax, labels, [("plain model", [s["plain_s"] for s in sampled]),
                       ("data_parallel copy", [s["synk_s"] for s in sampled])])
    ax.set(title="sampling: wall time with compiling (%d chains, %d+%d draws)"
           % (sampled[0]["chains"], sampled[0]["tune"], sampled[0]["draws"]), ylabel="seconds")


def _draw_jax(ax, jax_rows):
    labels = ["%s, %d pt\n%s" % (r["model"], r["points"], r["copy_path"]) for r in jax_rows]
    _bars(ax, labels, [("hand-written JAX (%s)" % jax_rows[0]["jax_device"], [r["jax_ms"] for r in jax_rows]),
                       ("the same from the host", [r["jax_host_ms"] for r in jax_rows]),
                       ("data_parallel copy", [r["synk_ms"] for r in jax_rows])])
    ax.set(title="logp+dlogp per call, %g rows" % jax_rows[0]["rows"], ylabel="ms per call")


# ------------------------------------------------------------ jax_batched_forms
_FAMILY_TITLE = {"bernoulli": "logistic", "normal": "Normal linear regression's"}


def plot_jax_batched_forms(payload, png):
    """ms per call of each form of the log-density and gradient, grouped by the
    number of points.

    Parameters
    ----------
    payload : dict
        What ``jax_batched_forms.py`` wrote: ``records`` (form, points, ms; in
        the order the forms ran), ``rows``, ``features``, ``device`` and ``jax``.
    png : str
        Where to write the picture.
    """
    records = payload["records"]
    forms = list(dict.fromkeys(r["form"] for r in records))
    points = sorted({r["points"] for r in records})
    fig, axes = _figure(1, 1, (12, 5))
    ax = axes[0][0]
    width = 0.8 / len(forms)
    for i, name in enumerate(forms):
        ms = [next(r["ms"] for r in records if r["form"] == name and r["points"] == k) for k in points]
        ax.bar([j + (i - (len(forms) - 1) / 2) * width for j in range(len(points))], ms, width, label=name)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels(["%d point%s" % (k, "s" * (k > 1)) for k in points])
    ax.set(ylabel="ms per call (logp and gradient of every point)",
           title="%s log-density and gradient, %g x %d float64 rows, %s (jax %s)"
           % (_FAMILY_TITLE[payload.get("family", "bernoulli")], payload["rows"], payload["features"],
              payload["device"], payload["jax"]))
    ax.legend(fontsize=8)
    return _save(fig, png)


# ------------------------------------------------------------------ pymc_loo
def plot_pymc_loo(payload, png):
    """Seconds per row count: ``loo`` on the copy (first call, again) beside the
    original's ``pm.compute_log_likelihood`` + ``az.loo`` where it ran.

    Parameters
    ----------
    payload : dict
        What ``pymc_loo.py`` wrote: ``records`` (per row count) and ``machine``.
    png : str

    Returns
    -------
    str
        ``png``.
    """
    records = payload.get("records") or []
    if not records:
        raise ValueError("pymc_loo payload has no records to plot")
    fig, axes = _figure(1, 1, (8.0, 4.5))
    ax = axes[0, 0]
    labels = ["%.0e rows x %d draws" % (r["rows"], r["draws"]) for r in records]
    original = [r["original_loglik_s"] + r["original_az_loo_s"] if "original_az_loo_s" in r else None
                for r in records]
    series = [("loo on the copy, first call", [r["loo_first_s"] for r in records]),
              ("loo on the copy, again", [r["loo_again_s"] for r in records])]
    if any(v is not None for v in original):
        series.append(("original: compute_log_likelihood + az.loo", original))
    _bars(ax, labels, series)
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    m = payload.get("machine") or {}
    where = "%s x%s" % (m.get("gpu_name"), m.get("gpus")) if payload.get("gpu") else m.get("cpu_model")
    ax.set_title("PSIS-LOO, %s ranks (%s), float64" % (m.get("ranks"), where), fontsize=10)
    return _save(fig, png)


# ------------------------------------------------------------- pymc_libraries
def plot_pymc_libraries(payload, png):
    """Speed of each library model's copy over the original, per logp +
    gradient: the copy with JAX on the ranks and with the linker timed (its
    choice in the label), each round's ratio of medians as a point.

    Parameters
    ----------
    payload : dict
        What ``pymc_libraries.py`` wrote: ``records`` (per model), ``settings``
        and ``machine``.
    png : str

    Returns
    -------
    str
        ``png``.
    """
    import statistics

    records = payload.get("records") or []
    if not records:
        raise ValueError("pymc_libraries payload has no records to plot")
    fig, axes = _figure(1, 1, (8.0, 4.5))
    ax = axes[0, 0]
    labels = ["%s\n(timed: %s)" % (r["model"], r["linker_timed"]) for r in records]
    sides = (("copy, JAX on the ranks", "copy_jax_ms"), ("copy, linker timed (default)", "copy_timed_ms"))
    ratios = {key: [[o / c for o, c in zip(r["original_ms"], r[key])] for r in records] for _, key in sides}
    _bars(ax, labels, [(name, [statistics.median(each) for each in ratios[key]]) for name, key in sides])
    for i, (_, key) in enumerate(sides):
        for j, each in enumerate(ratios[key]):
            ax.plot([j + (i - 0.5) * 0.4] * len(each), each, "k.", ms=4)
    ax.axhline(1.0, color="0.3", lw=1, ls="--")
    ax.set_ylabel("original / copy, per logp + gradient (rounds as dots)")
    m, s = payload.get("machine") or {}, payload.get("settings") or {}
    title = "Library models on %s CPU ranks, %s rows, float64 (%s, %s)" % (
        s.get("ranks"), s.get("rows"), m.get("cpu_model"), (m.get("time") or "")[:10])
    ax.set_title(title, fontsize=9)
    return _save(fig, png)


# --------------------------------------------------------- rows_kernel_blocks
def plot_rows_kernel_blocks(payload, png):
    """ms per run of the ranks against the rows a program, for 1 and 4
    points, one panel per model; the kernel's own choice marked, the batched
    graph through XLA (block 0) beside them.

    Parameters
    ----------
    payload : dict
        What ``rows_kernel_blocks.py`` wrote: ``records`` (model, sums, block,
        chosen, ms_1, ms_4), ``rows``, ``device`` and ``jax``.
    png : str

    Returns
    -------
    str
        ``png``.
    """
    records = payload["records"]
    models = list(dict.fromkeys(r["model"] for r in records))
    fig, axes = _figure(1, len(models), (3.6 * len(models), 4.0))
    for ax, model in zip(axes[0], models):
        mine = [r for r in records if r["model"] == model]
        labels = ["XLA" if not r["block"] else "%d%s" % (r["block"], "*" if r["chosen"] else "")
                  for r in mine]
        _bars(ax, labels, [("1 point", [r["ms_1"] for r in mine]), ("4 points", [r["ms_4"] for r in mine])])
        ax.set(xlabel="rows a program", ylabel="ms per run of the ranks",
               title="%s (%d sums a point)" % (model, mine[0]["sums"]))
    fig.suptitle("Rows kernel block sizes, %g float64 rows, one %s (jax %s); * the kernel's choice, "
                 "XLA: the batched graph, no kernel" % (payload["rows"], payload["device"], payload["jax"]),
                 fontsize=10)
    return _save(fig, png)
