"""Pareto-smoothed importance sampling of many rows at once, in numpy: the same
numbers as ArviZ's own PSIS (Vehtari, Gelman and Gabry's, with Zhang and
Stephens' fit of the generalized Pareto tail), which smooths one row at a time
in Python (120-400 us a row at 1,000 draws, nearly all of ``loo``'s time).

ArviZ 0.x (``az.psislw``) and 1.x (``arviz_stats``) differ in their rules:
the tail's length (``ceil(min(S/5, 3 sqrt(S/reff)))`` against
``floor(3 sqrt(S/reff))``, or ``floor(S/5)`` for ``S reff <= 225``), and 1.x
gives no fit where the tail's first quartile is its minimum.  ``RULES`` holds
both; the caller names the installed one.

Every row of a block has the same tail length (it depends on the draws and the
relative efficiency only), so the sort, the tail's fit over its grid of
candidate scales, and the smoothed tail are computed as arrays over the rows.
A row whose tail is not cut off cleanly (ties at the cutoff, a cutoff below the
smallest positive float), or whose fit gives no finite shape, is left to
ArviZ's own function: those rows are rare, and their rules are ArviZ's.
"""

import math

import numpy as np

__all__ = ["RULES", "tail_length", "smoothed_loo"]

_PRIOR_BS = 3  # the fit's scale of the prior on its grid (Zhang and Stephens)
_PRIOR_K = 10  # weight of the prior shape 1/2, in draws
_GRID_CHUNK = 1 << 22  # values of the fit's rows x grid x tail held at once
RULES = (0, 1)  # ArviZ's major versions


def tail_length(n_draws, reff, rules=0):
    """The draws in each row's smoothed tail under ArviZ ``rules`` (0 or 1)."""
    if rules == 0:
        return int(math.ceil(min(n_draws / 5.0, 3 * (n_draws / reff) ** 0.5)))
    if n_draws * reff > 225:
        return int(math.floor(3 * (n_draws / reff) ** 0.5))
    return int(math.floor(n_draws / 5))


def smoothed_loo(loglik, reff, fallback, rules=0):
    """``(elpd_i, p_loo_i, k_i)`` of each row of ``loglik`` (rows x draws), as
    ArviZ ``rules`` (0 or 1, its major version) computes them.

    ``fallback(rows)`` gives the same three for the rows (a rows x draws array)
    that are not smoothed here; it is ArviZ's per-row PSIS."""
    if rules not in RULES:
        raise ValueError("rules must be one of %s, got %r" % (RULES, rules))
    loglik = np.asarray(loglik, dtype=np.float64)
    n_rows, n_draws = loglik.shape
    elpd, p_loo, k = (np.empty(n_rows) for _ in range(3))
    tail = tail_length(n_draws, reff, rules)
    done = np.zeros(n_rows, dtype=bool)
    if 4 < tail < n_draws:
        done = _smooth_regular(loglik, tail, elpd, k, rules)
    lppd = _logsumexp(loglik) - np.log(n_draws)
    p_loo[done] = lppd[done] - elpd[done]
    rest = np.flatnonzero(~done)
    if rest.size:
        elpd[rest], p_loo[rest], k[rest] = fallback(loglik[rest])
    return elpd, p_loo, k


