"""``loo(idata, model)``: PSIS leave-one-out cross-validation of a
``data_parallel`` copy, each rank computing it for the rows it holds.

``az.loo`` needs the log-likelihood of every row at every draw, a draws x rows
matrix (4,000 draws of 10^7 rows: 320 GB in float64).  Each row's PSIS needs
only that row's values over the draws, and each rank already holds its rows.
So:

1. this process takes the draws of the free variables from the posterior and
   ``reff`` as ``az.loo`` computes it (``_elpd``), and broadcasts them to the
   ranks once, into shared variables of the ranks' functions;
2. the ranks' functions (``_loo_ranks``: built once per copy and term, on the
   shared variables that hold the copy's rows) compute a block of
   ``chunk_rows`` of each rank's rows at every draw, then ArviZ's PSIS of each
   of those rows on the rank (``_psis``), and return each row's ``elpd_loo``,
   ``p_loo`` and Pareto k;
3. this process calls them block after block (``batch_s``, one slice of its
   own rows per rank), puts the rows back in order and sums them into ArviZ's
   ELPD object (``_elpd``).

A rank holds at once one block's matrix, ``chunk_rows`` x draws values, and
ArviZ's copies of it.
"""

import weakref

import numpy as np

from .. import _collectives as _coll
from .._session import runtime
from ._elpd import elpd_data, relative_efficiency, scale_value
from ._loo_ranks import RanksLoo
from ._refresh import rows_op_of

__all__ = ["loo", "rows_op_of"]

CHUNK_VALUES = 2**23  # the default block: about 64 MiB of float64 log-likelihood per rank

_FUNCTIONS = weakref.WeakKeyDictionary()  # a copy's Op -> {term: RanksLoo}, built at its first loo


