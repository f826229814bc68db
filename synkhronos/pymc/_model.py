"""``data_parallel(model)``: a copy of a PyMC model whose row terms run on
every Synkhronos rank (see ``_terms`` for what is split, ``_op`` for the Op the
copy holds in their place)."""

import logging
import threading

import numpy as np

from .. import _api, _data, _function
from .. import _collectives as _coll
from .._common.env import env_flag
from .._common.selections import split_bounds
from .._session import runtime
from ._checks import parameter_checks, ranks_checks
from ._graphs import rewritten
from ._kernel import KERNEL_ENV, kernel_compiles, rows_kernel
from ._op import Evaluator, RowsLogp, register_backends
from ._packed import packed_graph
from ._potentials import row_potentials
from ._products import feature_sums
from ._softplus import with_one_exp_softplus
from ._terms import _continuous, check_rowwise, find_terms, gradient, row_count, rows_of, worker_graph

__all__ = ["data_parallel"]

_FORKING = threading.Lock()

logger = logging.getLogger("synkhronos")


def data_parallel(model, observed=None, rows=None, batch=None):
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
    copies taken now: after ``pm.set_data`` on them, call ``data_parallel``
    again.

    The copy may be evaluated from any thread, and from processes that PyMC
    forks or spawns for its chains: every evaluation runs on the ranks of this
    process's session (a child asks this process, which must stay alive and
    keep the session open meanwhile).  Evaluations asked for at the same time
    run one after another, or with ``batch`` in one pass.
    """
    import pymc as pm

    if not isinstance(model, pm.Model):
        raise TypeError("model must be a pymc.Model, got %r" % (model,))
    if batch is not None and not isinstance(batch, bool):
        raise TypeError("batch must be True, False or None, got %r" % (batch,))
    chosen = _observed(model, observed)
    n_rows = row_count(model, chosen) if rows is None else _check_rows(rows)
    if observed is None:
        chosen = [rv for rv in chosen if rows_of(model, rv) == n_rows]
    with _FORKING:  # two threads' first data_parallel: one fork
        if runtime.current() is None:
            _api.fork()
    n = _api.n_parallel()
    terms = find_terms(model, chosen, n_rows)
    check_rowwise(model, terms, split_bounds(n_rows, n))
    op = _distributed_op(terms, batch, model.check_bounds)
    logger.info("synkhronos.pymc: %s split over %d ranks (%d rows, %s)", terms.names(), n, n_rows, op.dtype)
    return _with_op(model, terms, op)


def _observed(model, observed):
    if observed is None:
        if model.observed_RVs:
            return list(model.observed_RVs)
        potentials = row_potentials(model)
        if potentials:
            return potentials
        raise ValueError("model has no observed variables, nor a potential that sums over rows of data: "
                         "nothing to split")
    if isinstance(observed, str) or not isinstance(observed, list | tuple):
        raise TypeError("observed must be a list of names or variables, got %r" % (observed,))
    out = []
    for v in observed:
        rv = model[v] if isinstance(v, str) and v in model.named_vars else v
        if rv not in model.observed_RVs and rv not in model.potentials:
            raise ValueError("observed: %r is not an observed variable or potential of the model (those are "
                             "%s)" % (v, [r.name for r in model.observed_RVs + model.potentials]))
        out.append(rv)
    return out


def _check_rows(rows):
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError("rows must be a positive int, got %r" % (rows,))
    return rows


def _jax_compiles(outputs):
    """Whether the ranks compile ``outputs`` with JAX: GPU ranks, and CPU ranks
    where JAX is Synkhronos' default linker, for a graph PyTensor's JAX backend
    converts (a batched pass pays only there: see the docs page "PyMC")."""
    from pytensor.graph.basic import Constant
    from pytensor.graph.fg import FunctionGraph
    from pytensor.graph.traversal import graph_inputs

    device = runtime.require().device
    if device.name != "gpu" and not device.jax_default:
        return False
    from pytensor.link.jax.dispatch import jax_funcify

    inputs = [v for v in graph_inputs(outputs) if not isinstance(v, Constant)]
    try:
        jax_funcify(FunctionGraph(inputs, outputs, clone=True))
    except NotImplementedError:
        return False
    return True


def _distributed_op(terms, batch, check_bounds):
    """Build, distribute and fill the Synkhronos function of ``terms``; the Op
    that calls it."""
    params, data, row_shareds, total, grads = worker_graph(terms)
    single = parameter_checks([total] + grads, check_bounds)
    if batch is None:
        batch = _jax_compiles(single)
    batched_params, outputs = (batch and _batched(params, single, total, check_bounds)) or (params, single)
    try:
        _check_sendable(terms, outputs)
    except ValueError:
        if batched_params is params:
            raise
        batched_params, outputs = params, single  # a part that pickles only unbatched
        _check_sendable(terms, outputs)
    batched = batched_params is not params
    if runtime.require().device.name == "gpu":
        outputs = _gpu_forms(outputs)  # (our own Ops and PyTensor's: they pickle)
        if batched and env_flag(KERNEL_ENV, True):
            outputs = _one_kernel(params, data, row_shareds, single, batched_params, outputs)
    inputs, packing = batched_params, None
    found = packed_graph(batched_params, outputs) if batched else None
    if found is not None:
        points, packed, packing = found
        inputs, outputs = [points], [packed]
    fn = _function.function([], [(o, "sum") for o in outputs], bcast_inputs=inputs + data,
                            name="pymc rows of %s" % terms.names())
    _distribute(fn, terms)
    _coll.scatter(row_shareds, terms.row_values)
    continuous = [_continuous(p) for p in params] + [False] * len(data)
    datas = [_data.data(np.zeros((1,) * v.ndim, dtype=v.dtype)) for v in inputs + data]
    evaluator = Evaluator(fn, datas, len(params), batched, packing)
    route = runtime.require().service.route(evaluator.serve, evaluator.linger)
    register_backends()
    return RowsLogp(evaluator, route, terms.names(), total.dtype, continuous)


def _one_kernel(params, data, row_shareds, single, stacked, batched):
    """``batched`` as one kernel over the rows (``_kernel``), where it compiles
    on this process's GPU; else ``batched``."""
    kernel = rows_kernel(params, data, row_shareds, with_one_exp_softplus(single), stacked, batched)
    return kernel if kernel_compiles(kernel[0].owner.op) else batched


