"""What ``synkhronos.pymc.loo`` computes in this process, as ArviZ computes it:
the relative efficiency of the draws, and the totals of the rows' values put in
ArviZ's own ELPD object, so that ``az.compare`` takes it.

The two ArviZ families differ, and each gets its own:

- ArviZ 0.x: ``ELPDData``, a pandas Series (``elpd_loo``, ``se``, ``p_loo``,
  ..., ``loo_i``, ``pareto_k``), scaled by ``scale`` as ``az.loo(scale=...)``
  scales it, the standard error of the rows' values with ``ddof=0``;
- ArviZ 1.x: ``arviz_stats``' ``ELPDDataLOO``, its totals from ``arviz_stats``'
  own summary (a standard error with ``ddof=1``), on the log scale only.

Both also hold each row's ``p_loo`` (``p_loo_i``), which ``az.loo`` does not
return; neither holds the smoothed weights (a draws x rows matrix).
"""

import warnings

import numpy as np

__all__ = ["elpd_data", "relative_efficiency", "scale_value"]

_SCALES = {"log": 1, "negative_log": -1, "deviance": -2}


def scale_value(scale, major):
    """The factor of ``scale`` (None: ArviZ's ``stats.ic_scale``), checked for
    ArviZ ``major``: 1.x computes on the log scale only."""
    if scale is None:
        return 1 if major >= 1 else _SCALES[_rc_params(major)["stats.ic_scale"]]
    if not isinstance(scale, str) or scale.lower() not in _SCALES:
        raise ValueError("scale must be one of %s, got %r" % (sorted(_SCALES), scale))
    if major >= 1 and scale.lower() != "log":
        raise ValueError("scale=%r: ArviZ %d's loo computes on the log scale only (scale='log' or None)"
                         % (scale, major))
    return _SCALES[scale.lower()]


def relative_efficiency(posterior, n_samples, major):
    """``reff`` as ``az.loo`` computes it: 1 for one chain, else the mean over
    every variable of ``posterior`` of ArviZ's ESS (method "mean"), divided by
    ``n_samples``."""
    if posterior.sizes["chain"] == 1:
        return 1.0
    if major >= 1:
        ess = posterior.azstats.ess(method="mean")
    else:
        import arviz

        ess = arviz.ess(posterior, method="mean")
    return float(np.hstack([np.asarray(ess[v].values).ravel() for v in ess.data_vars]).mean() / n_samples)


def elpd_data(values, dims, coords, n_samples, scale, pointwise, major):
    """ArviZ ``major``'s ELPD object of each row's ``values`` (``(elpd_i,
    p_loo_i, k_i)``, arrays of the observations' shape, labelled by ``dims``
    and ``coords``) from ``n_samples`` draws, on ``scale`` (its factor), the
    pointwise values included where ``pointwise`` (None: ArviZ's
    ``stats.ic_pointwise``)."""
    import xarray as xr

    elpd_i, p_i, k_i = values
    if pointwise is None:
        pointwise = bool(_rc_params(major)["stats.ic_pointwise"])
    n_points = int(elpd_i.size)

    def labelled(x, name):
        return xr.DataArray(x, dims=dims, coords={d: coords[d] for d in dims}, name=name)

    good_k = min(1 - 1 / np.log10(n_samples), 0.7) if n_samples > 1 else 0.7
    warning = bool(np.any(k_i > good_k))
    if warning:  # ArviZ's own warning, once for all rows
        warnings.warn("Estimated shape parameter of Pareto distribution is greater than %.2f for one or more "
                      "samples. You should consider using a more robust model, this is because importance "
                      "sampling is less likely to work well if the marginal posterior and LOO posterior are "
                      "very different. This is more likely to happen with a non-robust model and highly "
                      "influential observations." % good_k)
    if major >= 1:
        from arviz_stats.base import array_stats
        from arviz_stats.utils import ELPDDataLOO

        elpd, se, p, _ = array_stats.loo_summary(elpd_i, p_i)
        return ELPDDataLOO(
            elpd=elpd, se=se, p=p, n_samples=n_samples, n_data_points=n_points, scale="log",
            warning=warning, good_k=good_k, approx_posterior=False,
            elpd_i=labelled(elpd_i, "elpd_i") if pointwise else None,
            pareto_k=labelled(k_i, "pareto_k") if pointwise else None,
            p_loo_i=labelled(p_i, "p_loo_i") if pointwise else None)
    from arviz.stats.stats_utils import ELPDData

    loo_i = scale * elpd_i
    name = {v: k for k, v in _SCALES.items()}[scale]
    totals = [loo_i.sum(), (n_points * np.var(loo_i)) ** 0.5, p_i.sum(), n_samples, n_points, warning]
    index = ["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning"]
    if pointwise:
        totals += [labelled(loo_i, "loo_i"), labelled(k_i, "pareto_shape")]
        index += ["loo_i", "pareto_k"]
    totals += [name, good_k] + ([labelled(p_i, "p_loo_i")] if pointwise else [])
    index += ["scale", "good_k"] + (["p_loo_i"] if pointwise else [])
    return ELPDData(data=totals, index=index)


def _rc_params(major):
    if major >= 1:
        from arviz_base import rcParams
    else:
        from arviz import rcParams
    return rcParams
