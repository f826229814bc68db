"""A batched evaluation with one array in and one out (the pipeline's eighth
stage).

A batched call of the ranks takes each parameter with a leading axis of points
and returns the log-density and each gradient the same way.  Packed, the points
are the rows of one matrix (each parameter's values raveled, one after another)
and the results the rows of another (the log-density, then each gradient
raveled): a GPU rank then copies one array to the device and one back per run,
where each copy of a small array costs tens of microseconds, and CPU ranks
reduce one result instead of several.
"""

import dataclasses

import numpy as np

__all__ = ["Packing", "packed", "packed_graph"]


def packed(graph):
    """``graph`` (a ``RanksGraph``) with its batched inputs and outputs packed
    (``packed_graph``) where they can be; as it is otherwise."""
    found = packed_graph(graph.inputs, graph.outputs) if graph.batched else None
    if found is None:
        return graph
    points, out, packing = found
    return dataclasses.replace(graph, inputs=[points], outputs=[out], packing=packing)


class Packing:
    """Where each parameter and each result lies in a packed row.

    ``param_shapes``: one point's shape of each parameter; ``out_shapes``: one
    point's shape of each result (the log-density's is ``()``)."""

    def __init__(self, param_shapes, out_shapes, dtype):
        self.param_shapes = [tuple(s) for s in param_shapes]
        self.out_shapes = [tuple(s) for s in out_shapes]
        self.dtype = np.dtype(dtype)
        self._params = _places(self.param_shapes)
        self._outs = _places(self.out_shapes)
        self.width = self._params[-1][1] if self._params else 0

    def points(self, points, n_params):
        """The packed matrix of ``points`` (each a list whose first ``n_params``
        entries are the parameters' values)."""
        packed = np.empty((len(points), self.width), dtype=self.dtype)
        for row, p in zip(packed, points):
            for (start, end, _), value in zip(self._params, p[:n_params]):
                row[start:end] = np.ravel(value)
        return packed

    def results(self, packed):
        """Per point (a row of ``packed``), its results shaped as unpacked."""
        return [[row[start:end].reshape(shape) for start, end, shape in self._outs] for row in packed]


def _places(shapes):
    """``(start, end, shape)`` of each of ``shapes`` raveled one after another."""
    places, start = [], 0
    for shape in shapes:
        places.append((start, start + _size(shape), shape))
        start += _size(shape)
    return places


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))


def _static_shape(var, skip):
    shape = var.type.shape[skip:]
    return None if any(s is None for s in shape) else tuple(shape)


def packed_graph(stacked, outputs):
    """``(points, packed, packing)``: the batched ``outputs`` of the stacked
    parameters ``stacked`` as a graph of one matrix of points to one matrix of
    results; None where a parameter's or result's shape is not static, or their
    dtypes differ (say, a discrete parameter)."""
    import pytensor.tensor as pt
    from pytensor.graph.replace import clone_replace

    dtypes = {v.dtype for v in list(stacked) + list(outputs)}
    param_shapes = [_static_shape(s, 1) for s in stacked]
    out_shapes = [_static_shape(o, 1) for o in outputs]
    if len(dtypes) != 1 or None in param_shapes or None in out_shapes or not stacked:
        return None
    (dtype,) = dtypes
    points = pt.matrix("points", dtype=dtype)
    k = points.shape[0]
    pieces, start = [], 0
    for shape in param_shapes:
        end = start + _size(shape)
        pieces.append(points[:, start:end].reshape((k,) + shape))
        start = end
    replaced = clone_replace(list(outputs), replace=dict(zip(stacked, pieces)))
    packed = pt.concatenate([o.reshape((k, _size(s))) for o, s in zip(replaced, out_shapes)], axis=1)
    return points, packed, Packing(param_shapes, out_shapes, dtype)