def _distribute(fn, terms):
    """``distribute()``, raising ValueError if ``fn`` (the terms' function) could
    not be sent; if another function of the session could not, its calls raise."""
    try:
        _api.distribute()
    except TypeError as exc:
        if runtime.require().registry.refusal(fn._core.ID) is None:
            logger.warning("synkhronos.pymc: %s", exc)
            return
        raise ValueError("observed %s: its log-density graph cannot be sent to the ranks (%s); leave it "
                         "out of observed= to compute it in this process" % (terms.names(), exc)) from exc


def _batched(params, single, total, check_bounds):
    """``(inputs, outputs)`` of the terms evaluated at several points at once:
    each parameter gains a leading axis of points, and each output one value
    (or gradient) per point, so that a rank reads its rows once for all points.
    None where PyTensor cannot vectorize the graph.

    ``single`` (the log-density and its gradient at one point, checks
    compiled) vectorized, where that needs no more than products made matrix
    products (a GLM's); otherwise ``total`` (the log-density, checks not
    compiled) vectorized and differentiated, which batches more graphs (varying
    slopes, say) but gives 0, not PyMC's value, for the gradient at a point out of
    a parameter's domain, and ran slower on a GPU (docs page "PyMC")."""
    import pytensor.tensor as pt
    from pytensor.graph.replace import vectorize_graph

    stacked = [pt.tensor(dtype=p.dtype, shape=(None,) + p.type.shape, name=p.name) for p in params]
    replace = dict(zip(params, stacked))
    try:
        outputs = vectorize_graph(single, replace=replace)
        if _looped(outputs):
            outputs = _core_products(outputs)
        if _looped(outputs):
            outputs = _differentiated(vectorize_graph(total, replace=replace), params, stacked, check_bounds)
    except Exception as exc:
        why = "%s: %s" % (type(exc).__name__, exc)
    else:
        looped = _looped(outputs)
        if not looped:
            return stacked, ranks_checks(outputs)
        why = "no batched form of %s" % ", ".join(looped)
    logger.info("synkhronos.pymc: one point at a time on the ranks (%s)", why)
    return None


def _gpu_forms(outputs):
    """``outputs`` as GPU ranks compute them fastest: products with a few
    features written out (``_products``), softplus with one exponential
    (``_softplus``).  The same values; XLA fuses these forms into fewer passes
    over the rows."""
    return with_one_exp_softplus(feature_sums(outputs))


