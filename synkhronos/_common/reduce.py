"""Reduce operations for function outputs, updates and collectives.

``avg`` is weighted: each contribution carries the number of rows it was computed
from, so averaging per-rank (or per-slice) means of uneven parts gives exactly the
mean over all rows, as one process would compute it.  Collectives average the
ranks' values with equal weights: the sum in the values' dtype divided by the
number of ranks, integers truncated toward zero exactly (``truncated_divide``),
as NCCL's and MPI's sum-then-divide give it.

Large values are reduced by several threads at once (``ChunkPool``), each over
chunks of the flattened values small enough that their temporaries stay in its
core's cache.  Every element goes through the same operations in the same rank
order as in one pass, so the results are the same to the bit.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .cores import usable_cores

__all__ = ["REDUCE_OPS", "check_op", "identity", "Accumulator", "ChunkPool", "reduce_values",
           "truncated_divide"]

# A value at least this large is reduced by the pool's threads: below it, handing
# chunks to threads costs about what it saves.
PARALLEL_BYTES = 1 << 20
CHUNK_ELEMENTS = 1 << 17  # a chunk's accumulator stays in a core's cache while every rank's adds to it
# With fewer threads, memory bandwidth, not the cores, bounds a reduction, and the
# hand-off to threads made it slower than one pass in the master's thread.
MIN_THREADS = 4

REDUCE_OPS = ("avg", "sum", "prod", "max", "min", None)

_BINARY = {
    "sum": np.add,
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def check_op(op, argname="op", allow_none=True):
    """Raise ValueError unless ``op`` is a known reduce operation."""
    allowed = REDUCE_OPS if allow_none else REDUCE_OPS[:-1]
    if op not in allowed or isinstance(op, bool):
        raise ValueError(
            "%s must be one of %s, got %r" % (argname, ", ".join(repr(o) for o in allowed), op)
        )
    return op


def identity(op, dtype):
    """The value of ``dtype`` that leaves a reduction under ``op`` unchanged
    (what a rank without a value contributes to a device reduction)."""
    dtype = np.dtype(dtype)
    if op in ("sum", "avg"):
        return 0
    if op == "prod":
        return 1
    if dtype.kind == "f":
        return -np.inf if op == "max" else np.inf
    info = np.iinfo(dtype)
    return info.min if op == "max" else info.max


class Accumulator:
    """Combines values one at a time under a reduce operation.

    For ``op=None`` the values are kept in a list (``result()`` returns it).
    """

    def __init__(self, op):
        self.op = op
        self._acc = None
        self._weight = 0.0
        self._items = []

    def add(self, value, weight=1):
        """Combine ``value``.

        Raises
        ------
        ValueError
            If its shape is not the shape of the values before it: numpy would
            broadcast a length-1 axis against the others without a word.
        """
        if self.op is None:
            self._items.append(value)
            return
        value = np.asarray(value)
        if self._acc is not None and value.shape != self._acc.shape:
            raise _shape_error(self.op, [self._acc.shape, value.shape])
        if self.op == "avg":
            term = value * weight if weight != 1 else value.copy()
            self._acc = term if self._acc is None else np.add(self._acc, term, out=_writable(self._acc, term))
            self._weight += weight
        elif self._acc is None:
            self._acc = value.copy()
        else:
            self._acc = _BINARY[self.op](self._acc, value, out=_writable(self._acc, value))

    @property
    def empty(self):
        return self._acc is None and not self._items

    def result(self):
        if self.op is None:
            return self._items
        if self._acc is None:
            return None
        if self.op == "avg":
            dtype = self._acc.dtype
            out = self._acc / self._weight
            if dtype.kind in "fc":
                out = out.astype(dtype, copy=False)
            return np.asarray(out)
        return np.asarray(self._acc)


def _shape_error(op, shapes):
    """The error for values of several shapes reduced together (numpy would
    broadcast a length-1 axis against the others without a word)."""
    return ValueError("cannot %s values of shapes %s: values reduced together must have one shape"
                      % (op, " and ".join(str(s) for s in dict.fromkeys(shapes))))


def _writable(acc, value):
    # Accumulate in place when the dtypes allow it (``add`` has checked the shapes).
    if not acc.ndim or not acc.flags.writeable:
        return None
    return acc if np.result_type(acc, value) == acc.dtype else None


def truncated_divide(total, n):
    """``total / n`` for an integer array and a positive int, rounded toward
    zero, exactly (through float64, a 64-bit integer above 2**53 loses bits)."""
    total = np.asarray(total)
    quotient = total // n  # floor: one below the truncated quotient where a negative total leaves a rest
    return np.asarray(quotient + ((total % n != 0) & (total < 0)), dtype=total.dtype)


def reduce_values(values, op, weights=None, pool=None):
    """Reduce a list of arrays under ``op`` (``weights`` only matter for avg).
    Unweighted ``avg`` of integers is their sum divided by their number,
    truncated (see the module docstring).  ``pool``: a ``ChunkPool`` whose
    threads reduce large values by chunks (same results)."""
    if op == "avg" and weights is None and np.asarray(values[0]).dtype.kind in "iu":
        return truncated_divide(reduce_values(values, "sum"), len(values))
    if len(values) == 1 and op is not None:
        # One rank: its value is the result (weighting and dividing back could round).
        value = np.array(values[0])
        return value if op != "avg" or value.dtype.kind in "fc" else value / 1.0
    if pool is not None and pool.takes(values, op):
        return pool.reduce(values, op, weights)
    return _accumulated(values, op, weights)


def _accumulated(values, op, weights):
    """The reduction of several values in one pass, in place where the dtypes
    allow.  An ``avg`` over equal weights (rows split evenly, or collectives)
    is the sum divided by the number of values: one pass with no temporaries."""
    if op == "avg" and (weights is None or len(set(weights)) == 1):
        total = _accumulated(values, "sum", None)
        if total.dtype.kind in "fc":
            return np.true_divide(total, len(values), out=total)
        return np.asarray(total / len(values))
    if op in (None, "avg") or not all(isinstance(v, np.ndarray) for v in values):  # (avg: unequal weights)
        acc = Accumulator(op)
        for i, v in enumerate(values):
            acc.add(v, 1 if weights is None else weights[i])
        return acc.result()
    if any(v.shape != values[0].shape for v in values):
        raise _shape_error(op, [v.shape for v in values])
    acc = np.array(values[0], dtype=np.result_type(*values))
    for v in values[1:]:
        _BINARY[op](acc, v, out=acc)
    return acc


class ChunkPool:
    """Threads that reduce large values by chunks, one range of chunks each.

    Made by the session for the master, which reduces the ranks' outputs once
    all of them have finished computing, so their cores are free; ``threads``
    defaults to the cores this process may use.  Threads start at the first
    large reduction; ``close`` stops them.
    """

    def __init__(self, threads=None):
        if threads is None:
            threads = usable_cores()
        self.threads = max(1, threads)
        self._executor = None
        self._lock = threading.Lock()

    def takes(self, values, op):
        """Whether ``values`` are worth reducing by chunks: several arrays of one
        shape, large enough, and at least ``MIN_THREADS`` threads to share them."""
        if self.threads < MIN_THREADS or op is None or len(values) < 2:
            return False
        first = values[0]
        if not isinstance(first, np.ndarray) or first.nbytes < PARALLEL_BYTES:
            return False
        return all(isinstance(v, np.ndarray) and v.shape == first.shape for v in values)

    def reduce(self, values, op, weights):
        """``reduce_values(values, op, weights)``, by chunks on the pool's threads."""
        flat = [v.reshape(-1) for v in values]
        size = flat[0].size
        head = _accumulated([v[:CHUNK_ELEMENTS] for v in flat], op, weights)  # gives the result's dtype
        out = np.empty(size, head.dtype)
        out[:head.size] = head
        chunks = range(CHUNK_ELEMENTS, size, CHUNK_ELEMENTS)
        per_task = max(1, -(-len(chunks) // self.threads))
        tasks = [chunks[i:i + per_task] for i in range(0, len(chunks), per_task)]

        def run(starts):
            for start in starts:
                stop = min(start + CHUNK_ELEMENTS, size)
                out[start:stop] = _accumulated([v[start:stop] for v in flat], op, weights)

        if tasks:
            list(self._pool().map(run, tasks))
        return out.reshape(values[0].shape)

    def _pool(self):
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="synk-reduce")
            return self._executor

    def close(self):
        """Stop the threads (a later reduction starts them again)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