def loo(idata, model, *, var_name=None, reff=None, pointwise=None, scale=None, chunk_rows=None):
    """Pareto-smoothed importance sampling LOO of a ``data_parallel`` copy, each
    rank computing it for its own rows.

    Equals ``az.loo(idata)`` after ``pm.compute_log_likelihood(idata)`` on the
    original model (every row's ``elpd_loo`` and Pareto k, the totals, the
    standard error), without the draws x rows log-likelihood matrix: each rank
    computes its rows' log-likelihood over all draws a block of rows at a time
    and Pareto-smooths each row with ArviZ's own PSIS there.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
        Holds the ``posterior`` of the model's free variables (as ``pm.sample``
        returns it); no ``log_likelihood`` group is needed.
    model : pymc.Model
        The copy that ``synkhronos.pymc.data_parallel`` returned, in this
        process, its session open.
    var_name : str, optional
        The split observed variable (or potential) whose rows are left out; may
        be omitted where only one was split.
    reff : float, optional
        Relative efficiency of the draws (ESS / draws); by default computed
        from the posterior as ``az.loo`` computes it.
    pointwise : bool, optional
        Whether the result holds each row's values (``loo_i``/``elpd_i``,
        ``pareto_k``, ``p_loo_i``); default ArviZ's ``stats.ic_pointwise``.
        ``az.compare`` needs them.
    scale : str, optional
        ``"log"``, ``"negative_log"`` or ``"deviance"`` as in ArviZ 0.x's
        ``az.loo``; ArviZ 1.x computes on the log scale only.
    chunk_rows : int, optional
        Rows of each rank computed at once (default: about 2^23 values,
        64 MiB in float64, of log-likelihood per block).

    Returns
    -------
    arviz.ELPDData (ArviZ 0.x) or arviz_stats.ELPDDataLOO (ArviZ 1.x)
        What ``az.loo(idata, pointwise=...)`` of the installed ArviZ returns,
        with each row's ``p_loo`` as well (``p_loo_i``).

    Raises
    ------
    TypeError
        If ``model`` is not a ``data_parallel`` copy, or ``idata`` has no
        posterior.
    ValueError
        If an argument is malformed, ``var_name`` is not a split term, or the
        posterior lacks a free variable the term depends on.
    RuntimeError
        If the copy's session was closed, or this is not its process.

    Notes
    -----
    Memory on each rank: the block's log-likelihood, ``chunk_rows`` x draws
    x 8 bytes in float64, and its copies (JAX's temporaries, the copy kept on
    the rank, ArviZ's while it smooths the rows): the peak grew by seven to
    eight blocks in the measurements of the docs page "PyMC models", besides
    the draws themselves.  In this process, three float64 values per row.
    """
    from ._psis import arviz_major

    op, inputs = _rows_op(model)
    terms = op.pointwise
    term = _term(terms, var_name)
    major = arviz_major()
    factor = scale_value(scale, major)
    if pointwise is not None and not isinstance(pointwise, bool):
        raise TypeError("pointwise must be True, False or None, got %r" % (pointwise,))
    chunk = None if chunk_rows is None else _check_chunk(chunk_rows)
    reff = None if reff is None else _check_reff(reff)
    posterior = _posterior(idata)
    with runtime.locked():  # the draws broadcast, then read by every block's call, as one step
        ranks = _FUNCTIONS.setdefault(op, {}).get(term)
        if ranks is None:
            ranks = _FUNCTIONS[op][term] = RanksLoo(terms, term, model.check_bounds)
        params = [terms.params[i] for i in ranks.params]
        draws, chains, n_samples = _draws(posterior, params, terms.names[term])
        if reff is None:
            reff = relative_efficiency(posterior, n_samples, major)
        data = [np.asarray(inputs[len(terms.params) + i].get_value()) for i in ranks.data]
        _coll.broadcast(ranks.shareds, draws + data + [np.float64(reff), np.int64(chains)])
        values = ranks.run(chunk or max(1, CHUNK_VALUES // n_samples))
    dims, coords = _labels(model, terms.names[term], terms.dims[term], values[0].shape)
    return elpd_data(values, dims, coords, n_samples, factor, pointwise, major)


def _rows_op(model):
    """``rows_op_of(model)``, checked: a copy, in its session's process."""
    import pymc as pm

    if not isinstance(model, pm.Model):
        raise TypeError("model must be the pymc.Model that synkhronos.pymc.data_parallel returned, got %r"
                        % (model,))
    found = rows_op_of(model)
    if found is None:
        raise TypeError("model %r is not a copy that synkhronos.pymc.data_parallel returned (it has no "
                        "data-parallel terms): pass the copy, not the original model"
                        % (model.name or model,))
    op = found[0]
    if op.pointwise is None or op.evaluator is None:
        raise RuntimeError("synkhronos.pymc.loo runs in the process that called data_parallel, "
                           "with its session open (this copy's terms %s are evaluated elsewhere)" % op.names)
    if runtime.current() is not op.evaluator.rt:
        raise RuntimeError("the Synkhronos session that holds the rows of %s was closed: call "
                           "synkhronos.pymc.data_parallel(model) again" % op.names)
    op.evaluator.rows_current()
    return found


def _term(terms, var_name):
    """The index of the term ``var_name`` names among ``terms``."""
    if var_name is None:
        if len(terms.names) > 1:
            raise ValueError("the copy splits several terms %s: name one with var_name="
                             % (list(terms.names),))
        return 0
    if var_name not in terms.names:
        raise ValueError("var_name=%r is not a term the copy splits over the ranks (those are %s); for "
                         "another variable use pm.compute_log_likelihood and az.loo"
                         % (var_name, list(terms.names)))
    return terms.names.index(var_name)


def _posterior(idata):
    posterior = getattr(idata, "posterior", None)
    if posterior is None or not hasattr(posterior, "sizes") or "chain" not in posterior.sizes \
            or "draw" not in posterior.sizes:
        raise TypeError("idata must hold a posterior group with chain and draw dimensions (what pm.sample "
                        "returns), got %s" % type(idata).__name__)
    return posterior


def _draws(posterior, params, name):
    """``(draws, chains, n_samples)``: the draws of each of free variables
    ``params`` (which term ``name`` reads), chain after chain (as ArviZ stacks
    them), one per draw along the first axis."""
    chains, per_chain = int(posterior.sizes["chain"]), int(posterior.sizes["draw"])
    n_samples = chains * per_chain
    draws = []
    for p in params:
        if p.name not in posterior:
            raise ValueError("the posterior has no variable %r, which the log-density of %r depends on (it "
                             "has %s)" % (p.name, name, sorted(posterior.data_vars)))
        x = posterior[p.name].transpose("chain", "draw", ...).values
        fixed = zip(p.type.shape, x.shape[2:])
        if x.ndim != p.type.ndim + 2 or any(a is not None and a != b for a, b in fixed):
            raise ValueError("posterior variable %r has shape %s per draw; the model's is %s"
                             % (p.name, x.shape[2:], p.type.shape))
        draws.append(np.ascontiguousarray(x.reshape((n_samples,) + x.shape[2:]), dtype=p.dtype))
    if n_samples < 2:
        raise ValueError("the posterior has %d draw(s); LOO needs at least 2" % n_samples)
    return draws, chains, n_samples


def _check_reff(reff):
    if isinstance(reff, bool) or not isinstance(reff, int | float | np.number) or not 0 < reff < np.inf:
        raise ValueError("reff must be a positive finite number, got %r" % (reff,))
    return float(reff)


def _check_chunk(chunk_rows):
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int | np.integer) or chunk_rows < 1:
        raise ValueError("chunk_rows must be a positive int, got %r" % (chunk_rows,))
    return int(chunk_rows)


def _labels(model, name, dims, shape):
    """Dimension names and coordinates of variable ``name``'s observations, as
    PyMC names them in ``log_likelihood``: ``dims`` (the model's, or None),
    else ``<name>_dim_<i>``, and the model's coordinates of them."""
    dims = list(dims or ())
    dims += ["%s_dim_%d" % (name, i) for i in range(len(dims), len(shape))]
    coords = {}
    for d, n in zip(dims, shape):
        known = model.coords.get(d)
        coords[d] = np.asarray(known) if known is not None and len(known) == n else np.arange(n)
    return dims[:len(shape)], coords
