"""The graph every rank runs on its share of the rows (the pipeline's fourth
stage): the terms' summed log-density at one point and its gradient, PyMC's
parameter checks compiled in.

``RanksGraph`` holds it; each later stage returns a new one with its own form
of ``inputs`` and ``outputs`` (several points at once, GPU forms, packed),
which the ranks compute and sum, rank by rank.
"""

import dataclasses

import numpy as np

from .._graph.editing import continuous
from .._graph.editing import replaced as _replaced
from ._gradient import gradient, parameter_checks

__all__ = ["RanksGraph", "ranks_graph", "worker_graph"]


@dataclasses.dataclass(frozen=True, eq=False)  # a graph compares by identity
class RanksGraph:
    """The ranks' graph of the terms ``names``.

    ``params``, ``data`` and ``rows``: the inputs of one point (a parameter
    each, the data broadcast with them, the shared variables of a rank's rows,
    empty until scattered); ``continuous``: whether each parameter has a
    gradient.  ``total``: the log-density at one point, checks not compiled;
    ``single``: ``[total, *gradient]``, checks compiled.  ``inputs`` and
    ``outputs``: what the ranks compute from ``inputs + data`` (at first
    ``params`` and ``single``); ``batched``: whether each input holds a leading
    axis of points; ``packing``: a batched graph's one matrix in and out
    (``_packed``), or None."""

    names: str
    params: list
    data: list
    rows: list
    continuous: tuple
    total: object
    single: list
    inputs: list
    outputs: list
    batched: bool = False
    packing: object = None


def ranks_graph(terms, check_bounds):
    """The ``RanksGraph`` of ``terms``, PyMC's parameter checks compiled as
    ``check_bounds`` (a model's) asks."""
    params, data, rows, total, grads = worker_graph(terms)
    single = parameter_checks([total] + grads, check_bounds)
    return RanksGraph(names=terms.names(), params=params, data=data, rows=rows,
                      continuous=tuple(continuous(p) for p in params), total=total, single=single,
                      inputs=params, outputs=single)


def worker_graph(terms):
    """(param inputs, data inputs, row shared variables, total log-density,
    its gradient for each continuous parameter): the graph every rank runs on
    its rows (their shared variables empty until scattered)."""
    import pytensor
    import pytensor.tensor as pt

    params = [v.type(name=v.name) for v in terms.params]
    data = [v.type(name=v.name) for v in terms.data]
    row_shareds = [
        pytensor.shared(np.zeros((0,) + val.shape[1:], dtype=val.dtype), borrow=True,
                        name="rows:%s" % (v.name or "data"), shape=(None,) + val.shape[1:])
        for v, val in zip(terms.row_vars, terms.row_values)
    ]
    replace = dict(zip(terms.held + terms.data + terms.row_vars, params + data + row_shareds))
    logps = _replaced(terms.logps, replace)
    total = pt.add(*[lp.sum() for lp in logps]) if len(logps) > 1 else logps[0].sum()
    grads = gradient(total, [p for p in params if continuous(p)])
    return params, data, row_shareds, total, grads
