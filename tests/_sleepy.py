"""A user Op that sleeps, for stall and fault tests: ``sleepy(x, seconds)`` is
``x``, but a rank whose share of ``x`` holds a negative value first sleeps
``seconds`` (so a test chooses the stuck ranks through the data it passes)."""

import time

import numpy as np
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

__all__ = ["sleepy"]


class Sleepy(Op):
    __props__ = ("seconds",)

    def __init__(self, seconds):
        self.seconds = float(seconds)

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        (x,) = inputs
        if np.any(x < 0):
            time.sleep(self.seconds)
        outputs[0][0] = np.array(x, copy=True)


def sleepy(x, seconds):
    return Sleepy(seconds)(x)