def _smooth_regular(loglik, tail, elpd, k, rules):
    """Fill ``elpd`` and ``k`` for the rows whose tail is cut off cleanly
    (``tail`` draws above the cutoff) and fits; return which rows those are.

    A body draw keeps its ratio ``x = -loglik - max``, so its weight times its
    likelihood is ``exp(-max)`` for every body draw: the body enters ``elpd``
    as a count, and the normaliser as one sum."""
    n_rows, n_draws = loglik.shape
    x, top, cutoff, tails = _tails(loglik, tail)
    clean = np.isfinite(top) & (cutoff >= np.log(np.finfo(float).tiny)) & (tails[:, 0] > cutoff)
    rows = np.flatnonzero(clean)
    exp_cut = np.exp(cutoff[rows])
    excess = np.exp(tails[rows]) - exp_cut[:, None]
    shape, scale = _fit_tail(excess)
    fits = np.isfinite(shape) & np.isfinite(scale) & (scale > 0)
    if rules == 1:  # no fit where the first quartile is the minimum
        fits &= excess[:, int(tail / 4 + 0.5) - 1] > excess[:, 0]
    rows, shape, scale, exp_cut = rows[fits], shape[fits], scale[fits], exp_cut[fits]
    done = np.zeros(n_rows, dtype=bool)
    if not rows.size:
        return done
    quantiles = np.arange(0.5, tail) / tail
    smoothed = np.log(_tail_values(quantiles, shape, scale) + exp_cut[:, None])
    np.minimum(smoothed, 0.0, out=smoothed)  # no smoothed weight above the largest raw one
    xr = x[rows]
    body = np.where(xr <= cutoff[rows, None], np.exp(xr), 0.0).sum(axis=1)
    norm = np.log(body + np.exp(smoothed).sum(axis=1))
    # The tail's draws in ascending order have log-likelihood -(ratio + max).
    body_term = np.log(n_draws - tail) - top[rows, None]
    terms = np.concatenate([body_term, smoothed - tails[rows] - top[rows, None]], axis=1)
    elpd[rows] = _logsumexp(terms) - norm
    k[rows] = shape
    done[rows] = True
    return done


def _tails(loglik, tail):
    """Each row's log importance ratios ``x`` (less their maximum ``top``), the
    ratio below its tail (``cutoff``) and its ``tail`` largest, ascending: found
    in linear time (``argpartition``), only they sorted."""
    x = -loglik
    top = x.max(axis=1)
    x -= top[:, None]
    cut = x.shape[1] - tail - 1
    part = np.argpartition(x, cut, axis=1)[:, cut:]
    ends = np.sort(np.take_along_axis(x, part, axis=1), axis=1)
    return x, top, ends[:, 0], ends[:, 1:]


def _fit_tail(excess):
    """Zhang and Stephens' estimate of the generalized Pareto shape and scale of
    each row of ``excess`` (ascending, positive), with the prior on the shape
    that PSIS adds; rows x tail in, two row vectors out."""
    n_rows, n = excess.shape
    m = 30 + int(n ** 0.5)
    grid = 1 - np.sqrt(m / (np.arange(1, m + 1, dtype=float) - 0.5))
    quartile = excess[:, int(n / 4 + 0.5) - 1]
    b = grid[None, :] / (_PRIOR_BS * quartile[:, None]) + 1 / excess[:, -1:]
    with np.errstate(all="ignore"):
        shapes = np.empty_like(b)
        step = max(1, _GRID_CHUNK // (m * n))
        for lo in range(0, n_rows, step):  # rows x grid x tail at once, in bounded chunks
            sl = slice(lo, lo + step)
            shapes[sl] = np.log1p(-b[sl, :, None] * excess[sl, None, :]).mean(axis=2)
        profile = n * (np.log(-(b / shapes)) - shapes - 1)
        weights = 1 / np.exp(profile[:, None, :] - profile[:, :, None]).sum(axis=2)
        weights = np.where(weights >= 10 * np.finfo(float).eps, weights, 0.0)
        b_post = (b * weights).sum(axis=1) / weights.sum(axis=1)
        shape = np.log1p(-b_post[:, None] * excess).mean(axis=1)
        scale = -shape / b_post
    return (n * shape + _PRIOR_K * 0.5) / (n + _PRIOR_K), scale


def _tail_values(quantiles, shape, scale, xp=np):
    """The generalized Pareto quantiles ``quantiles`` of each row's shape and
    scale; ``xp``: numpy, or ``jax.numpy`` (``_psis_jax``)."""
    tiny = xp.abs(shape) < np.finfo(float).eps
    safe = xp.where(tiny, 1.0, shape)
    general = xp.expm1(-safe[:, None] * xp.log1p(-quantiles)[None, :]) / safe[:, None]
    values = xp.where(tiny[:, None], -xp.log1p(-quantiles)[None, :], general)
    return values * scale[:, None]


def _logsumexp(a, xp=np):
    """Log-sum-exp of each row of ``a`` (``xp`` as for ``_tail_values``).  Not
    scipy's: with its checks it took twice as long on a block, and this runs
    over every draw of every row."""
    top = a.max(axis=1)
    top = xp.where(xp.isfinite(top), top, 0.0)
    return top + xp.log(xp.exp(a - top[:, None]).sum(axis=1))
