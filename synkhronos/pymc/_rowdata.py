"""How the ranks hold a term's rows: as few bytes a row as the values allow.

A likelihood over millions of rows reads every row's data on every evaluation,
so its time follows the bytes it reads.  PyMC compiles a model's data as
constants, which PyTensor's rewrites merge (one array where two are equal) and
narrow (an index into a short vector held in 8 bits instead of 64).  The ranks'
rows are shared variables, which those rewrites leave alone; so the same is done
here, once, before the rows are split:

- equal arrays (bambi's ``1|group`` and ``x1|group`` terms each hold the group
  index) are held once;
- an integer array that only ever indexes (a group index), all its values
  non-negative, is held in the narrowest unsigned type that holds them;
- an array whose rows are all the same (the column of ones that bambi's
  ``1|group`` term multiplies its coefficients by) is not held: its one row is
  a constant, repeated to the rank's number of rows, which PyTensor's rewrites
  then fold (a product by ones disappears).

The values are unchanged; only how they are stored is.
"""

import numpy as np

from .._graph.editing import array_indexing
from .._graph.editing import replaced as _replaced
from .._graph.editing import row_input as _row_input

__all__ = ["held_compactly"]

_UNSIGNED = ("uint8", "uint16", "uint32")


def held_compactly(logps, row_vars, row_values, keep, merge=True):
    """``(logps, row_vars, row_values)`` with equal arrays held once, index
    arrays narrowed and repeated rows made constants, as the module's docstring
    says (with ``merge`` False, narrowed only); the variables in ``keep`` (the
    observed values' stand-ins, a list) are left as they are."""
    logps, row_vars, row_values = _merged_and_narrowed(logps, row_vars, row_values, set(keep), merge)
    return _repeats_folded(logps, row_vars, row_values, keep) if merge else (logps, row_vars, row_values)


def _merged_and_narrowed(logps, row_vars, row_values, keep, merge=True):
    indexing = _index_only(logps)
    replace, kept_vars, kept_values = {}, [], []
    for v, value in zip(row_vars, row_values):
        if v in keep:
            kept_vars.append(v)
            kept_values.append(value)
            continue
        if v in indexing:
            value = _narrowed(value)
        same = next((k for k, w in enumerate(kept_values)
                     if merge and kept_vars[k] not in keep and _equal(w, value)), None)
        if same is not None:
            replace[v] = kept_vars[same]
            continue
        new = v if value.dtype == v.dtype else _row_input(_typed(v, value.dtype), v.name)
        if new is not v:
            replace[v] = new
        kept_vars.append(new)
        kept_values.append(value)
    return _replaced(logps, replace), kept_vars, kept_values


def _repeats_folded(logps, row_vars, row_values, keep):
    """Each of ``row_vars`` whose rows are all the same replaced by its first
    row repeated to the number of rows of another input (an observed value's
    stand-in from ``keep`` if any, else the first row input left)."""
    repeated = [_repeated(value) for value in row_values]
    count = next(iter(keep + [v for v, r in zip(row_vars, repeated) if not r]), None)
    if count is None or not any(repeated):
        return logps, row_vars, row_values
    replace = {v: _constant_rows(value[0], count) for v, value, r in zip(row_vars, row_values, repeated) if r}
    left = [(v, value) for v, value in zip(row_vars, row_values) if v not in replace]
    return _replaced(logps, replace), [v for v, _ in left], [value for _, value in left]


def _repeated(value):
    """Whether the rows of ``value`` (two or more) are all the same, bit for bit."""
    if value.ndim == 0 or value.shape[0] < 2:
        return False
    raw = np.ascontiguousarray(value).view(np.uint8).reshape(value.shape[0], -1)
    return bool((raw == raw[:1]).all())


def _constant_rows(row, count):
    """``row`` repeated to as many rows as ``count`` (a row input) has, on
    every rank."""
    import pytensor.tensor as pt
    from pytensor.tensor.shape import Shape_i

    return pt.alloc(pt.constant(row), Shape_i(0)(count), *row.shape)


def _narrowed(value):
    """``value`` (integers) in the narrowest unsigned type that holds them, if
    they are all non-negative and that type is narrower; else ``value``."""
    if value.dtype.kind not in "iu" or value.size == 0 or value.min() < 0:
        return value
    top = value.max()
    for name in _UNSIGNED:
        dtype = np.dtype(name)
        if dtype.itemsize >= value.dtype.itemsize:
            break
        if top <= np.iinfo(dtype).max:
            return value.astype(dtype)
    return value


def _typed(var, dtype):
    """A variable like ``var`` of dtype ``dtype`` (for ``row_input``)."""
    return var.type.clone(dtype=str(dtype))()


def _equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _index_only(logps):
    """The graph inputs of ``logps`` read only as the index of an indexing by
    arrays (or of its gradient's increment)."""
    from pytensor.graph.traversal import apply_ancestors

    picks, adds = array_indexing()
    indexing, other = set(), set()
    for node in apply_ancestors(logps):
        first_index = 1 if isinstance(node.op, picks) else 2 if isinstance(node.op, adds) else None
        for k, i in enumerate(node.inputs):
            if i.owner is not None:
                continue
            (indexing if first_index is not None and k >= first_index else other).add(i)
    return indexing - other - set(logps)
