"""Row selections: which rows of an input each rank (and each slice) uses.

A *selection* is either a ``slice`` with int ``start``/``stop`` and no step, or a
1-d int64 numpy array of row indices.  These helpers are pure functions so that
the splitting rules can be tested without processes.
"""

import numbers

import numpy as np

from .brief import brief

__all__ = [
    "is_int",
    "split_bounds",
    "normalize_batch",
    "normalize_batch_s",
    "sub_selection",
    "selection_length",
    "take_rows",
    "check_selection_fits",
]


def split_bounds(length, parts):
    """Split ``range(length)`` into ``parts`` contiguous pieces as evenly as
    possible (the first ``length % parts`` pieces get one extra row).

    Returns a list of ``(start, stop)`` pairs.
    """
    q, r = divmod(int(length), int(parts))
    bounds = []
    start = 0
    for i in range(parts):
        stop = start + q + (1 if i < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _index_array(value, argname):
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise TypeError("%s must be 1-d when given as indices, got shape %s" % (argname, arr.shape))
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError("%s indices must be integers, got dtype %s: %s" % (argname, arr.dtype, brief(value)))
    if arr.min() < 0:
        raise ValueError("%s indices must be non-negative, got %d" % (argname, arr.min()))
    if arr.dtype.kind == "u" and arr.max() > np.iinfo(np.int64).max:  # would wrap to negative
        raise ValueError("%s indices must be below 2**63, got %d" % (argname, arr.max()))
    return arr.astype(np.int64, copy=False)




def _check_slice(s, argname, length=None):
    if s.step not in (None, 1):
        raise ValueError("%s slice must have step None, got %r" % (argname, s))
    start = 0 if s.start is None else s.start
    stop = length if s.stop is None else s.stop
    if stop is None:
        raise ValueError("%s slice needs an int stop here, got %r" % (argname, s))
    if not (is_int(start) and is_int(stop)):
        raise TypeError("%s slice start and stop must be ints, got %r" % (argname, s))
    if start < 0 or stop < start:
        raise ValueError("%s slice must have 0 <= start <= stop, got %r" % (argname, s))
    return slice(int(start), int(stop))


def normalize_batch(batch, length=None, argname="batch"):
    """Turn a ``batch`` argument into a selection.

    Parameters
    ----------
    batch : int, slice, list of ints or 1-d int array
        ``int n`` means ``slice(0, n)``.  A slice may leave ``start`` (0) or
        ``stop`` (``length``) as None.
    length : int, optional
        Length used for an open-ended slice.

    Raises
    ------
    TypeError
        If ``batch`` is of none of the accepted types.
    ValueError
        For negative values or a slice with a step.
    """
    if is_int(batch):
        if batch < 0:
            raise ValueError("%s must be non-negative, got %d" % (argname, batch))
        return slice(0, int(batch))
    if isinstance(batch, slice):
        return _check_slice(batch, argname, length)
    if isinstance(batch, (list, tuple, np.ndarray)):
        return _index_array(batch, argname)
    raise TypeError(
        "%s must be an int, a slice, a list of ints or a 1-d int array, got %s: %r"
        % (argname, type(batch).__name__, batch)
    )


def _is_index_list(value):
    return isinstance(value, (list, tuple)) and all(is_int(v) for v in value)


def normalize_batch_s(batch_s, n_ranks):
    """Turn a ``batch_s`` argument into one selection per rank.

    ``batch_s`` is a slice, a list of ints or a 1-d int array used on every
    rank, or a list/tuple with one of those per rank.
    """
    per_rank = isinstance(batch_s, (list, tuple)) and any(
        isinstance(b, (slice, list, tuple, np.ndarray)) for b in batch_s)
    if isinstance(batch_s, (slice, np.ndarray)) or _is_index_list(batch_s) or (
            isinstance(batch_s, (list, tuple)) and not per_rank):
        sel = normalize_batch(batch_s, argname="batch_s")
        return [sel] * n_ranks
    if per_rank:
        if len(batch_s) != n_ranks:
            raise ValueError(
                "batch_s given per rank must have one entry for each of the %d ranks, got %d: %s"
                % (n_ranks, len(batch_s), brief(batch_s))
            )
        kinds = {isinstance(b, slice) for b in batch_s}  # slices, or index lists/arrays
        if len(kinds) > 1:
            raise TypeError("batch_s entries must all be of one type, got %r" % batch_s)
        out = []
        for b in batch_s:
            if not isinstance(b, (slice, list, tuple, np.ndarray)):
                raise TypeError(
                    "each per-rank batch_s entry must be a slice, a list of ints or a "
                    "1-d int array, got %s: %r" % (type(b).__name__, b)
                )
            out.append(normalize_batch(b, argname="batch_s"))
        return out
    raise TypeError(
        "batch_s must be a slice, a list of ints, a 1-d int array, or a list of "
        "those with one per rank, got %s: %r" % (type(batch_s).__name__, batch_s)
    )


def selection_length(sel):
    if isinstance(sel, slice):
        return sel.stop - sel.start
    return len(sel)


def sub_selection(sel, start, stop):
    """Positions ``start:stop`` of selection ``sel``, as a selection."""
    if isinstance(sel, slice):
        return slice(sel.start + start, sel.start + stop)
    return sel[start:stop]


def check_selection_fits(sel, length, what, argname="batch"):
    """Raise ValueError if selection ``sel`` (argument ``argname``) reaches past
    ``length`` rows of ``what``."""
    if isinstance(sel, slice):
        top = sel.stop
    else:
        top = int(sel.max()) + 1 if len(sel) else 0
    if top > length:
        shown = "%s=%r" % (argname, sel) if isinstance(sel, slice) else argname
        raise ValueError(
            "%s needs %d rows but %s has only %d (largest index %d)" % (shown, top, what, length, top - 1)
        )


def take_rows(array, sel):
    """Rows ``sel`` of ``array``: a view for a slice, a gathered copy for indices
    (``np.take``: for narrow rows several times faster than ``array[sel]``, see
    the docs page "Benchmarks", *Design decisions*)."""
    if isinstance(sel, np.ndarray):
        return np.take(array, sel, axis=0)
    return array if sel is None else array[sel]
