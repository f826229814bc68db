"""``data_parallel(model)``: a copy of a PyMC model whose likelihood over rows
of data runs on every Synkhronos rank, built by one pipeline.

Each stage is one module, called once, in this order:

1. ``_variables``: which variables are split, and over how many rows;
2. ``_terms``: each one's log-density as a sum over rows, and what it reads;
3. ``_split``: the rows split among the ranks, proved independent first;
4. ``_ranks``: the graph each rank runs on its rows (log-density, gradient);
5. ``_vectorized``: that graph at several points in one pass, where it pays;
6. ``_sendable``: a form of it that pickles to the ranks;
7. ``_gpu`` and ``_cpu``: its forms that GPU ranks, and CPU ranks' own
   linkers, compute fastest;
8. ``_packed``: a point's parameters and results, one array each;
9. ``_distribute``: the graph made a Synkhronos function, sent with the rows;
10. ``_linker``: on CPU ranks, JAX or PyTensor's own linker, the faster there;
11. ``_evaluator``: this process's side of that function, open to its children;
12. ``_placement``: each evaluation on every rank, or on this process's rank
    alone where that is faster;
13. ``_op``: the Op that calls it, standing for the terms;
14. ``_copy``: the model's copy that holds the Op in their place;
15. ``_refresh``: the ranks' rows kept equal to the copy's data, which
    ``pm.set_data`` may change.

The other modules are parts that the stages use: ``_gradient`` (the
log-density's gradient and checks as PyMC compiles them: ``_ranks``,
``_vectorized``), ``_kernel`` with ``_blocks`` and ``_scalars`` (``_gpu``'s
kernel over the rows) and ``_batch`` (``_evaluator``'s chains in one call).
Their helpers on graphs, which know nothing of PyMC, are
``synkhronos._graph.editing``'s.

``loo(idata, copy)`` (``_loo``) builds on a copy: the Op keeps each term's
per-row log-density in the ranks' inputs (``_pointwise``), from which
``_loo_ranks`` makes two functions of the ranks, the rows' log-likelihood at
every draw and ArviZ's PSIS of each row (``_psis``, a whole block at once in
``_psis_block``); ``_elpd`` puts the rows' values in ArviZ's ELPD object in
this process.
"""

import functools
import logging
import threading

from .. import _api
from .._common.selections import split_bounds
from .._session import runtime
from ._copy import check_copyable, with_op
from ._cpu import for_cpu_ranks
from ._distribute import distributed
from ._evaluator import evaluator
from ._gpu import for_gpu_ranks
from ._linker import check_linker, linker_chosen
from ._op import rows_logp
from ._packed import packed
from ._placement import check_ranks, placed, rows_on
from ._pointwise import pointwise_terms
from ._ranks import ranks_graph
from ._refresh import release, rows_follow_data, source_of
from ._sendable import sendable
from ._split import check_rowwise, initial_inputs
from ._terms import find_terms
from ._variables import split_variables
from ._vectorized import vectorized

__all__ = ["data_parallel"]

_FORKING = threading.Lock()

logger = logging.getLogger("synkhronos")


