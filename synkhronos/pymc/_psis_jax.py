"""Pareto-smoothed importance sampling of a block of rows in JAX: ``_psis_block``'s
computation, on the device that holds the rows (GPU ranks), without the block
ever coming to the host.

The numbers are ``_psis_block``'s, step for step (the tail of each row, Zhang
and Stephens' fit over its grid of candidate scales, the smoothed tail, the
rows' ``elpd_loo``), and so ArviZ's.  What differs is only the shapes: under
``jit`` the tail's length, which depends on the relative efficiency, is not
known when the function is traced, so every row carries the longest tail
either of ArviZ's rules allows (a fifth of the draws) and the grid the longest
tail needs, masked to the lengths the efficiency gives.

``smoothed_loo`` also says which rows it smoothed (``done``): the others (a
tail not cut off cleanly, a fit with no finite shape) are ArviZ's to compute,
as in ``_psis_block``; the caller hands them to ArviZ's own function.
"""

import math

import numpy as np

from ._psis_block import _logsumexp, _tail_values

__all__ = ["longest_tail", "smoothed_loo"]

_PRIOR_BS = 3  # as _psis_block: the fit's scale of the prior on its grid
_PRIOR_K = 10  # weight of the prior shape 1/2, in draws


def longest_tail(n_draws):
    """The longest tail ArviZ smooths in a row of ``n_draws`` draws, under
    either rule (``_psis_block.tail_length``): a fifth of the draws, rounded up."""
    return max(1, min(n_draws - 1, int(math.ceil(n_draws / 5.0))))


def _tail_length(jnp, n_draws, reff, rules):
    """``_psis_block.tail_length`` of a traced ``reff``."""
    if rules == 0:
        return jnp.ceil(jnp.minimum(n_draws / 5.0, 3 * jnp.sqrt(n_draws / reff))).astype(jnp.int32)
    return jnp.where(n_draws * reff > 225, jnp.floor(3 * jnp.sqrt(n_draws / reff)),
                     math.floor(n_draws / 5)).astype(jnp.int32)


def smoothed_loo(loglik, reff, rules=0):
    """``(elpd_i, p_loo_i, k_i, done)`` of each row of ``loglik`` (rows x draws,
    float64), as ``_psis_block.smoothed_loo`` computes them for the rows it
    smooths itself; ``done`` marks those rows (the others' values are not
    ArviZ's).  Traceable: ``reff`` may be a traced scalar."""
    import jax
    import jax.numpy as jnp

    n_rows, n_draws = loglik.shape
    longest = longest_tail(n_draws)
    tail = _tail_length(jnp, n_draws, reff, rules)
    usable = (tail > 4) & (tail < n_draws)
    t = jnp.clip(tail, 1, longest)  # an index; in arithmetic as float64 (int32 would make float32)
    tf = t.astype(loglik.dtype)
    x = -loglik
    top = x.max(axis=1)
    x = x - top[:, None]
    ends = jax.lax.top_k(x, longest + 1)[0]  # each row's largest ratios, descending
    cutoff = jnp.take(ends, t, axis=1)
    j = jnp.arange(longest)
    valid = j < t  # the tail's places, ascending: the t-th largest first, the largest last
    tails = jnp.take(ends, jnp.clip(t - 1 - j, 0, longest), axis=1)
    clean = jnp.isfinite(top) & (cutoff >= np.log(np.finfo(float).tiny)) & (tails[:, 0] > cutoff)
    exp_cut = jnp.exp(cutoff)
    excess = jnp.where(valid, jnp.exp(tails) - exp_cut[:, None], 0.0)
    quartile_at = jnp.floor(tf / 4 + 0.5).astype(jnp.int32) - 1
    shape, scale = _fit_tail(jax, jnp, excess, valid, t, tf, quartile_at, longest)
    fits = jnp.isfinite(shape) & jnp.isfinite(scale) & (scale > 0)
    if rules == 1:  # no fit where the first quartile is the minimum
        fits &= jnp.take(excess, quartile_at, axis=1) > excess[:, 0]
    quantiles = (j + 0.5) / tf
    smoothed = jnp.minimum(jnp.log(_tail_values(quantiles, shape, scale, jnp) + exp_cut[:, None]), 0.0)
    body = jnp.where(x <= cutoff[:, None], jnp.exp(x), 0.0).sum(axis=1)
    norm = jnp.log(body + jnp.where(valid, jnp.exp(smoothed), 0.0).sum(axis=1))
    body_term = jnp.log(n_draws - tf) - top
    tail_terms = jnp.where(valid, smoothed - tails - top[:, None], -jnp.inf)
    elpd = _logsumexp(jnp.concatenate([body_term[:, None], tail_terms], axis=1), jnp) - norm
    lppd = _logsumexp(loglik, jnp) - np.log(n_draws)
    done = usable & clean & fits
    return elpd, lppd - elpd, shape, done


def _fit_tail(jax, jnp, excess, valid, at, n, quartile_at, longest):
    """``_psis_block._fit_tail`` of each row's first ``at`` (traced; ``n`` as a
    float) values of ``excess`` (``valid``); the grid has the length ``n`` asks
    for, within the length the longest tail asks for."""
    m = 30 + jnp.floor(jnp.sqrt(n))
    g = jnp.arange(1, 30 + int(longest ** 0.5) + 1)
    on_grid = g <= m
    grid = 1 - jnp.sqrt(m / (g - 0.5))
    quartile = jnp.take(excess, quartile_at, axis=1)
    largest = jnp.take(excess, at - 1, axis=1)
    b = grid[None, :] / (_PRIOR_BS * quartile[:, None]) + 1 / largest[:, None]

    def mean_log1p(bs):  # one candidate scale of each row: rows x tail, not rows x grid x tail
        return jnp.where(valid, jnp.log1p(-bs[:, None] * excess), 0.0).sum(axis=1) / n

    shapes = jax.lax.map(mean_log1p, b.T).T
    profile = n * (jnp.log(-(b / shapes)) - shapes - 1)
    gaps = jnp.where(on_grid[None, None, :], profile[:, None, :] - profile[:, :, None], -jnp.inf)
    weights = jnp.where(on_grid[None, :], 1 / jnp.exp(gaps).sum(axis=2), 0.0)
    weights = jnp.where(weights >= 10 * np.finfo(float).eps, weights, 0.0)
    b_post = (b * weights).sum(axis=1) / weights.sum(axis=1)
    shape = jnp.where(valid, jnp.log1p(-b_post[:, None] * excess), 0.0).sum(axis=1) / n
    scale = -shape / b_post
    return (n * shape + _PRIOR_K * 0.5) / (n + _PRIOR_K), scale
