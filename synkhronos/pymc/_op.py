"""The Op that stands for a model's split terms (the pipeline's thirteenth stage):
one Synkhronos call returns each term's log-density summed over the rows and
its gradient, so PyMC's logp-and-gradient function (whose uses of the Op
PyTensor merges into one node) costs one round trip.

Who evaluates it, and how:

- in the session's process, from any thread: through ``Evaluator``
  (``_evaluator``), whose ``Batcher`` evaluates every point pending at once in
  one call of the ranks;
- in a child process (a chain PyMC forked, or one that received a pickled copy
  under ``spawn``/``forkserver``): by asking the session's process through its
  service (``synkhronos._session.child_service``), where the same ``Evaluator`` runs it.
"""

import os

import numpy as np
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from .._session import child_service, runtime
from ._observed import numba_object_mode

__all__ = ["RowsLogp", "register_backends", "rows_logp"]


def rows_logp(evaluator, route, graph):
    """The ``RowsLogp`` of ``graph`` (a ``RanksGraph``), run by ``evaluator`` in
    this process and through ``route`` from its children; PyTensor's backends
    told how to take it."""
    register_backends()
    continuous = list(graph.continuous) + [False] * len(graph.data)  # data have no gradient
    return RowsLogp(evaluator, route, graph.names, graph.totals[0].dtype, continuous, len(graph.totals))


class RowsLogp(Op):
    """``RowsLogp(evaluator, route, names, ...)(*params, *data)`` -> (each
    term's log-density, then each term's gradient: one entry for each
    continuous parameter), as ``_ranks`` orders them; one term: (log-density,
    gradient).

    ``evaluator`` runs it in the session's process; ``route`` reaches that
    process's service from a child; ``names`` label it in errors."""

    pointwise = None  # the terms per row (``_pointwise``), for ``loo``; set in the session's process only
    check_bounds = True  # the model's, for the function per row (``_observed``)
    per_row = None  # that function, made at its first use

    def __init__(self, evaluator, route, names, dtype, continuous, n_terms=1):
        self.evaluator = evaluator
        self.route = route
        self.names = names
        self.dtype = dtype
        self.continuous = tuple(continuous)  # per input: whether a gradient comes back
        self.n_terms = n_terms

    def gradient_of(self, outputs, term, i):
        """Among a node's ``outputs``, term ``term``'s gradient for input ``i``
        (a continuous one)."""
        k = sum(self.continuous[:i])
        return outputs[self.n_terms + term * sum(self.continuous) + k]

    def make_node(self, *inputs):
        import pytensor.tensor as pt

        inputs = [pt.as_tensor_variable(x) for x in inputs]
        if len(inputs) != len(self.continuous):
            raise TypeError("RowsLogp for %s takes %d inputs, got %d"
                            % (self.names, len(self.continuous), len(inputs)))
        outputs = [pt.scalar(dtype=self.dtype) for _ in range(self.n_terms)]
        for _ in range(self.n_terms):
            outputs += [x.type() for x, c in zip(inputs, self.continuous) if c]
        return Apply(self, inputs, outputs)

    def perform(self, node, inputs, output_storage):
        results = self._evaluate(inputs)
        for store, value, out in zip(output_storage, results, node.outputs):
            store[0] = np.asarray(value, dtype=out.dtype)

    def _evaluate(self, inputs):
        ev = self.evaluator
        if ev is not None and not ev.rt.foreign and os.getpid() == self.route.owner:
            if runtime.current() is not ev.rt:
                raise RuntimeError("the Synkhronos session that computes the data-parallel terms of %s was "
                                   "closed: call synkhronos.pymc.data_parallel(model) again" % self.names)
            return ev.evaluate(inputs)
        return child_service.call(self.route, [np.asarray(x) for x in inputs])

    def L_op(self, inputs, outputs, output_grads):
        # PyTensor 2.x (PyMC 5) asks L_op; PyTensor 3.3 asks pullback and deprecates L_op.
        return self.pullback(inputs, outputs, output_grads)

    def pullback(self, inputs, outputs, output_grads):
        from pytensor.gradient import DisconnectedType, grad_not_implemented

        if any(not isinstance(g.type, DisconnectedType) for g in output_grads[self.n_terms:]):
            return [grad_not_implemented(self, i, x, "second derivatives of data-parallel terms")
                    for i, x in enumerate(inputs)]
        weights = [(t, g) for t, g in enumerate(output_grads[:self.n_terms])
                   if not isinstance(g.type, DisconnectedType)]
        return self.weighted_gradient(inputs, outputs, weights)

    def weighted_gradient(self, inputs, outputs, weights):
        """For each of ``inputs``, the sum over ``weights`` (``(term, scalar
        weight)`` pairs) of the weight times that term's gradient, from this
        Op's ``outputs``; data and discrete inputs have none."""
        import pytensor.tensor as pt
        from pytensor.gradient import grad_not_implemented

        grads = []
        for i, (x, c) in enumerate(zip(inputs, self.continuous)):
            if c:
                parts = [w * self.gradient_of(outputs, t, i) for t, w in weights]
                grads.append(pt.add(*parts).astype(x.dtype) if parts else pt.zeros_like(x))
            else:
                grads.append(grad_not_implemented(self, i, x, "data and discrete variables have no "
                                                             "gradient here"))
        return grads

    def __str__(self):
        return "RowsLogp{%s}" % self.names

    def __reduce__(self):
        # A copy for another process (PyMC pickles its chains' step method under
        # spawn and forkserver): it evaluates through the session's service.
        return RowsLogp, (None, self.route, self.names, self.dtype, self.continuous, self.n_terms)


_JAX_REFUSAL = (
    "%s: the data-parallel terms of a synkhronos.pymc.data_parallel model run on the Synkhronos ranks "
    "through this process, which JAX-based samplers (pm.sample(nuts_sampler='numpyro' or 'blackjax'), "
    "nutpie.compile_pymc_model(backend='jax'), jax.jit of the model's log-density) cannot call from "
    "compiled code. Sample the copy with PyMC's own NUTS (pm.sample(), any cores and mp_ctx: every chain "
    "runs on the ranks) or with nutpie's default backend (nuts_sampler='nutpie', or "
    "nutpie.compile_pymc_model(model)); for numpyro or blackjax, sample the original model")


def register_backends():
    """Make PyTensor's JAX backend refuse ``RowsLogp`` with the way forward
    (instead of 'No JAX conversion for the given Op'), and its Numba backend
    (PyTensor 3's default) call it from Numba's object mode without warning
    that it does: a call out to the ranks is what this Op is for."""
    from pytensor.link.jax.dispatch import jax_funcify

    if RowsLogp in jax_funcify.registry:
        return

    @jax_funcify.register(RowsLogp)
    def _refused(op, **kwargs):
        raise NotImplementedError(_JAX_REFUSAL % op)

    numba_object_mode(RowsLogp)
