"""Pareto-smoothed importance sampling LOO of a block of rows, on the rank that
holds them (``synkhronos.pymc.loo``).

``PointwiseLoo()(loglik, reff, chains)`` takes the log-likelihood of a block
of rows at every draw (one row per row, the draws along the last axis, chain
after chain, as ArviZ stacks them) and returns each row's ``elpd_loo``,
``p_loo`` and Pareto k: the rank never sends the rows x draws matrix anywhere.
The numbers are ArviZ's own: the Op calls the PSIS of the ArviZ that is
installed, so that they equal ``az.loo``'s.

- ArviZ 0.x: ``az.psislw`` of the negated log-likelihood, then each row's
  log-sum-exp of the smoothed weights plus its log-likelihood (``elpd_loo``),
  and of its log-likelihood over the draws (``lppd``), as ``az.loo`` does;
- ArviZ 1.x: ``arviz_stats``' array ``loo``, which ``az.loo`` runs per row.

Both are computed for the whole block at once by ``_psis_block`` under the
installed ArviZ's rules (the same numbers, several times as fast as ArviZ row
by row), which leaves its odd rows to ArviZ's own function.

The Op runs numpy, in Python, under PyTensor's Python linker (``perform``, CPU
ranks, see ``_loo_ranks``).  On GPU ranks, which compile with JAX only, the
rows are smoothed on the device in float64 sessions (``_psis_jax``, the same
steps as ``_psis_block``), with ArviZ's function for the odd rows in a
callback; in float32 sessions a ``jax.pure_callback`` of the numpy function
takes the whole block to the host.  This module registers the JAX form when it
is imported, which is also where a rank unpickles the Op.
"""

import warnings

import numpy as np
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from ._psis_block import smoothed_loo

__all__ = ["PointwiseLoo", "arviz_major", "arviz_rows", "arviz_stats_rows", "pointwise_loo"]


def arviz_major():
    """The major version of the ArviZ installed (0, or 1 and later)."""
    import arviz

    return int(arviz.__version__.split(".")[0])


def pointwise_loo(loglik, reff, chains):
    """``(elpd_i, p_loo_i, k_i)`` of each row of ``loglik`` (rows x ... x
    draws, the draws of ``chains`` chains one chain after another), with
    relative efficiency ``reff``, each of shape ``loglik.shape[:-1]``."""
    loglik = np.asarray(loglik)
    shape, n_samples = loglik.shape[:-1], loglik.shape[-1]
    if loglik.size == 0:
        return tuple(np.zeros(shape, dtype=loglik.dtype) for _ in range(3))
    rows = np.ascontiguousarray(loglik.reshape(-1, n_samples))  # each row's draws contiguous, as ArviZ
    reff = float(reff)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # ArviZ warns of poor fits per row; loo warns once, in the master, from every k.
        warnings.simplefilter("ignore")
        elpd, p, k = smoothed_loo(rows, reff, lambda left: _by_arviz(left, reff, chains),
                                  rules=min(arviz_major(), 1))
    return tuple(np.asarray(x, dtype=loglik.dtype).reshape(shape) for x in (elpd, p, k))


def _by_arviz(rows, reff, chains):
    """``(elpd_i, p_loo_i, k_i)`` of ``rows`` by the installed ArviZ's own PSIS,
    one row at a time (``arviz_rows`` or ``arviz_stats_rows``)."""
    if arviz_major() == 0:
        return arviz_rows(rows, reff)
    return arviz_stats_rows(rows, reff, chains)


def arviz_rows(rows, reff):
    """``(elpd_i, p_loo_i, k_i)`` of each row of ``rows`` (rows x draws) by ArviZ
    0.x's own PSIS, one row at a time: ``az.psislw`` of the negated
    log-likelihood, then the log-sum-exp of the smoothed weights plus the
    log-likelihood (``elpd_loo``), and of the log-likelihood over the draws
    (``lppd``), as ``az.loo`` does."""
    from arviz import psislw
    from arviz.stats.stats_utils import logsumexp

    log_weights, k = psislw(-rows, reff)
    log_weights += rows
    elpd = logsumexp(log_weights, axis=-1)
    return elpd, logsumexp(rows, b_inv=rows.shape[-1], axis=-1) - elpd, k


