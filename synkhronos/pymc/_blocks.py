"""A rank's graph evaluated on one block of its rows, one component at a time.

The ranks' outputs are sums over rows (a log-density and its gradient), so a
rank may compute them block by block and add the blocks up, as the master adds
the ranks up: a block is a rank of a few hundred or thousand rows.  ``Interpreter`` walks
a rewritten graph of one point for one block, where every tensor is small but
for its axis of rows (if it has one).  It keeps each tensor as a numpy array of
*components*, one per index of its axes other than rows, each a JAX value: a
vector of the block's rows, or a scalar.  A matrix product of the design matrix
and the coefficients is then a sum of products of vectors, a sum over rows one
reduction of a vector, and the whole graph one pass over the block's rows in
registers (``_pallas`` runs it as a GPU kernel, one block per program).  Rows
past the end (the last block's) are read as zeros and left out of every
reduction over rows.  A graph with an Op not handled here, or with too many
components, raises ``Unsupported``: the rank then compiles the graph as it is.
"""

import functools
import operator

import numpy as np
from pytensor.graph.basic import Constant
from pytensor.raise_op import Assert
from pytensor.scalar import basic as ps
from pytensor.tensor import subtensor as _subtensor_ops
from pytensor.tensor.basic import Alloc, Join, MakeVector, ScalarFromTensor, TensorFromScalar
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import Shape_i, SpecifyShape
from pytensor.tensor.subtensor import (
    AdvancedIncSubtensor,
    AdvancedSubtensor,
    IncSubtensor,
    Subtensor,
    indices_from_subtensor,
)

from ._scalars import Unsupported, jnp_module, scalar_function, shared_exponentials

__all__ = ["Interpreter", "Unsupported", "Value", "comps_from", "MAX_COMPONENTS", "MAX_GROUPS"]

MAX_COMPONENTS = 512  # the most components of one tensor written out
MAX_GROUPS = 32  # the most values a row's index picks among (a coefficient per group)


class Value:
    """A tensor in one block: ``comps`` (numpy object array, the tensor's shape
    with length 1 on its axis of rows) and ``row`` (that axis, or None)."""

    __slots__ = ("comps", "row")

    def __init__(self, comps, row=None):
        if comps.size > MAX_COMPONENTS:
            raise Unsupported("a tensor of %d components" % comps.size)
        self.comps = comps
        self.row = row


def comps_from(load, shape):
    """A numpy object array of ``shape`` holding ``load(index)`` at each index."""
    comps = np.empty(tuple(shape), dtype=object)
    for idx in np.ndindex(tuple(shape)):
        comps[idx] = load(idx)
    return comps


def _scalar_comps(value):
    return comps_from(lambda idx: value, ())


class _Rows(Value):
    """The row count of a block (what ``x.shape[0]`` is there)."""

    __slots__ = ()

    def __init__(self, count):
        super().__init__(_scalar_comps(count))


