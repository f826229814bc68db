"""A copy's split observed variables as PyMC sees them: still observed
variables, drawn with the original's graph, their log-densities computed on the
ranks.

Each split observed variable of the copy stays one, named and with its dims
as in the original, so that PyMC's functions that read observed variables work
on the copy:

- ``SplitObserved(rows_op, term)(value, *inputs, rv)`` stands where PyMC
  expects the variable's random variable: forward it is ``rv`` itself (the
  original's graph in this process), so ``pm.sample_prior_predictive`` and
  ``pm.sample_posterior_predictive`` draw it as they draw it on the original,
  the same numbers under the same seed; its log-density (PyMC's ``_logprob``)
  is output ``term`` of ``RowsPointwise``;
- ``RowsPointwise(rows_op)(*inputs)``: every split term's log-density per row,
  each rank computing its own rows and this process gathering them, which is
  what ``pm.compute_log_likelihood`` reads.  Summed, as every log-density of
  the model is (``model.logp()``), a rewrite (``sum_of_rows``, in every mode)
  makes each term's sum the copy's ``RowsLogp``'s: one call of the ranks that
  returns every term's sum and gradient, as the copy's potential did; its
  gradient under a sum (one weight for every row of a term) is the
  ``RowsLogp``'s too, term by term.

``inputs`` are the ``RowsLogp``'s (free variables and data without rows);
``rows_op`` is the copy's ``RowsLogp``, whose ``pointwise`` graphs
(``_pointwise``) the ranks compile for the values per row.
"""

import threading
import warnings

import numpy as np
from pymc.logprob.abstract import MeasurableOp, _logprob
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from .. import _api, _data, _function
from .._session import runtime
from ._gradient import parameter_checks

__all__ = ["RowsPointwise", "SplitObserved", "numba_object_mode", "register_observed", "split_observed"]

_BUILDING = threading.Lock()  # two threads' first per-row call: one function
_REGISTERED = []


def split_observed(rows_op, term, rv, value, inputs):
    """The variable that stands for split observed variable ``rv`` (observed
    ``value``), the ``term``-th split term of a copy whose ``RowsLogp`` is
    ``rows_op`` of ``inputs``."""
    register_observed()
    out = SplitObserved(rows_op, term)(value, *inputs, rv)
    out.name = rv.name
    return out