def arviz_stats_rows(rows, reff, chains):
    """The same as ``arviz_rows`` by ArviZ 1.x (``arviz_stats``' array ``loo``,
    which ``az.loo`` runs per row), the draws of ``chains`` chains one chain
    after another."""
    from arviz_stats.base import array_stats

    by_chain = rows.reshape(rows.shape[0], int(chains), rows.shape[1] // int(chains))
    elpd, k, p = array_stats.loo(by_chain, chain_axis=-2, draw_axis=-1, r_eff=reff)
    return elpd, p, k


class PointwiseLoo(Op):
    """``PointwiseLoo()(loglik, reff, chains)`` -> ``(elpd_i, p_loo_i, k_i)``,
    each of ``loglik``'s shape without its last axis (the draws)."""

    __props__ = ()

    def make_node(self, loglik, reff, chains):
        import pytensor.tensor as pt

        loglik = pt.as_tensor_variable(loglik)
        if loglik.type.ndim < 2:
            raise TypeError("PointwiseLoo takes rows x draws, got %d axes" % loglik.type.ndim)
        out = pt.tensor(dtype=loglik.dtype, shape=loglik.type.shape[:-1])
        return Apply(self, [loglik, pt.as_tensor_variable(reff), pt.as_tensor_variable(chains)],
                     [out.type() for _ in range(3)])

    def perform(self, node, inputs, output_storage):
        for store, value in zip(output_storage, pointwise_loo(*inputs)):
            store[0] = value

    def infer_shape(self, *args):  # PyTensor 3.3: (node, shapes); before: (fgraph, node, shapes)
        shapes = args[-1]
        return [tuple(shapes[0][:-1])] * 3


def _jax_form(op, node=None, **kwargs):
    """``PointwiseLoo`` under JAX.  In 64-bit mode (float64 sessions) the rows
    are smoothed on the device (``_psis_jax``), and only a block with rows that
    the device leaves to ArviZ goes to the host, in a callback that computes
    those rows; in 32-bit mode the whole block goes to the numpy function in a
    callback, which computes in float64 as ArviZ does."""
    import jax

    dtype = node.outputs[0].dtype if node is not None else None

    def pointwise(loglik, reff, chains):
        spec = jax.ShapeDtypeStruct(loglik.shape[:-1], dtype or loglik.dtype)
        if not jax.config.jax_enable_x64 or loglik.shape[-1] < 2:
            return jax.pure_callback(pointwise_loo, (spec, spec, spec), loglik, reff, chains)
        return _on_device(loglik, reff, chains, spec)

    return pointwise


def _on_device(loglik, reff, chains, spec):
    """``pointwise_loo`` of a JAX block, smoothed on its device (see ``_jax_form``)."""
    import jax
    import jax.numpy as jnp

    from ._psis_jax import smoothed_loo as on_device

    shape, n_draws = loglik.shape[:-1], loglik.shape[-1]
    rows = loglik.reshape(-1, n_draws).astype(jnp.float64)
    elpd, p_loo, k, done = on_device(rows, reff, min(arviz_major(), 1))
    flat = jax.ShapeDtypeStruct(elpd.shape, jnp.float64)

    def with_arviz(values):
        return jax.pure_callback(_rest_by_arviz, (flat, flat, flat), rows, reff, chains, done, *values)

    values = jax.lax.cond(jnp.all(done), lambda v: v, with_arviz, (elpd, p_loo, k))
    return tuple(v.reshape(shape).astype(spec.dtype) for v in values)


def _rest_by_arviz(rows, reff, chains, done, *values):
    """``values`` (``elpd_i``, ``p_loo_i``, ``k_i``) with the rows not ``done``
    computed by the installed ArviZ's own PSIS."""
    values = [np.array(v, dtype=np.float64) for v in values]
    rest = np.flatnonzero(~np.asarray(done))
    if rest.size:
        left = np.ascontiguousarray(np.asarray(rows, dtype=np.float64)[rest])
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            found = _by_arviz(left, float(reff), chains)
        for v, f in zip(values, found):
            v[rest] = f
    return tuple(values)


try:
    from pytensor.link.jax.dispatch import jax_funcify
except ImportError:  # no JAX: PyTensor's other linkers run perform
    pass
else:
    jax_funcify.register(PointwiseLoo)(_jax_form)