def _differentiated(batched, params, stacked, check_bounds):
    """The batched log-density ``batched`` with its gradient with respect to the
    continuous ``stacked`` (the batched ``params``), checks compiled."""
    from pytensor.graph.rewriting.utils import rewrite_graph

    grads = gradient(batched, [s for s, p in zip(stacked, params) if _continuous(p)])
    outputs = parameter_checks([batched] + grads, check_bounds)
    if _looped(outputs):  # (canonicalize ran for minutes on the first way's Gamma GLM, 0.2 s here)
        outputs = list(rewrite_graph(outputs, include=("canonicalize",)))
    return outputs


def _core_products(outputs):
    """``outputs`` with each product of one batched side made one matrix product
    (and Blockwise with no batched input plain), by those rewrites alone: the
    ranks' compiling rewrites the rest.  PyTensor's whole canonicalize,
    stabilize and specialize here turned a Normal's gradient into a graph that
    asserts one row per rank, and ran for minutes on a Gamma GLM's."""
    from pytensor.tensor.rewriting.blockwise import (
        local_eager_useless_unbatched_blockwise,
        local_useless_unbatched_blockwise,
    )
    from pytensor.tensor.rewriting.math import local_batched_matmul_to_core_matmul

    return rewritten(outputs, local_batched_matmul_to_core_matmul, local_useless_unbatched_blockwise,
                     local_eager_useless_unbatched_blockwise)


def _looped(outputs):
    """The Ops of ``outputs`` left with no rule for a leading axis: each stays a
    Blockwise, which loops over the points one by one (no faster than one point
    a call)."""
    from pytensor.graph.traversal import apply_ancestors
    from pytensor.tensor.blockwise import Blockwise

    return sorted({str(n.op.core_op) for n in apply_ancestors(outputs) if isinstance(n.op, Blockwise)})


def _check_sendable(terms, outputs):
    """Raise ValueError, before any function is registered, if the ranks' graph
    cannot be pickled to the workers, by pickle or cloudpickle (an Op holding a
    lock, say; the lambdas of PyMC's measurable transforms go by cloudpickle)."""
    from .._wire.pickling import dumps_cores

    try:
        dumps_cores(outputs)
    except Exception as exc:
        raise ValueError(
            "observed %s: its log-density graph cannot be sent to the ranks (pickle and cloudpickle: "
            "%s: %s); leave it out of observed= to compute it in this process"
            % (terms.names(), type(exc).__name__, exc)) from exc


def _potential(model_potential, value, name):
    """PyMC's graph of a potential named ``name``: PyMC 6 takes the name as an
    argument, PyMC 5's ``model_potential`` is an Op and takes it from the output."""
    from pytensor.graph.op import Op

    if isinstance(model_potential, Op):
        potential = model_potential(value)
        potential.name = name
        return potential
    return model_potential(value, name)


def _with_op(model, terms, op):
    """A copy of ``model`` with ``terms``' observed variables replaced by one
    potential, ``op`` of their parameters and data."""
    from pymc.model.fgraph import fgraph_from_model, model_from_fgraph, model_potential
    from pytensor.graph.fg import FunctionGraph

    fgraph, memo = fgraph_from_model(model)
    dropped = {memo[rv] for rv in terms.observed}
    for var in dropped:
        if len(var.owner.inputs) < 2:  # a potential: nothing reads it
            continue
        # Other variables (the whole of a variable with imputed values, say)
        # read its observed value, as they do in PyMC's own log-density.
        value = var.owner.inputs[1]
        for node, i in list(fgraph.clients[var]):
            if node != "output" and getattr(node, "op", None).__class__.__name__ != "Output":
                fgraph.change_node_input(node, i, value, reason="synkhronos.pymc")
    inputs = [memo.get(v, v) for v in terms.params + terms.data]
    potential = _potential(model_potential, op(*inputs)[0], "synkhronos_rows")
    outputs = [o for o in fgraph.outputs if o not in dropped] + [potential]
    new = FunctionGraph(outputs=outputs, clone=False)
    new._coords = fgraph._coords
    new._dim_lengths = fgraph._dim_lengths
    copy = model_from_fgraph(new, mutate_fgraph=True)
    # The original's order of free variables, so that compile_dlogp() and
    # initial_point() list them as the original does.
    order = {rv.name: i for i, rv in enumerate(model.free_RVs)}
    copy.free_RVs.sort(key=lambda rv: order[rv.name])
    return copy
