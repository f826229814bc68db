"""The graph every rank runs on its share of the rows (the pipeline's fourth
stage): each term's log-density summed over the rows at one point, and its
gradient, PyMC's parameter checks compiled in.

Its outputs are every term's sum, then every term's gradient (one entry per
continuous parameter): ``[sum_1, ..., sum_T, *grad_1, ..., *grad_T]``.  With
one term that is the log-density and its gradient; with several, PyMC's
functions of one term (``pm.compute_log_likelihood``, ``model.logp(vars=...)``
and its gradient) find its own values among them (``_observed``).

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
    (``_packed``), or None; ``mode``: the ranks' mode where it is not their
    default (``_linker``), or None."""

    names: str
    params: list
    data: list
    rows: list
    continuous: tuple
    totals: list
    single: list
    inputs: list
    outputs: list
    batched: bool = False
    packing: object = None
    mode: object = None

    def one_point(self):
        """This graph's form of one point a call: ``params`` in, ``single`` out."""
        return dataclasses.replace(self, inputs=self.params, outputs=self.single, batched=False, packing=None)


def ranks_graph(terms, check_bounds):
    """The ``RanksGraph`` of ``terms``, PyMC's parameter checks compiled as
    ``check_bounds`` (a model's) asks."""
    params, data, rows, totals, grads = worker_graph(terms)
    single = parameter_checks(totals + grads, check_bounds)
    return RanksGraph(names=terms.names(), params=params, data=data, rows=rows,
                      continuous=tuple(continuous(p) for p in params), totals=totals, single=single,
                      inputs=params, outputs=single)


def worker_graph(terms):
    """(param inputs, data inputs, row shared variables, each term's summed
    log-density, the gradient of each for each continuous parameter, term by
    term): the graph every rank runs on its rows (their shared variables empty
    until scattered)."""
    import pytensor

    params = [v.type(name=v.name) for v in terms.params]
    data = [v.type(name=v.name) for v in terms.data]
    row_shareds = [
        pytensor.shared(np.zeros((0,) + val.shape[1:], dtype=val.dtype), borrow=True,
                        name="rows:%s" % (v.name or "data"), shape=(None,) + val.shape[1:])
        for v, val in zip(terms.row_vars, terms.row_values)
    ]
    replace = dict(zip(terms.held + terms.data + terms.row_vars, params + data + row_shareds))
    logps = _replaced(terms.logps, replace)
    totals = [lp.sum() for lp in logps]
    wrt = [p for p in params if continuous(p)]
    grads = [g for total in totals for g in gradient(total, wrt)]
    return params, data, row_shareds, totals, grads
