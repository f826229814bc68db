"""The Op that stands for a model's split terms: one Synkhronos call returns
their summed log-density and its gradient, so PyMC's logp-and-gradient function
(whose two uses of the Op PyTensor merges into one node) costs one round trip.

Who evaluates it, and how:

- in the session's process, from any thread: through ``Evaluator``, whose
  ``Batcher`` evaluates every point pending at once in one call of the ranks;
- in a child process (a chain PyMC forked, or one that received a pickled copy
  under ``spawn``/``forkserver``): by asking the session's process through its
  service (``synkhronos._session.child_service``), where the same ``Evaluator`` runs it.
"""

import os
import warnings

import numpy as np
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from .._session import child_service, runtime
from ._batch import LINGER, Batcher

__all__ = ["RowsLogp", "Evaluator"]


class Evaluator:
    """The session's side of one model's split terms.

    ``fn`` is the Synkhronos function of the terms (parameters and data
    broadcast, each rank summing its rows); with ``batched`` its parameters carry
    a leading axis of points and it returns one log-density (and gradient) per
    point, else it takes one point.  ``datas``: the ``synkhronos.Data`` each
    input is broadcast from, written in place under the session's lock."""

    def __init__(self, fn, datas, n_params, batched, packing=None):
        self.fn = fn
        self.datas = datas
        self.n_params = n_params
        self.batched = batched
        self.packing = packing  # a batched call's one matrix in and out (``_packed``), or None
        self.linger = LINGER if batched else 0.0
        self.batcher = Batcher(self._run, linger=self.linger)
        self.rt = fn._rt

    def evaluate(self, inputs):
        """``[logp, *grads]`` at ``inputs`` (the Op's inputs, as arrays)."""
        return self.batcher.evaluate([np.asarray(x) for x in inputs])

    def serve(self, requests):
        """``evaluate`` for the session's service: each request holds one child's
        inputs; all are evaluated in one run."""
        return self.batcher.evaluate_many([[np.asarray(x) for x in inputs] for (inputs,) in requests])

    def _run(self, points):
        with runtime.locked():  # the Data are written, then read by the call, as one step
            if not self.batched:
                return [self._call(p) for p in points]
            results = []
            for group in _same_data(points, self.n_params):
                results += zip(group.keys, self._call_batched(group))
            return [r for _, r in sorted(results, key=lambda kr: kr[0])]

    def _call_batched(self, group):
        """Each point's results, the points of ``group`` in one call."""
        data = group[0][self.n_params:]
        if self.packing is not None:
            (packed,) = self._call([self.packing.points(group, self.n_params)] + data)
            return self.packing.results(packed)
        outs = self._call([np.stack([p[i] for p in group]) for i in range(self.n_params)] + data)
        return [[o[j] for o in outs] for j in range(len(group))]

    def _call(self, values):
        for d, x in zip(self.datas, values):
            if d.shape == x.shape:
                d.data[...] = x
            else:
                d.set_value(x, oversize=2)  # room for more points without reallocating
        results = self.fn(*self.datas)
        return results if isinstance(results, list) else [results]


class _Group(list):
    """Points of one call, with their places among all points."""

    def __init__(self):
        super().__init__()
        self.keys = []


def _same_data(points, n_params):
    """The points grouped by their data inputs (after the first ``n_params``
    inputs), which one call broadcasts once for all its points."""
    groups = []
    for k, p in enumerate(points):
        for g in groups:
            if all(np.array_equal(a, b) for a, b in zip(g[0][n_params:], p[n_params:])):
                break
        else:
            g = _Group()
            groups.append(g)
        g.append(p)
        g.keys.append(k)
    return groups


class RowsLogp(Op):
    """``RowsLogp(evaluator, route, names, ...)(*params, *data)`` -> (log-density,
    gradient for each continuous parameter).

    ``evaluator`` runs it in the session's process; ``route`` reaches that
    process's service from a child; ``names`` label it in errors."""

    def __init__(self, evaluator, route, names, dtype, continuous):
        self.evaluator = evaluator
        self.route = route
        self.names = names
        self.dtype = dtype
        self.continuous = tuple(continuous)  # per input: whether a gradient comes back

    def make_node(self, *inputs):
        import pytensor.tensor as pt

        inputs = [pt.as_tensor_variable(x) for x in inputs]
        if len(inputs) != len(self.continuous):
            raise TypeError("RowsLogp for %s takes %d inputs, got %d"
                            % (self.names, len(self.continuous), len(inputs)))
        outputs = [pt.scalar(dtype=self.dtype)]
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

        if any(not isinstance(g.type, DisconnectedType) for g in output_grads[1:]):
            return [grad_not_implemented(self, i, x, "second derivatives of data-parallel terms")
                    for i, x in enumerate(inputs)]
        g = output_grads[0]
        grads, k = [], 1
        for i, (x, c) in enumerate(zip(inputs, self.continuous)):
            if c:
                grads.append(g * outputs[k])
                k += 1
            else:
                grads.append(grad_not_implemented(self, i, x, "data and discrete variables have no "
                                                             "gradient here"))
        return grads

    def __str__(self):
        return "RowsLogp{%s}" % self.names

    def __reduce__(self):
        # A copy for another process (PyMC pickles its chains' step method under
        # spawn and forkserver): it evaluates through the session's service.
        return RowsLogp, (None, self.route, self.names, self.dtype, self.continuous)


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

    try:
        from pytensor.link.numba.dispatch.basic import generate_fallback_impl, numba_funcify
    except ImportError:  # no Numba
        return

    @numba_funcify.register(RowsLogp)
    def _object_mode(op, node, storage_map=None, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Numba will use object mode", UserWarning)
            return generate_fallback_impl(op, node, storage_map, **kwargs)