class Interpreter:
    """Evaluate ``fgraph`` (its inputs' Values given) for one block whose
    valid rows are ``mask`` (a boolean vector of the block's length)."""

    def __init__(self, fgraph, mask):
        self.fgraph = fgraph
        self.mask = mask
        self._handlers = {DimShuffle: self._dimshuffle, Elemwise: self._elemwise, Dot: self._dot,
                          CAReduce: self._careduce, MakeVector: self._make_vector,
                          Subtensor: self._subtensor, Join: self._join, Alloc: self._alloc,
                          Shape_i: self._shape_i, SpecifyShape: self._same,
                          ScalarFromTensor: self._same, TensorFromScalar: self._same,
                          ps.ScalarOp: self._elemwise,
                          AdvancedSubtensor: self._pick, AdvancedIncSubtensor: self._add_at,
                          Assert: self._assert, IncSubtensor: self._inc_subtensor}
        for name, handler in (("AdvancedSubtensor1", self._pick), ("AdvancedIncSubtensor1", self._add_at)):
            if hasattr(_subtensor_ops, name):  # (PyTensor 2's; PyTensor 3 has only the general ones)
                self._handlers[getattr(_subtensor_ops, name)] = handler

    def run(self, env):
        """``env`` (Variable -> Value: the graph's inputs) completed with
        every node of the graph."""
        with shared_exponentials():
            return self._run(env)

    def _run(self, env):
        self._env = env
        for node in self.fgraph.toposort():
            handler = next((h for t, h in self._handlers.items() if isinstance(node.op, t)), None)
            if handler is None:
                raise Unsupported("Op %s" % node.op)
            args = [self._value(env, v) for v in node.inputs]
            outs = handler(node, *args)
            for var, val in zip(node.outputs, outs):
                env[var] = val
        return env

    def _value(self, env, var):
        if var in env:
            return env[var]
        if isinstance(var, Constant):
            data = np.asarray(var.data)
            if data.size > MAX_COMPONENTS:
                raise Unsupported("a constant of %d values" % data.size)
            env[var] = Value(comps_from(lambda idx: data[idx], data.shape))
            return env[var]
        raise Unsupported("input %s not given" % var)

    # -- Ops ---------------------------------------------------------------

    def _same(self, node, x, *shape):
        return [x]

    def _assert(self, node, x, *conditions):
        """A shape check that every block passes: that two tensors with rows
        have as many rows (PyTensor's "Could not broadcast dimensions").  In a
        block, every tensor with rows has the block's rows; on a rank, every
        input with rows has the rank's (``data_parallel`` splits them alike).
        A check of anything else is not made in a kernel: ``Unsupported``."""
        for cond in node.inputs[1:]:
            if not self._equal_row_counts(cond):
                raise Unsupported("Op %s" % node.op)
        return [x]

    def _equal_row_counts(self, var):
        """Whether ``var`` is ``Eq`` of two row counts."""
        while var.owner is not None and isinstance(var.owner.op, (ScalarFromTensor, TensorFromScalar)):
            var = var.owner.inputs[0]
        node = var.owner
        if node is None or not isinstance(getattr(node.op, "scalar_op", node.op), ps.EQ):
            return False
        return all(self._row_count(i) for i in node.inputs)

    def _row_count(self, var):
        """Whether ``var`` is ``Shape_i`` of an axis of rows, through checks
        of row counts (three tensors with rows broadcast together)."""
        while var.owner is not None and isinstance(var.owner.op, Assert):
            var = var.owner.inputs[0]
        count = var.owner
        return (count is not None and isinstance(count.op, Shape_i) and count.inputs[0] in self._env
                and self._env[count.inputs[0]].row == count.op.i)

    def _dimshuffle(self, node, x):
        order = node.op.new_order
        kept = [o for o in order if o != "x"]
        dropped = [a for a in range(x.comps.ndim) if a not in kept]
        if x.row is not None and x.row in dropped:
            raise Unsupported("the axis of rows dropped")
        comps = np.transpose(x.comps, kept + dropped).reshape([x.comps.shape[a] for a in kept])
        for pos, o in enumerate(order):
            if o == "x":
                comps = np.expand_dims(comps, pos)
        return [Value(comps, None if x.row is None else order.index(x.row))]

    def _elemwise(self, node, *args):
        scalar_op = node.op if isinstance(node.op, ps.ScalarOp) else node.op.scalar_op
        fn = scalar_function(scalar_op, tuple(i.dtype for i in node.inputs))
        rows = {a.row for a in args if a.row is not None}
        if len(rows) > 1:
            raise Unsupported("inputs with rows along different axes")
        comps_in = np.broadcast_arrays(*[a.comps for a in args])
        shape = comps_in[0].shape if comps_in else ()
        outs = [np.empty(shape, dtype=object) for _ in node.outputs]
        for idx in np.ndindex(shape):
            res = fn(*[c[idx] for c in comps_in])
            if len(node.outputs) == 1:
                res = (res,)
            for o, r in zip(outs, res):
                o[idx] = r
        row = rows.pop() if rows else None
        return [Value(o, row) for o in outs]

    def _dot(self, node, x, y):
        if x.comps.ndim > 2 or y.comps.ndim > 2:
            raise Unsupported("a product of %d-d and %d-d" % (x.comps.ndim, y.comps.ndim))
        xc = x.comps if x.comps.ndim == 2 else x.comps[None, :]
        yc = y.comps if y.comps.ndim == 2 else y.comps[:, None]
        x_row = None if x.row is None else x.row + (2 - x.comps.ndim)
        y_row = y.row
        inner_rows = x_row == 1
        if inner_rows != (y_row == 0):
            raise Unsupported("a product over rows of one side only")
        out = np.empty((xc.shape[0], yc.shape[1]), dtype=object)
        for a, c in np.ndindex(out.shape):
            terms = [xc[a, b] * yc[b, c] for b in range(xc.shape[1])]
            total = functools.reduce(operator.add, terms)
            out[a, c] = self._row_reduce(ps.add, total) if inner_rows else total
        row = 0 if x_row == 0 else (1 if y_row == 1 else None)
        if x.comps.ndim == 1:
            out, row = out[0], (None if row is None else row - 1)
        if y.comps.ndim == 1:
            out = out[..., 0]
        return [Value(out, row)]

    def _careduce(self, node, x):
        op = node.op
        axes = tuple(range(x.comps.ndim)) if op.axis is None else tuple(op.axis)
        binary = scalar_function(op.scalar_op, (node.inputs[0].dtype,) * 2)
        comps = x.comps
        if x.row is not None and x.row in axes:
            reduce_rows = np.vectorize(lambda v: self._row_reduce(op.scalar_op, v), otypes=[object])
            comps = reduce_rows(comps) if comps.size else comps
        kept = [a for a in range(comps.ndim) if a not in axes]
        comps = np.transpose(comps, kept + list(axes))
        shape = comps.shape[:len(kept)]
        flat = comps.reshape(shape + (-1,))
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            vals = list(flat[idx])
            out[idx] = functools.reduce(binary, vals) if vals else _identity(op.scalar_op)
        row = None
        if x.row is not None and x.row not in axes:
            row = kept.index(x.row)
        dtype = node.outputs[0].dtype
        cast = np.vectorize(lambda v: _cast(v, dtype), otypes=[object])
        return [Value(cast(out) if out.size else out, row)]

    def _make_vector(self, node, *args):
        comps = np.empty(len(args), dtype=object)
        for i, a in enumerate(args):
            comps[i] = a.comps[()]
        return [Value(comps, None)]

    def _subtensor(self, node, x, *idx_vals):
        idx = []
        for entry in indices_from_subtensor(node.inputs[1:], node.op.idx_list):
            idx.append(_constant_index(entry))
        for axis, entry in enumerate(idx):
            if axis == x.row and entry != slice(None):
                raise Unsupported("rows selected inside the graph")
        comps = x.comps[tuple(idx)]
        if not isinstance(comps, np.ndarray):
            comps = _scalar_comps(comps)
        row = x.row
        if row is not None:
            row -= sum(1 for entry in idx[:row] if not isinstance(entry, slice))
        return [Value(comps, row)]

    def _inc_subtensor(self, node, x, y, *idx_vals):
        """``x`` with ``y`` added (or set) at constant indices, neither with rows
        (the gradient by ``b`` of ``b[0] + b[1] * x``)."""
        if x.row is not None or y.row is not None:
            raise Unsupported("an increment of a tensor with rows")
        idx = tuple(_constant_index(e) for e in indices_from_subtensor(node.inputs[2:], node.op.idx_list))
        out = x.comps.copy()
        shape = np.empty(out.shape, dtype=bool)[idx].shape
        part = np.broadcast_to(y.comps, shape) if shape else y.comps.reshape(-1)[0]  # (a component)
        out[idx] = part if node.op.set_instead_of_inc else out[idx] + part
        return [Value(out)]

    def _pick(self, node, x, *index):
        """``x[g]``: each row's value of ``x`` (a value per group) at its index ``g``."""
        (g,) = self._group_index(node, x, index)
        groups = x.comps.shape[0]
        out = np.empty((1,) + x.comps.shape[1:], dtype=object)
        jnp = jnp_module()
        for rest in np.ndindex(x.comps.shape[1:]):
            value = x.comps[(0,) + rest]
            for k in range(1, groups):
                value = jnp.where(_at_group(g, k, groups), x.comps[(k,) + rest], value)
            out[(0,) + rest] = value
        return [Value(out, 0)]

    def _add_at(self, node, x, y, *index):
        """``x`` with each row's ``y`` added at its index ``g`` (a gradient by group)."""
        if node.op.set_instead_of_inc:
            raise Unsupported("a set by index")
        (g,) = self._group_index(node, x, index)
        if y.row != 0 or y.comps.shape[1:] != x.comps.shape[1:] and y.comps.size != 1:
            raise Unsupported("an increment of another shape")
        groups = x.comps.shape[0]
        comps = np.broadcast_to(y.comps, (1,) + x.comps.shape[1:])
        out = np.empty(x.comps.shape, dtype=object)
        jnp = jnp_module()
        for idx in np.ndindex(x.comps.shape):
            k, rest = idx[0], idx[1:]
            mine = jnp.where(_at_group(g, k, groups), comps[(0,) + rest], 0)
            out[idx] = x.comps[idx] + self._row_reduce(ps.add, mine)
        return [Value(out, None)]

    def _group_index(self, node, x, index):
        if len(index) != 1 or len(getattr(node.op, "idx_list", (0,))) != 1:
            raise Unsupported("an index of several axes")
        (g,) = index
        if x.row is not None or g.row != 0 or g.comps.shape != (1,) or x.comps.ndim < 1:
            raise Unsupported("an index that is not one per row into values without rows")
        if x.comps.shape[0] > MAX_GROUPS:
            raise Unsupported("an index among %d values" % x.comps.shape[0])
        return [g.comps[0]]

    def _join(self, node, axis, *xs):
        axis = int(_constant_index(node.inputs[0]))
        rows = {x.row for x in xs}
        if len(rows) > 1 or axis in rows:
            raise Unsupported("a join along rows")
        return [Value(np.concatenate([x.comps for x in xs], axis=axis), rows.pop())]

    def _alloc(self, node, value, *shape):
        dims, row = [], None
        for axis, s in enumerate(shape):
            if isinstance(s, _Rows):
                dims.append(1)
                row = axis
            else:
                dims.append(_known_length(node.inputs[1 + axis], s))
        comps = value.comps.reshape((1,) * (len(dims) - value.comps.ndim) + value.comps.shape)
        comps = np.broadcast_to(comps, dims).copy()
        if row is not None:
            jnp = jnp_module()
            zeros = jnp.zeros(self.mask.shape, dtype=node.outputs[0].dtype)
            comps = np.vectorize(lambda v: v + zeros, otypes=[object])(comps)
        return [Value(comps, row if row is not None else value.row)]

    def _shape_i(self, node, x):
        if node.op.i == x.row:
            return [self._rows()]
        # (any other length is known at the trace: a parameter sized by dims)
        return [Value(_scalar_comps(np.int64(x.comps.shape[node.op.i])))]

    def _rows(self):
        jnp = jnp_module()
        return _Rows(jnp.sum(self.mask.astype(jnp.int64)))

    # -- reductions over rows ----------------------------------------------

    def _row_reduce(self, scalar_op, v):
        jnp = jnp_module()
        ident, name = _reduction(scalar_op)
        kept = jnp.where(self.mask, jnp.broadcast_to(v, self.mask.shape), ident)
        if isinstance(scalar_op, (ps.AND, ps.OR)):  # (as 0 and 1: Triton reduces numbers)
            return getattr(jnp, name)(kept.astype(jnp.int32)) > 0
        return getattr(jnp, name)(kept)


