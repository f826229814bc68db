"""An evaluation with one array in and one out (the pipeline's eighth stage).

A call of the ranks takes each parameter and returns the log-density and each
gradient as arrays of their own.  Packed, a point's parameters are one vector
(each raveled, one after another) and its results another (the log-density,
then each gradient raveled); a batched call's points and results are the rows
of one matrix each.  A GPU rank then copies one array to the device and one
back per run, where each copy of a small array costs tens of microseconds, and
every call checks, sends, reduces and unpacks one input and one output instead
of one per parameter (bambi's GLMM has eight: 0.1 ms a call on CPU ranks).

A parameter's shape is its type's where that is static, else its shape at the
model's initial point (a group's coefficients, sized by the model's dims); a
point of another shape is refused, naming the parameter.
"""

import dataclasses

import numpy as np

__all__ = ["Packing", "packed", "packed_graph"]


def packed(graph, shapes=None):
    """``graph`` (a ``RanksGraph``) with its inputs and outputs packed
    (``packed_graph``; ``shapes``: each parameter's shape at one point, for
    those whose type leaves it open) where they can be; as it is otherwise."""
    found = packed_graph(graph.inputs, graph.outputs, graph.batched, shapes,
                         [p.name for p in graph.params])
    if found is None:
        return graph
    points, out, packing = found
    return dataclasses.replace(graph, inputs=[points], outputs=[out], packing=packing)


class Packing:
    """Where each parameter and each result lies in a packed row.

    ``param_shapes``: one point's shape of each parameter; ``out_shapes``: one
    point's shape of each result (the log-density's is ``()``); ``names``: the
    parameters', for errors."""

    def __init__(self, param_shapes, out_shapes, dtype, names=None):
        self.param_shapes = [tuple(s) for s in param_shapes]
        self.names = list(names) if names is not None else [str(k) for k in range(len(param_shapes))]
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
            self._fill(row, p[:n_params])
        return packed

    def point(self, params):
        """The packed vector of one point's parameters ``params``."""
        packed = np.empty(self.width, dtype=self.dtype)
        self._fill(packed, params)
        return packed

    def _fill(self, row, params):
        for (start, end, shape), value, name in zip(self._params, params, self.names):
            if np.shape(value) != shape:
                raise ValueError("parameter %r has shape %s at this point, but the copy was built for %s "
                                 "(its shape at the model's initial point): call data_parallel again "
                                 "after changing it" % (name, np.shape(value), shape))
            row[start:end] = np.ravel(value)

    def results(self, packed):
        """Per point (a row of ``packed``), its results shaped as unpacked."""
        return [self.result(row) for row in packed]

    def result(self, packed):
        """One point's results (``packed``, a vector), shaped as unpacked."""
        return [packed[start:end].reshape(shape) for start, end, shape in self._outs]


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


def packed_graph(inputs, outputs, batched=True, shapes=None, names=None):
    """``(points, packed, packing)``: ``outputs`` of the parameters ``inputs``
    as a graph of one vector (``batched``: a matrix, a row per point) of points
    to one of results; None where a parameter's or result's shape is not known
    (static, or in ``shapes``), or their dtypes differ (say, a discrete
    parameter)."""
    import pytensor.tensor as pt
    from pytensor.graph.replace import clone_replace

    skip = 1 if batched else 0
    dtypes = {v.dtype for v in list(inputs) + list(outputs)}
    param_shapes = [_static_shape(v, skip) for v in inputs]
    if shapes is not None:
        param_shapes = [tuple(s) if p is None else p for p, s in zip(param_shapes, shapes)]
    if len(dtypes) != 1 or None in param_shapes or not inputs:
        return None
    (dtype,) = dtypes
    points = pt.matrix("points", dtype=dtype) if batched else pt.vector("point", dtype=dtype)
    lead = (points.shape[0],) if batched else ()
    pieces, start = [], 0
    for shape in param_shapes:
        end = start + _size(shape)
        piece = points[:, start:end] if batched else points[start:end]
        pieces.append(piece.reshape(lead + shape))
        start = end
    # Made again from the pieces, so that the results' shapes follow from theirs.
    replaced = clone_replace(list(outputs), replace=dict(zip(inputs, pieces)), rebuild_strict=False)
    out_shapes = [_static_shape(o, skip) for o in replaced]
    if None in out_shapes or any(o.dtype != dtype for o in replaced):
        return None
    packed = pt.concatenate([o.reshape(lead + (_size(s),)) for o, s in zip(replaced, out_shapes)], axis=skip)
    return points, packed, Packing(param_shapes, out_shapes, dtype, names)
