"""One callable training step: gradient on every rank, one all-reduce, update.

``make_train_step`` builds two Synkhronos functions from an update rule of
``synkhronos.extensions.updates``: one computes each rank's gradient into the
rule's flat shared vector, the other updates the parameters.  Between them the
step all-reduces the vector once.  Gradients are summed over rows and divided by
the total row count, so the step equals one single-process step on the whole
selected batch, also when the rows do not split evenly over the ranks.
"""

import numpy as np
import pytensor
import pytensor.tensor as pt

from .. import _collectives, _function
from .._data import data
from . import updates as _updates

__all__ = ["make_train_step", "TrainStep"]


class TrainStep:
    """A training step built by ``make_train_step``; call it like the gradient
    function (``step(x_data, y_data, batch=...)``).  Returns the mean loss."""

    def __init__(self, grad_fn, update_fn, grad_shared, scale):
        self.grad_fn = grad_fn
        self.update_fn = update_fn
        self.grad_shared = grad_shared
        self._scale = scale

    def __call__(self, *args, batch=None, num_slices=1, **kwargs):
        """Run one step on the selected rows; see ``synkhronos.Function.__call__``."""
        loss, rows = self.grad_fn(*args, batch=batch, num_slices=num_slices, **kwargs)
        _collectives.all_reduce(self.grad_shared, op="sum")
        self._scale.set_value(np.asarray(1.0 / float(rows), dtype=self._scale.dtype))
        self.update_fn(self._scale)
        return loss


def make_train_step(inputs, loss, params, rule=_updates.sgd, bcast_inputs=None, sliceable_shareds=None,
                    **rule_kwargs):
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
    fx = pytensor.config.floatX
    scale = pt.scalar("grad_scale", dtype=fx)
    _, param_updates, grad_shared = rule(loss, params, grad_scale=scale, **rule_kwargs)
    rows = pt.cast((inputs or sliceable)[0].shape[0], fx)
    # Gradient of the summed loss (slices add up), so that ranks with more rows count more.
    summed = _updates.flat_gradient(loss, params) * rows
    grad_fn = _function.function(inputs, outputs=[loss, (rows, "sum")], bcast_inputs=bcast_inputs,
                                 updates=[(grad_shared, summed, "sum")], sliceable_shareds=sliceable or None)
    update_fn = _function.function([], bcast_inputs=[scale], updates=param_updates)
    return TrainStep(grad_fn, update_fn, grad_shared, data(np.asarray(0, dtype=fx)))
