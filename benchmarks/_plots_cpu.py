"""Pictures of the CPU benchmarks: ``cpu_scaling``, ``cpu_backends``, ``call_overhead``,
``soak``, ``mpi_collectives``.

Each function takes the payload its script wrote (as read back from JSON) and the
PNG path, and returns the path; ``_plots.write_plot`` calls them through
``_plots.PLOTTERS``.  ``call_overhead`` and ``soak`` are drawn for GPU runs too
(``call_overhead.py --gpu``, ``soak.py --gpu``; the caption then names the GPUs).
They live here because their default, and the pictures' layout, is the
CPU-worker one; a GPU run only changes labels, title and caption.
"""

from _plot_common import _figure, _finish, _headroom, _int_ticks, _machine_line, _nan, _style

__all__ = ["plot_call_overhead", "plot_cpu_backends", "plot_cpu_scaling", "plot_mpi_collectives",
           "plot_session_start", "plot_soak"]


# ---------------------------------------------------------------- cpu_scaling
def plot_cpu_scaling(payload, png):
    """Step time of Synkhronos ranks and raw processes against N beside the
    single processes, and Synkhronos's speedup over the best of them.

    Parameters
    ----------
    payload : dict
        What ``cpu_scaling.py`` wrote: ``summary`` (per N: ``synk_step_s``,
        ``speedup``, and where raw processes ran ``procs_step_s``),
        ``singles_step_s`` (linker -> seconds), ``what``, ``settings`` and ``machine``.
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
    ax.plot(ns, [s["synk_step_s"] * 1e3 for s in summ], "o-", color="C0", lw=2, label="Synkhronos, N ranks")
    if all("procs_step_s" in s for s in summ):
        ax.plot(ns, [s["procs_step_s"] * 1e3 for s in summ], "s-", color="C1", lw=2,
                label="raw N processes (no reduction)")
    singles = payload.get("singles_step_s") or {}
    for i, (linker, secs) in enumerate(sorted(singles.items(), key=lambda kv: kv[1])):
        ax.axhline(secs * 1e3, color="C%d" % (i + 2), ls="--", lw=1.2,
                   label="one process, every core: %s" % linker)
    if singles:
        best = min(singles.values()) * 1e3
        ax.plot(ns, [best / n for n in ns], ":", color="0.3", label="best single / N")
    ax.set_yscale("log")
    _int_ticks(ax, ns)
    _style(ax, "N (ranks / processes)", "median step (ms, log scale)", "Step time")
    ax_r.plot(ns, [s["speedup"] for s in summ], "o-", color="C0", lw=2, label="Synkhronos / best single")
    ax_r.plot(ns, ns, ":", color="0.3", label="N")
    ax_r.axhline(1.0, color="0.3", lw=1, ls="--")
    ax_r.set_ylim(bottom=0)
    _int_ticks(ax_r, ns)
    _style(ax_r, "N", "speedup (medians of per-round ratios)", "Speedup over the best single process")
    title = "CPU scaling: %s" % payload.get("what", "MLP gradient")
    caption = [
        _machine_line(payload),
        "%s timed steps per configuration, %s round(s); BLAS %s; fastest single process: %s"
        % (settings.get("steps"), settings.get("repeats"), (payload.get("machine") or {}).get("blas"),
           "/".join(payload.get("best_single") or [])),
    ]
    return _finish(fig, title, caption, png)


# --------------------------------------------------------------- cpu_backends
def plot_cpu_backends(payload, png):
    """Whole-command times, cold and warm, and the per-step cost of JAX, per workload.

    Parameters
    ----------
    payload : dict
        What ``cpu_backends.py`` wrote: ``summary`` (per workload: ``numba_cold_s``,
        ``numba_warm_s``, ``jax_cold_s``, ``jax_warm_s``, ``jax_over_numba_work``),
        ``runs``, ``settings`` and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    summ = payload["summary"]
    names = [s["workload"] for s in summ]
    fig, (ax, ax_r) = _figure("cpu_backends", 2)
    bars = (("numba_cold_s", "Numba, empty cache", "C0", None), ("numba_warm_s", "Numba, warm", "C0", "//"),
            ("jax_cold_s", "JAX, empty cache", "C1", None), ("jax_warm_s", "JAX, warm", "C1", "//"))
    width = 0.8 / len(bars)
    for i, (key, label, color, hatch) in enumerate(bars):
        xs = [j + (i - 1.5) * width for j in range(len(names))]
        ax.bar(xs, [s[key] for s in summ], width, color=color, alpha=0.55 if hatch else 0.9, hatch=hatch,
               label=label)
    ax.set_xticks(range(len(names)), names)
    _style(ax, "workload (2 CPU ranks)", "whole command (s)", "Wall time, first run and later runs")
    ax_r.bar(range(len(names)), [s["jax_over_numba_work"] for s in summ], 0.6, color="C1")
    ax_r.axhline(1.0, color="0.3", lw=1, ls="--", label="same speed")
    ax_r.axhline(1.1, color="C3", lw=1, ls=":", label="10% slower")
    ax_r.set_xticks(range(len(names)), names)
    _headroom(ax_r, [s["jax_over_numba_work"] for s in summ] + [1.1], 1.3)
    _style(ax_r, "workload", "JAX time / Numba time", "Work once compiled (warm)")
    caption = [_machine_line(payload),
               "medians of %s round(s); work: median time per training step, warm (the demos': after their "
               "first epoch)" % (payload.get("settings") or {}).get("rounds")]
    return _finish(fig, "CPU workers: Numba or JAX", caption, png)


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
            ax.axhline(pipe, color="0.4", ls=":", lw=1, label="2-process socket round trip (%.0f us)" % pipe)
        shm = payload.get("shm_round_trip_us_median")
        if shm:
            ax.axhline(shm, color="0.4", ls="--", lw=1,
                       label="2-process shared-memory channel round trip (%.0f us)" % shm)
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