# A reduction's identity (what masked rows hold) and the jax.numpy function that reduces rows by it.
_REDUCTIONS = ((ps.Add, 0, "sum"), (ps.Mul, 1, "prod"), (ps.ScalarMaximum, -np.inf, "max"),
               (ps.ScalarMinimum, np.inf, "min"), (ps.AND, True, "min"), (ps.OR, False, "max"))


def _reduction(scalar_op):
    for kind, ident, name in _REDUCTIONS:
        if isinstance(scalar_op, kind):
            return ident, name
    raise Unsupported("a reduction by %s" % scalar_op)


def _identity(scalar_op):
    return _reduction(scalar_op)[0]


def _at_group(g, k, groups):
    """Where index ``g`` picks group ``k`` of ``groups``: ``k``, or ``k - groups``
    counted from the end (signed indices only: ``_rowdata`` holds a group index
    that is never negative unsigned)."""
    if np.dtype(g.dtype).kind == "u":
        return g == k
    return (g == k) | (g == k - groups)


def _cast(v, dtype):
    jnp = jnp_module()
    return jnp.asarray(v).astype(dtype)


def _known_length(var, value):
    """``var``'s value (``value`` here): a constant, or a length (``_shape_i``)."""
    comp = value.comps[()] if value.comps.shape == () else None
    if isinstance(comp, (int, np.integer)) and not isinstance(comp, bool):
        return int(comp)
    return int(_constant_index(var))


def _constant_index(entry):
    if isinstance(entry, slice):
        parts = (entry.start, entry.stop, entry.step)
        return slice(*[None if e is None else int(_constant_index(e)) for e in parts])
    if isinstance(entry, (int, np.integer)):
        return int(entry)
    if isinstance(entry, Constant):
        return int(np.asarray(entry.data))
    raise Unsupported("an index computed in the graph")