class SplitObserved(MeasurableOp, Op):
    """``rv`` forward; the log-density of its rows, on the ranks (output
    ``term`` of ``RowsPointwise``).

    ``rv`` comes last: PyMC seeds the generators of a forward draw in the
    order a right-first walk of the graph finds them, which then finds those
    of ``rv``'s graph in the original's order, and the draws are the
    original's under one seed."""

    __props__ = ("rows_op", "term")

    def __init__(self, rows_op, term=0):
        self.rows_op = rows_op
        self.term = term
        self.view_map = {0: [1 + len(rows_op.continuous)]}

    def make_node(self, value, *inputs):
        import pytensor.tensor as pt

        *inputs, rv = [pt.as_tensor_variable(x) for x in (value,) + inputs]
        return Apply(self, inputs + [rv], [rv.type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = inputs[-1]

    def __str__(self):
        return "SplitObserved{%s, %d}" % (self.rows_op.names, self.term)


class RowsPointwise(Op):
    """Each split term's log-density, one value per row, gathered from the ranks."""

    __props__ = ("rows_op",)

    def __init__(self, rows_op):
        self.rows_op = rows_op

    def make_node(self, *inputs):
        import pytensor.tensor as pt

        terms = self.rows_op.pointwise
        logps = terms.logps if terms is not None else [None] * self.rows_op.n_terms
        outputs = [pt.TensorType(self.rows_op.dtype if lp is None else lp.dtype,
                                 shape=(None,) * (1 if lp is None else lp.ndim))() for lp in logps]
        return Apply(self, [pt.as_tensor_variable(x) for x in inputs], outputs)

    def perform(self, node, inputs, output_storage):
        for store, values, out in zip(output_storage, _per_row(self.rows_op, inputs), node.outputs):
            store[0] = np.asarray(values, dtype=out.dtype)

    def L_op(self, inputs, outputs, output_grads):
        # PyTensor 2.x (PyMC 5) asks L_op; PyTensor 3.3 asks pullback.
        return self.pullback(inputs, outputs, output_grads)

    def pullback(self, inputs, outputs, output_grads):
        """Under a sum of each term (the same weight ``c`` on every row of a
        term, as in the model's log-density): the sum of each ``c`` times that
        term's gradient, from the ``RowsLogp``."""
        from pytensor.gradient import DisconnectedType, grad_not_implemented

        weights = [(t, _one_weight(g)) for t, g in enumerate(output_grads)
                   if not isinstance(g.type, DisconnectedType)]
        if any(c is None for _, c in weights):
            return [grad_not_implemented(self, i, x, "a gradient of the rows' log-densities weighted row by "
                                                      "row (only their sum has one)")
                    for i, x in enumerate(inputs)]
        node = self.rows_op.make_node(*inputs)
        return self.rows_op.weighted_gradient(inputs, node.outputs, weights)

    def __str__(self):
        return "RowsPointwise{%s}" % self.rows_op.names


def _one_weight(g):
    """The scalar ``c`` if cotangent ``g`` is ``c`` on every row (what the
    gradient of a sum gives: ``second(x, c)``, or ``c`` broadcast), else None."""
    from pytensor.scalar.basic import Second
    from pytensor.tensor.basic import Alloc
    from pytensor.tensor.elemwise import Elemwise

    if all(g.type.broadcastable):
        return g.dimshuffle()
    node = g.owner
    if node is None:
        return None
    if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, Second):
        c = node.inputs[1]
    elif isinstance(node.op, Alloc):
        c = node.inputs[0]
    else:
        return None
    return c.dimshuffle() if all(c.type.broadcastable) else None


def _per_row(rows_op, inputs):
    """Each term's rows' log-densities at ``inputs``: each rank computes its
    own, in the order of the rows."""
    ev = rows_op.evaluator
    if rows_op.pointwise is None or ev is None or ev.rt.foreign:
        raise RuntimeError("the log-density per row of %s is computed in the process that called "
                           "data_parallel (pm.compute_log_likelihood there, or with the original model)"
                           % rows_op.names)
    if runtime.current() is not ev.rt:
        raise RuntimeError("the Synkhronos session that holds the rows of %s was closed: call "
                           "synkhronos.pymc.data_parallel(model) again" % rows_op.names)
    ev.rows_current()
    fn, datas = _function_of(rows_op)
    with runtime.locked():  # the Data are written, then read by the call, as one step
        for d, x in zip(datas, inputs):
            x = np.asarray(x, dtype=d.dtype)
            if d.shape == x.shape:
                d.data[...] = x
            else:
                d.set_value(x)
        per_term = fn(*datas)  # outputs not reduced: one array per rank each
    return [np.concatenate([np.asarray(p) for p in per_rank]) for per_rank in per_term]


def _function_of(rows_op):
    """``(fn, datas)``: the Synkhronos function of the split terms per row
    (made and sent to the ranks at its first use, on the rows they already
    hold) and a ``synkhronos.Data`` to broadcast each input from."""
    with _BUILDING:
        if rows_op.per_row is None:
            from pytensor.graph.replace import clone_replace

            terms = rows_op.pointwise
            logps = parameter_checks(clone_replace(list(terms.logps)), rows_op.check_bounds)
            inputs = terms.params + terms.data
            fn = _function.function([], [(lp, None) for lp in logps], bcast_inputs=inputs,
                                    name="pymc rows of %s, per row" % (terms.names,))
            _api.distribute()
            datas = [_data.data(np.zeros((1,) * v.ndim, dtype=v.dtype)) for v in inputs]
            rows_op.per_row = (fn, datas)
    return rows_op.per_row


def sum_of_rows(fgraph, node):
    """``sum(RowsPointwise(*inputs)[t])`` -> ``RowsLogp(*inputs)[t]``: the
    ranks sum their own rows."""
    from pytensor.tensor.math import Sum

    if not isinstance(node.op, Sum):
        return None
    (x,) = node.inputs
    if x.owner is None or not isinstance(x.owner.op, RowsPointwise):
        return None
    if node.op.axis is not None and sorted(node.op.axis) != list(range(x.ndim)):
        return None
    term = x.owner.outputs.index(x)
    total = x.owner.op.rows_op.make_node(*x.owner.inputs).outputs[term]
    return [total.astype(node.outputs[0].dtype)]


_JAX_REFUSAL = ("%s: the log-density of a split observed variable is computed on the Synkhronos ranks "
                "through this process, which JAX-compiled code cannot call; use PyMC's own NUTS, nutpie's "
                "default backend, or the original model")


def register_observed():
    """Once: PyMC's log-density of ``SplitObserved``, the rewrite of a sum of
    ``RowsPointwise`` in every compiling mode, and PyTensor's JAX and Numba
    backends told how to take both Ops."""
    if _REGISTERED:
        return
    _REGISTERED.append(True)

    @_logprob.register(SplitObserved)
    def _rows_logp(op, values, value, *inputs, **kwargs):
        return RowsPointwise(op.rows_op).make_node(*inputs[:-1]).outputs[op.term]

    from pytensor.compile import optdb
    from pytensor.graph.rewriting.basic import in2out, node_rewriter
    from pytensor.tensor.math import Sum

    optdb.register("synkhronos_sum_of_rows", in2out(node_rewriter([Sum])(sum_of_rows)), "fast_run",
                   "fast_compile", position=0.5)
    _register_backends()


def _register_backends():
    from pytensor.link.jax.dispatch import jax_funcify

    @jax_funcify.register(SplitObserved)
    def _forward(op, **kwargs):
        def split_observed(*inputs):
            return inputs[-1]

        return split_observed

    @jax_funcify.register(RowsPointwise)
    def _refused(op, **kwargs):
        raise NotImplementedError(_JAX_REFUSAL % op)

    numba_object_mode(SplitObserved, RowsPointwise)


def numba_object_mode(*op_classes):
    """Make PyTensor's Numba backend (PyTensor 3's default) run ``op_classes``
    in Numba's object mode without warning that it does: calling out of
    compiled code is what these Ops are for.  Nothing without Numba."""
    try:
        from pytensor.link.numba.dispatch.basic import generate_fallback_impl, numba_funcify
    except ImportError:  # no Numba
        return

    def object_mode(op, node, storage_map=None, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Numba will use object mode", UserWarning)
            return generate_fallback_impl(op, node, storage_map, **kwargs)

    for cls in op_classes:
        numba_funcify.register(cls)(object_mode)