# ------------------------------------------------------------ mpi_collectives
def plot_mpi_collectives(payload, png):
    """GB/s of each collective against size: raw mpi4py, Synkhronos under mpirun
    (a host per rank) and Synkhronos on one host, one panel per operation.

    Parameters
    ----------
    payload : dict
        What ``mpi_collectives.py`` wrote: ``records`` (per op and size, ``mb``
        and ``<setting>_gbps`` for raw, synk_mpi and synk_host; None where a
        setting failed), ``settings`` (``n``, ``iters``, ``repeats``) and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    records = payload["records"]
    settings = payload.get("settings") or {}
    ops = list(dict.fromkeys(r["op"] for r in records))
    fig, axes = _figure("mpi_collectives", len(ops))
    sides = (("raw", "raw mpi4py", "0.35", "s"), ("synk_mpi", "synk, mpirun (a host per rank)", "C0", "o"),
             ("synk_host", "synk, one host (no MPI)", "C1", "^"))
    for ax, op in zip(axes, ops):
        recs = [r for r in records if r["op"] == op]
        sizes = [r["mb"] for r in recs]
        for key, label, color, marker in sides:
            ax.plot(sizes, _nan([r.get(key + "_gbps") for r in recs]), marker=marker, color=color, lw=2,
                    label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, ["%g" % s for s in sizes])
        _headroom(ax, [r.get(k + "_gbps") for r in recs for k, _, _, _ in sides], 1.35)
        _style(ax, "size of the variable (MB)", "GB/s of the variable", op, loc="upper left")
    title = "Collectives on %s CPU ranks: Synkhronos under MPI against raw mpi4py" % settings.get("n")
    caption = [
        _machine_line(payload),
        "float32 variables; %s calls back to back then one synchronisation, fastest of %s; all_gather: "
        "the time of a broadcast that restores the variable's size, then the all_gather, less that "
        "broadcast's time" % (settings.get("iters"), settings.get("repeats")),
    ]
    return _finish(fig, title, caption, png)


def plot_session_start(payload, png):
    """A session's start, workers spawned or forked by a template: the first
    session and later ones, and the later sessions' steps.

    Parameters
    ----------
    payload : dict
        What ``session_start.py`` wrote: ``summary`` (per method: ``first_s``,
        ``later_s``, ``later_<step>_s``), ``runs``, ``settings`` and ``machine``.
    png : str
        Path of the PNG to write.

    Returns
    -------
    str
        ``png``.
    """
    summ = payload["summary"]
    settings = payload.get("settings") or {}
    fig, (ax, ax_r) = _figure("session_start", 2)
    names = [s["method"] for s in summ]
    for i, (key, label, hatch) in enumerate((("first_s", "first session", None),
                                              ("later_s", "later sessions", "//"))):
        xs = [j + (i - 0.5) * 0.4 for j in range(len(names))]
        ax.bar(xs, [s[key] for s in summ], 0.4, color=["C%d" % j for j in range(len(names))],
               alpha=0.55 if hatch else 0.9, hatch=hatch, label=label)
    ax.set_xticks(range(len(names)), ["workers: %s" % n for n in names])
    _style(ax, "", "fork() to first result (s)", "A session's start")
    steps = ("fork", "distribute", "call", "close")
    width = 0.8 / len(summ)
    for j, s in enumerate(summ):
        xs = [k + (j - (len(summ) - 1) / 2) * width for k in range(len(steps))]
        ax_r.bar(xs, [s["later_%s_s" % step] for step in steps], width, color="C%d" % j, label=s["method"])
    ax_r.set_xticks(range(len(steps)), ["%s()" % step for step in steps])
    _style(ax_r, "step", "seconds", "Later sessions, step by step")
    caption = [_machine_line(payload),
               "%s CPU ranks; %s sessions per master process; medians of %s round(s), the two ways alternated"
               % (settings.get("ranks"), settings.get("sessions"), settings.get("rounds"))]
    return _finish(fig, "Starting a session: workers spawned or forked by a template", caption, png)
