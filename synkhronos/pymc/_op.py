"""The Op that stands for a model's split terms: one Synkhronos call returns
their summed log-density and its gradient, so PyMC's logp-and-gradient function
(whose two uses of the Op PyTensor merges into one node) costs one round trip."""

import logging
import os
import pickle

import numpy as np
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from .. import _runtime

__all__ = ["RowsLogp"]

logger = logging.getLogger("synkhronos")


class RowsLogp(Op):
    """``RowsLogp(fn, names)(*params, *data)`` -> (log-density, gradient for each
    continuous parameter).

    ``fn`` is the Synkhronos function of the split terms (parameters and data
    broadcast, each rank summing its rows); ``names`` label it in errors."""

    def __init__(self, fn, names, dtype, continuous, datas, whole):
        self.fn = fn
        self.names = names
        self.dtype = dtype
        self.continuous = tuple(continuous)  # per input: whether a gradient comes back
        self.datas = datas  # per input, the synkhronos.Data it is broadcast from (written in place)
        self.whole = whole  # makes a plain function of all rows, for other processes
        self._whole_fn = None

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
        rt = _runtime.current()
        if rt is None or rt.foreign:
            results = self._in_another_process(inputs)
        else:
            for d, x in zip(self.datas, inputs):
                if d.shape == x.shape:
                    d.data[...] = x
                else:
                    d.set_value(x)
            results = self.fn(*self.datas)
        if len(node.outputs) == 1:  # no continuous parameter: the function has one output
            results = [results]
        for store, value, out in zip(output_storage, results, node.outputs):
            store[0] = np.asarray(value, dtype=out.dtype)

    def _in_another_process(self, inputs):
        """All rows computed here: a process PyMC forked for a chain cannot call
        the session's ranks (``pm.sample(cores=1)`` runs the chains where it can)."""
        if self._whole_fn is None:
            logger.warning("synkhronos.pymc: %s computed without the Synkhronos ranks in process %d "
                           "(a chain PyMC started in a process of its own); pm.sample(..., cores=1) "
                           "runs every chain on the ranks", self.names, os.getpid())
            self._whole_fn = self.whole()
        return self._whole_fn(*inputs)

    def L_op(self, inputs, outputs, output_grads):
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
        # PyMC falls back to sampling its chains in this process when the model
        # does not pickle, which is where the Synkhronos session lives.
        raise pickle.PicklingError(
            "the data-parallel terms of %s run through this process's Synkhronos session and "
            "cannot be sent to another process" % self.names)