def data_parallel(model, observed=None, rows=None, batch=None, ranks=None):
    """A copy of PyMC model ``model`` whose likelihood over rows of data is
    computed data-parallel on all Synkhronos ranks.

    The copy has the same free variables (names, shapes, transforms), the same
    deterministics and potentials, and the same log-density; PyMC's own
    functions take it (``pm.sample``, ``pm.find_MAP``, ``compile_logp``,
    ``compile_dlogp``).  The rows of each split observed variable, and of every
    ``pm.Data`` or constant with as many rows, are divided among the ranks once
    (each rank keeps only its share); every evaluation then broadcasts the
    parameters, each rank computes its rows' log-density and gradient, and one
    reduction sums them: one round trip.  Priors and the terms not split are
    computed once, in this process.  ``model`` itself is not changed.

    Parameters
    ----------
    model : pymc.Model
        A model, or a copy that ``data_parallel`` returned: the model it was
        made from is then split again, with the copy's data (a notebook's
        ``model = data_parallel(model)`` run twice, or a copy whose session
        was closed), and the rows of the copy given are freed on the ranks
        (its evaluations then raise RuntimeError).
    observed : list of str or Variable, optional
        The observed variables to split (default: every observed variable whose
        data has ``rows`` rows).
    rows : int, optional
        The number of rows (default: the longest leading dimension of the
        observed data).
    batch : bool or None, optional
        Whether points that several chains ask for at once are evaluated in
        one pass over the rows (each parameter with a leading axis of points),
        or one after another.  None (default): in one pass where the ranks
        compile the terms with JAX (GPU ranks, and CPU ranks unless PyTensor's
        mode is set), where it is faster per point; one after another with
        PyTensor's other linkers, where it is slower (see the docs page "PyMC
        models").  Graphs that PyTensor cannot batch are evaluated one
        point at a time either way.
    ranks : int or None, optional
        Where evaluations run: ``synkhronos.n_parallel()``, on every rank;
        1, on this process's rank alone, which then holds every row (the
        others none).  None (default): each evaluation where it was faster
        when timed here at the model's initial point, for one point and for
        four; where this process's rank alone is faster for some, it keeps a
        copy of every row for them (rows of at most 1 GiB).  Every rank is
        faster unless rows are few; the log says what was chosen, and why.

    Returns
    -------
    pymc.Model

    Raises
    ------
    TypeError
        If ``model`` is not a PyMC model.
    ValueError
        If a term cannot be split: its data do not have ``rows`` rows, its
        log-density is not one value per row, or a row's value depends on other
        rows (an AR process or a GP over the rows): the error names the term.

    Notes
    -----
    Synkhronos is forked with its defaults if it was not; the function is
    distributed at once, with any others built so far.  The split data are
    copies taken now: ``pm.set_data`` on the copy's data (new values, or
    another number of rows) reaches the ranks at the next evaluation, where
    the terms stay the ones split (the same graph; ValueError otherwise).
    ``pm.set_data`` on ``model`` does not change the copy.

    The copy may be evaluated from any thread, and from processes that PyMC
    forks or spawns for its chains: every evaluation runs on the ranks of this
    process's session (a child asks this process, which must stay alive and
    keep the session open meanwhile).  Evaluations asked for at the same time
    run one after another, or with ``batch`` in one pass.
    """
    _check_arguments(model, batch)
    given, source = model, source_of(model)
    model = model if source is None else source  # a copy: its original again, with the copy's data
    check_copyable(model)
    chosen, n_rows = split_variables(model, observed, rows)
    n = _forked_ranks()
    ranks = check_ranks(ranks, n)
    check_linker()
    terms = find_terms(model, chosen, n_rows)
    check_rowwise(model, terms, split_bounds(n_rows, n))
    graph = ranks_graph(terms, model.check_bounds)
    graph = vectorized(graph, batch, model.check_bounds)
    graph = sendable(graph)
    point = initial_inputs(model, terms)
    shapes = [x.shape for x in point]  # (the parameters', then the data's)
    graph = for_cpu_ranks(for_gpu_ranks(graph, shapes))
    graph = packed(graph, shapes[:len(terms.params)])
    fn = distributed(graph, terms.row_values, on=rows_on(ranks))
    # (Timed where a chain starts: PyTensor's Numba code branches on values.)
    trial = functools.partial(initial_inputs, model, terms, jitter=True)
    fn, graph = linker_chosen(fn, graph, trial, batch, n_rows if ranks == 1 else -(-n_rows // n))
    served, route = evaluator(fn, graph)
    where = placed(served, graph, terms, point, ranks)
    op = rows_logp(served, route, graph)
    op.pointwise = pointwise_terms(model, terms, graph)  # what synkhronos.pymc.loo builds on; stays here
    op.check_bounds = model.check_bounds  # for those graphs compiled per row
    logger.info("synkhronos.pymc: %s split over %d rank%s (%d rows, %s), evaluated %s", graph.names, n,
                "s" * (n > 1), n_rows, op.dtype, where)
    copy = with_op(model, terms, op)
    rows_follow_data(model, copy, terms, n_rows, graph, op.pointwise, served, rows_on(ranks))
    if source is not None:
        release(given)  # split again: the rows of the copy given go
    return copy


def _check_arguments(model, batch):
    import pymc as pm

    if not isinstance(model, pm.Model):
        raise TypeError("model must be a pymc.Model, got %r" % (model,))
    if batch is not None and not isinstance(batch, bool):
        raise TypeError("batch must be True, False or None, got %r" % (batch,))


def _forked_ranks():
    """The number of ranks, Synkhronos forked with its defaults first if it was
    not (the variables to split are checked before: a wrong argument forks
    nothing)."""
    with _FORKING:  # two threads' first data_parallel: one fork
        if runtime.current() is None:
            _api.fork()
    return _api.n_parallel()
