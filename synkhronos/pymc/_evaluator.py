"""This process's side of the ranks' function (the pipeline's eleventh stage):
``Evaluator`` writes the points asked for into the function's broadcast inputs
and calls it, several chains' points in one call where the graph is batched
(``_batch``), each packed into one matrix where it was packed (``_packed``).

Every evaluation of the copy goes through it, under the session's lock: from
any thread of this process, and from this process's children (chains that PyMC
forked or spawned), whose requests the session's service runs here.
"""

import statistics
import time

import numpy as np

from .. import _data
from .._session import runtime
from ._batch import LINGER, Batcher

__all__ = ["Evaluator", "evaluator", "evaluator_of", "timed", "times_text"]

_TRIAL_SECONDS = 0.1  # timed calls per batch size, after two untimed ones
_MIN_CALLS, _MAX_CALLS = 3, 25


def evaluator(fn, graph):
    """``(evaluator, route)``: ``evaluator_of(fn, graph)``, and the route by
    which this process's children reach it (the session's service runs their
    requests here)."""
    served = evaluator_of(fn, graph)
    return served, runtime.require().service.route(served.serve, served.linger)


def evaluator_of(fn, graph):
    """The ``Evaluator`` of ``fn``, the Synkhronos function of ``graph`` (a
    ``RanksGraph``), with a ``synk.Data`` to broadcast each input from."""
    datas = [_data.data(np.zeros((1,) * v.ndim, dtype=v.dtype)) for v in graph.inputs + graph.data]
    return Evaluator(fn, datas, len(graph.params), graph.batched, graph.packing, graph.rows)


def timed(served, point, sizes):
    """``{points: median seconds}`` of ``served`` (an ``Evaluator``) evaluating
    ``point`` that many times in one run, for each of ``sizes``."""
    times = {}
    for k in sizes:
        points = [point] * k
        for _ in range(2):  # the first compiles
            served.run(points)
        each, end = [], time.perf_counter() + _TRIAL_SECONDS
        while len(each) < _MIN_CALLS or (len(each) < _MAX_CALLS and time.perf_counter() < end):
            t = time.perf_counter()
            served.run(points)
            each.append(time.perf_counter() - t)
        times[k] = statistics.median(each)
    return times


def times_text(times):
    """``timed``'s times as the log gives them."""
    return ", ".join("%.3g ms for %d point%s" % (t * 1e3, k, "s" * (k > 1)) for k, t in times.items())


class Evaluator:
    """The session's side of one model's split terms.

    ``fn`` is the Synkhronos function of the terms (parameters and data
    broadcast, each rank summing its rows); with ``batched`` its parameters carry
    a leading axis of points and it returns one log-density (and gradient) per
    point, else it takes one point.  ``datas``: the ``synkhronos.Data`` each
    input is broadcast from, written in place under the session's lock."""

    def __init__(self, fn, datas, n_params, batched, packing=None, rows=()):
        self.fn = fn
        self.datas = datas
        self.n_params = n_params
        self.batched = batched
        self.packing = packing  # one array in and one out (``_packed``), or None
        self.linger = LINGER if batched else 0.0
        self.batcher = Batcher(self.run, linger=self.linger)
        self.rt = fn._rt
        self.rows = list(rows)  # the shared variables of ``fn``'s rows
        # Calls of up to ``alone_up_to`` points run on this process's rank alone,
        # as ``alone_fn`` (``fn`` or a function of its own rows, all of them
        # here): see ``_placement``.
        self.alone_fn = None
        self.alone_up_to = 0
        self.alone_rows = []  # the shared variables of ``alone_fn``'s rows
        self.rows_follow = None  # brings the rows up to the copy's data (``_refresh``)

    def rows_current(self):
        """The ranks' rows made the copy's data, if ``pm.set_data`` changed
        those since (ValueError where the terms then differ)."""
        if self.rows_follow is not None:
            self.rows_follow()

    def run_alone(self, fn, up_to=float("inf")):
        """Calls of up to ``up_to`` points to ``fn`` on this process's rank alone
        (``fn`` None: every call on every rank)."""
        self.alone_fn, self.alone_up_to = fn, (up_to if fn is not None else 0)

    def evaluate(self, inputs):
        """``[logp, *grads]`` at ``inputs`` (the Op's inputs, as arrays)."""
        self.rows_current()
        return self.batcher.evaluate([np.asarray(x) for x in inputs])

    def serve(self, requests):
        """``evaluate`` for the session's service: each request holds one child's
        inputs; all are evaluated in one run."""
        self.rows_current()
        return self.batcher.evaluate_many([[np.asarray(x) for x in inputs] for (inputs,) in requests])

    def run(self, points):
        """Each point's ``[logp, *grads]``, the points evaluated at once (no
        waiting for others)."""
        with runtime.locked():  # the Data are written, then read by the call, as one step
            if not self.batched:
                return [self._call_one(p) for p in points]
            results = []
            for group in _same_data(points, self.n_params):
                results += zip(group.keys, self._call_batched(group))
            return [r for _, r in sorted(results, key=lambda kr: kr[0])]

    def _call_one(self, point):
        """One point's results, in a call of its own."""
        if self.packing is None:
            return self._call(point, 1)
        n = self.n_params
        (packed,) = self._call([self.packing.point(point[:n])] + list(point[n:]), 1)
        return self.packing.result(packed)

    def _call_batched(self, group):
        """Each point's results, the points of ``group`` in one call."""
        data = group[0][self.n_params:]
        if self.packing is not None:
            (packed,) = self._call([self.packing.points(group, self.n_params)] + data, len(group))
            return self.packing.results(packed)
        outs = self._call([np.stack([p[i] for p in group]) for i in range(self.n_params)] + data, len(group))
        return [[o[j] for o in outs] for j in range(len(group))]

    def _call(self, values, n_points):
        for d, x in zip(self.datas, values):
            if d.shape == x.shape:
                d.data[...] = x
            else:
                d.set_value(x, oversize=2)  # room for more points without reallocating
        if n_points <= self.alone_up_to:
            return self.alone_fn._call_master_alone(*self.datas)
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
