"""One callable training step: gradient on every rank, one all-reduce, update.

``make_train_step`` builds two Synkhronos functions from an update rule of
``synkhronos.extensions.updates``: one computes each rank's gradient into the
rule's flat shared vector, the other updates the parameters.  Between them the
step all-reduces the vector once.  Gradients are summed over rows and divided by
the total row count, so the step equals one single-process step on the whole
selected batch, also when the rows do not split evenly over the ranks.

The row count and the summed loss travel in a second small vector, all-reduced
with the gradient, so nothing in the step waits for the host: on GPU ranks the
gradient, the all-reduces and the update are queued back to back, and the loss
is read while the gradient's all-reduce and the update still run.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

from . import updates as _updates

__all__ = ["make_train_step", "TrainStep"]


class TrainStep:
    """A training step built by ``make_train_step``; call it like the gradient
    function (``step(x_data, y_data, batch=...)``).  Returns the mean loss."""

    def __init__(self, grad_fn, update_fn, grad_shared, stats):
        self.grad_fn = grad_fn
        self.update_fn = update_fn
        self.grad_shared = grad_shared
        self._stats = stats  # [sum of loss * rows, rows], all-reduced with the gradient

    def __call__(self, *args, batch=None, num_slices=1, **kwargs):
        """Run one step on the selected rows; see ``synkhronos.Function.__call__``."""
        self.grad_fn(*args, batch=batch, num_slices=num_slices, **kwargs)
        # The small vector first: the loss is then ready while the gradient's
        # all-reduce and the update still keep the GPUs busy.
        synk.all_reduce([self._stats, self.grad_shared], op="sum")
        stats = self._stats.get_value(borrow=True, return_internal_type=True)
        if synk.device_kind() != "gpu":  # (GPU ranks queue the update after this read)
            stats = np.array(stats)  # the update may reuse this memory
        self.update_fn()  # also clears the stats
        total, rows = np.asarray(stats)
        if rows == 0:
            raise ValueError("the step selected no rows on any rank")
        return np.asarray(total / rows, dtype=self._stats.dtype)


def make_train_step(inputs, loss, params, rule=_updates.sgd, bcast_inputs=None, sliceable_shareds=None,
                    function_kwargs=None, **rule_kwargs):
    """Build a data-parallel training step.  Call before ``synkhronos.distribute()``.

    Parameters
    ----------
    inputs : list of Variable
        Inputs scattered over the ranks (axis 0 is the example axis).
    loss : scalar Variable
        Mean loss over the rows of ``inputs``.
    params : list of SharedVariable
    rule : callable, optional
        An update rule of ``synkhronos.extensions.updates`` (default ``sgd``).
    bcast_inputs : list of Variable, optional
        Inputs used whole on every rank.
    sliceable_shareds : list of SharedVariable, optional
        Data held in shared variables on each rank (scattered once), selected
        with ``batch_s=`` when the step is called.  The first one gives the row
        count when ``inputs`` is empty.
    function_kwargs : dict, optional
        Passed to both ``synkhronos.function`` calls (``mode=...``).  Their
        names are ``name`` (default ``'train_step'``) plus ``' (gradient)'`` and
        ``' (update)'``, as status messages and errors call them.
    **rule_kwargs
        Passed to ``rule`` (``learning_rate=...``).

    Returns
    -------
    TrainStep

    Raises
    ------
    TypeError
        If there are neither ``inputs`` nor ``sliceable_shareds`` (no rows to split).
    """
    inputs = list(inputs)
    sliceable = list(sliceable_shareds or [])
    if not inputs and not sliceable:
        raise TypeError("make_train_step needs a scattered input or a sliceable shared variable, "
                        "got inputs=%r" % (inputs,))
    kwargs = dict(function_kwargs or {})
    name = kwargs.pop("name", None) or "train_step"
    fx = pytensor.config.floatX
    stats = pytensor.shared(np.zeros(2, dtype=fx), name="step_stats", shape=(2,))
    # At least 1: a step that selected no rows must not write NaN into the parameters.
    scale = 1 / pt.maximum(stats[1], 1)
    _, param_updates, grad_shared = rule(loss, params, grad_scale=scale, **rule_kwargs)
    rows = pt.cast((inputs or sliceable)[0].shape[0], fx)
    # Gradient and loss summed over rows (slices add up), so that ranks with more rows count more.
    summed = _updates.flat_gradient(loss, params) * rows
    grad_fn = synk.function(inputs, bcast_inputs=bcast_inputs, sliceable_shareds=sliceable or None,
                                 updates=[(grad_shared, summed, "sum"),
                                          (stats, pt.stack([pt.cast(loss, fx) * rows, rows]), "sum")],
                                 name=name + " (gradient)", **kwargs)
    # The update also clears what the gradient function wrote: a rank that gets no rows
    # in the next step skips that function, and must add zeros, not this step's sums.
    clear = [(grad_shared, pt.zeros_like(grad_shared)), (stats, pt.zeros_like(stats))]
    update_fn = synk.function([], updates=list(param_updates) + clear, name=name + " (update)", **kwargs)
    return TrainStep(grad_fn, update_fn, grad_shared, stats)
