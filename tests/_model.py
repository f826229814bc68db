"""The tests' one plain-numpy oracle of the public API: the model-based test
(``_machine.py``) and the fuzz test (``_fuzz.py``) both check the library against it.

``Reference`` holds every rank's value of every shared variable and every
``Data``'s values, and says for each public call what it must return and leave
behind, or that it must be refused (``Refused``) and change nothing.  What is
right is decided by numpy and by plain PyTensor: a value given for a shared
variable is stored as ``var.type.filter(value)`` stores it, which is what
``shared.set_value`` does in one process.  Nothing here imports Synkhronos.
"""

import numpy as np

__all__ = ["Freed", "Refused", "Reference", "split", "rows_of", "reduce_ref", "assert_matches"]


class Refused(Exception):
    """The call must raise one of ``types`` and change no rank's values."""

    def __init__(self, *types):
        super().__init__(", ".join(t.__name__ for t in types))
        self.types = types


def split(length, parts):
    """Rows ``[a, b)`` of each part when ``length`` rows are split as evenly as
    possible, the first ``length % parts`` parts one row longer (the seed's rule)."""
    q, r = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + q + (i < r)
        bounds.append((start, stop))
        start = stop
    return bounds


def rows_of(sel, length):
    """Row indices a ``batch``-like selection picks from ``length`` rows; Refused
    (ValueError) if it reaches past them."""
    if sel is None:
        return np.arange(length)
    if isinstance(sel, (int, np.integer)):
        idx = np.arange(sel)
    elif isinstance(sel, slice):
        start = 0 if sel.start is None else sel.start
        stop = length if sel.stop is None else sel.stop
        idx = np.arange(start, stop)
    else:
        idx = np.asarray(sel, dtype=np.int64)
    if len(idx) and idx.max() >= length:
        raise Refused(ValueError)
    return idx


class Freed:
    """What the reference keeps of a Data whose memory was freed: its dtype and ndim."""

    def __init__(self, array):
        self.dtype, self.ndim = array.dtype, array.ndim


def _stored(var, value):
    """What ``var`` stores for ``value``, by the rule of the docs' "Which values
    fit": an array of another dtype when numpy casts it safely; numbers (the
    machine gives lists of values of the variable's own dtype) exactly.  A
    static shape is checked later (``_collectives.targets``), after the rows are selected."""
    dtype = np.dtype(var.dtype)
    if np.ndim(value) != var.ndim:
        raise Refused(TypeError)
    if isinstance(value, np.ndarray):
        if not np.can_cast(value.dtype, dtype, "safe"):
            raise Refused(TypeError)
        return value.astype(dtype)
    stored = np.array(value, dtype=dtype)
    assert stored.tolist() == value, "the machine gives numbers of the variable's dtype"
    return stored


def _fits(var, shape):
    static = getattr(var.type, "shape", None) or ()
    return all(d is None or d == n for d, n in zip(static, shape))


def _wrapped_sum(stack, dtype):
    """The sum in ``dtype`` as integer hardware adds (wrapping around), for
    integers and booleans ("or")."""
    return np.sum(stack, axis=0).astype(dtype)


def _truncated_quotient(total, n):
    """``total / n`` rounded toward zero, exactly, for an integer array."""
    flat = [int(t) // n if int(t) >= 0 else -((-int(t)) // n) for t in total.reshape(-1)]
    return np.array(flat, dtype=object).reshape(total.shape).astype(total.dtype)


def reduce_ref(values, op, dtype):
    """(result, error bound): the reduction of one value per rank under ``op``
    as the API reference defines it.  ``avg`` is the sum divided by the number
    of ranks, integers truncated toward zero (the sum wraps around in the
    variable's dtype, as NCCL's and MPI's do); booleans reduce as "or" (sum,
    avg, max) and "and" (prod, min).  The bound is how far a float result may be
    from this one by summation order alone (0: exact)."""
    dt = np.dtype(dtype)
    stack = np.stack(values)
    n = len(values)
    if op in ("max", "min"):
        return (np.max if op == "max" else np.min)(stack, axis=0).astype(dt), 0
    if dt.kind in "biu":
        if op == "prod":
            return np.prod(stack, axis=0).astype(dt), 0
        total = _wrapped_sum(stack, dt)
        if op == "sum" or dt.kind == "b":
            return total, 0
        return _truncated_quotient(total, n), 0
    eps = float(np.finfo(dt).eps)
    wide = stack.astype(np.complex128 if dt.kind == "c" else np.float64)
    if op == "prod":
        exact = np.prod(wide, axis=0)
        return exact.astype(dt), 2 * n * eps * np.abs(exact)
    exact = np.sum(wide, axis=0)
    bound = 2 * n * eps * np.sum(np.abs(wide), axis=0)
    if op == "avg":
        return (exact / n).astype(dt), bound / n + eps * np.abs(exact / n)
    return exact.astype(dt), bound


def _assert_equal(got, want, what):
    """``np.testing.assert_array_equal`` (NaNs equal NaNs), asked only where a
    quick comparison finds a difference, for its message: the model-based tests
    compare every variable on every rank after every step, and numpy's checks
    cost a hundred microseconds or more each."""
    if np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"):
        return
    np.testing.assert_array_equal(got, want, err_msg=what)


def assert_matches(got, want, bound=0, what="", any_nonfinite=False):
    """``got`` equals ``want`` (dtype, shape, values; NaNs where NaNs are), float
    elements within ``bound`` where it is not zero.  ``any_nonfinite``: where
    ``want`` is NaN or infinite, any of those will do (XLA rewrites
    ``sum(x * b)`` as ``b * sum(x)``, so 0 * inf there is not NaN)."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype, "%s: dtype %s, expected %s" % (what, got.dtype, want.dtype)
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (what, got.shape, want.shape)
    if np.all(np.asarray(bound) == 0) or want.dtype.kind not in "fc":
        _assert_equal(got, want, what)
        return
    g = got.astype(np.complex128)
    w = want.astype(np.complex128)
    finite = np.isfinite(w)
    if any_nonfinite:
        assert not np.isfinite(g[~finite]).any(), "%s: finite where %s was expected" % (what, want[~finite])
    else:
        _assert_equal(got[~finite], want[~finite], what + " (non-finite)")
    tol = np.broadcast_to(np.asarray(bound, dtype=np.float64), w.shape)
    # A result rounded to the dtype may be half a unit off as well.
    unit = np.abs(w) * float(np.finfo(want.dtype).eps) + float(np.finfo(want.dtype).tiny)
    off = np.abs(g - w)
    bad = finite & ~(off <= tol + unit)
    assert not bad.any(), "%s: off by %s where at most %s was allowed: got %s, expected %s" % (
        what, off[bad][:5], (tol + unit)[bad][:5], got[bad][:5], want[bad][:5])


class Reference:
    """Every rank's value of every shared variable (``vals[k][rank]`` for
    variable ``variables[k]``) and every Data's values (``datas[key]``, a
    ``Freed`` once freed), and what each call does to them."""

    def __init__(self, n, master, variables, initial):
        self.n = n
        self.master = master
        self.variables = list(variables)
        self.vals = [[np.array(v) for _ in range(n)] for v in initial]  # every rank starts equal
        self.datas = {}

    # ---------------------------------------------------- variables by object
    def k(self, var):
        """The index of shared variable ``var`` (the object itself: names may repeat)."""
        for k, v in enumerate(self.variables):
            if v is var:
                return k
        raise KeyError(var)

    def of(self, var):
        """Every rank's value of shared variable ``var``, by rank."""
        return self.vals[self.k(var)]

    # ------------------------------------------------------------- values given
    def value_for(self, k, given):
        """What variable ``k`` stores for ``given``: ``("data", key)`` names a
        Data (of the variable's ndim, and a dtype numpy casts to the variable's
        safely), anything else is a value as the user gives it."""
        var = self.variables[k]
        if isinstance(given, tuple) and given and given[0] == "data":
            arr = self.datas[given[1]]
            if not np.can_cast(arr.dtype, var.dtype, "safe") or arr.ndim != var.ndim:
                raise Refused(TypeError)
            if isinstance(arr, Freed):
                raise Refused(ValueError)
            return arr.astype(var.dtype)
        return _stored(var, given)

    def _values(self, ks, given):
        out, problems = [], set()
        for k, g in zip(ks, given):
            try:
                out.append(self.value_for(k, g))
            except Refused as r:
                problems.update(r.types)
                out.append(None)
        return out, problems

    @staticmethod
    def _refuse(problems):
        if problems:
            raise Refused(*sorted(problems, key=lambda t: t.__name__))

    def _check_parts(self, ks, parts_of, problems):
        """Static shapes: ``parts_of(j)`` gives variable ``ks[j]``'s new value per rank."""
        for j, k in enumerate(ks):
            parts = parts_of(j)
            if parts is not None and not all(_fits(self.variables[k], p.shape) for p in parts):
                problems.add(TypeError)

    def _apply(self, ks, parts_of, ranks):
        for j, k in enumerate(ks):  # in order: a variable named twice takes the last value
            for r, p in zip(ranks, parts_of(j)):
                self.vals[k][r] = p

    # ------------------------------------------------------------ collectives
    def broadcast(self, ks, given):
        if given is None:
            values = [self.vals[k][self.master].copy() for k in ks]
            problems = set()
        else:
            values, problems = self._values(ks, given)
        self._check_parts(ks, lambda j: None if values[j] is None else [values[j]], problems)
        self._refuse(problems)
        self._apply(ks, lambda j: [values[j]] * self.n, range(self.n))

    def scatter(self, ks, given, batch):
        values, problems = self._values(ks, given)
        parts = []
        for v in values:
            if v is None:
                parts.append(None)
                continue
            if v.ndim == 0:
                problems.add(TypeError)
                parts.append(None)
                continue
            try:
                rows = v[rows_of(batch, len(v))]
            except Refused as r:
                problems.update(r.types)
                parts.append(None)
                continue
            parts.append([rows[a:b] for a, b in split(len(rows), self.n)])
        self._check_parts(ks, lambda j: parts[j], problems)
        self._refuse(problems)
        self._apply(ks, lambda j: parts[j], range(self.n))

    def set_value(self, rank, ks, given, batch):
        values, problems = self._values(ks, given)
        parts = []
        for v in values:
            if v is None or batch is None:
                parts.append(None if v is None else [v])
                continue
            try:
                parts.append([v[rows_of(batch, len(v))]] if v.ndim else None)
            except Refused as r:
                problems.update(r.types)
                parts.append(None)
            if v.ndim == 0:
                problems.add(TypeError)
        self._check_parts(ks, lambda j: parts[j], problems)
        self._refuse(problems)
        self._apply(ks, lambda j: parts[j], [rank])

    def gather(self, ks, nd_up):
        out = []
        for k in ks:
            per_rank = self.vals[k]
            if nd_up == 1:
                same = len({v.shape for v in per_rank}) == 1
                out.append(np.stack(per_rank) if same else [v.copy() for v in per_rank])
            else:
                out.append(self._joined(k))
        return out

    def _joined(self, k):
        per_rank = self.vals[k]
        if per_rank[0].ndim == 0 or len({v.shape[1:] for v in per_rank}) > 1:
            raise Refused(ValueError)
        return np.concatenate(per_rank)

    def all_gather(self, ks):
        joined, problems = [], set()
        for k in ks:
            try:
                joined.append(self._joined(k))
            except Refused as r:
                problems.update(r.types)
                joined.append(None)
        self._check_parts(ks, lambda j: None if joined[j] is None else [joined[j]], problems)
        self._refuse(problems)
        self._apply(ks, lambda j: [joined[j]] * self.n, range(self.n))

    def _reduced(self, ks, op):
        results, problems = [], set()
        for k in ks:
            per_rank = self.vals[k]
            if len({v.shape for v in per_rank}) > 1:
                problems.add(ValueError)
                results.append(None)
                continue
            results.append(reduce_ref(per_rank, op, self.variables[k].dtype))
        self._refuse(problems)
        return results

    def reduce(self, ks, op, in_place):
        results = self._reduced(ks, op)
        if in_place:
            self._apply(ks, lambda j: [results[j][0]], [self.master])
        return results

    def all_reduce(self, ks, op):
        results = self._reduced(ks, op)
        self._apply(ks, lambda j: [results[j][0]] * self.n, range(self.n))
        return results

    def shapes(self, k):
        return [v.shape for v in self.vals[k]]

    def equal_shapes(self, k):
        return len(set(self.shapes(k))) == 1

    def lengths(self, k):
        if self.vals[k][0].ndim == 0:
            raise Refused(TypeError)
        return [v.shape[0] for v in self.vals[k]]

    # -------------------------------------------------------------- functions
    def _split_ranks(self, length):
        return split(length, self.n)

    def call_fx(self, xkey, bkey, batch, num_slices, subset, acc, mx, fdtype):
        """``fx(x, b, batch=..., num_slices=..., output_subset=...)`` of the
        machine's session: outputs ``[(x.sum(0), sum), (x.max(), max), x.mean(),
        ((2x).sum(1), None)]``, updates ``acc += (x * b).sum(0)`` (summed over
        slices, each from the original value) and ``mx = max(mx, x.max(0))``.
        Returns ``(outputs, {rank: {variable: (value, bound)}})``, each output
        ``(value, bound)`` or, for mode None, a list of them per rank."""
        x, b = self.datas[xkey], self.datas[bkey]
        problems = {ValueError for v in (x, b) if isinstance(v, Freed)}
        problems |= {TypeError for v, ndim in ((x, 2), (b, 1))
                     if v.ndim != ndim or not np.can_cast(v.dtype, fdtype, "safe")}
        self._refuse(problems)
        rows = rows_of(batch, len(x))
        if not len(rows):
            raise Refused(ValueError)
        eps = float(np.finfo(fdtype).eps)
        x, b = x[rows].astype(np.longdouble), b.astype(np.longdouble)
        ax = np.abs(x)
        total, n_all = x.sum(axis=0), len(x)
        outs = [(total.astype(fdtype), 4 * (n_all + 4) * eps * ax.sum(axis=0)),
                (x.max().astype(fdtype), 0),
                ((total.sum() / x.size).astype(fdtype), 4 * (x.size + 4) * eps * ax.sum() / x.size),
                []]
        updates = {}
        for r, (a, c) in enumerate(self._split_ranks(n_all)):
            xr = x[a:c]
            if not len(xr):
                continue
            k = min(num_slices, len(xr))  # slices, each from the original value: acc counted k times
            two = (2 * xr).sum(axis=1)
            outs[3].append((two.astype(fdtype), 8 * eps * np.abs(2 * xr).sum(axis=1)))
            prod = xr * b
            old_acc = self.vals[acc][r].astype(np.longdouble)
            new_acc = k * old_acc + prod.sum(axis=0)
            bound = 4 * (len(xr) + k + 4) * eps * (k * np.abs(old_acc) + np.abs(prod).sum(axis=0))
            updates[r] = {acc: (new_acc.astype(fdtype), bound),
                          mx: (np.maximum(self.vals[mx][r], xr.max(axis=0).astype(fdtype)), 0)}
        chosen = range(4) if subset is None else subset
        return [outs[i] for i in chosen], updates

    def call_fs(self, sh, batch_s, per_rank, num_slices):
        """``fs(batch_s=..., num_slices=...)``: outputs ``[(sh.sum(0), sum),
        (sh.max(), max), sh.mean()]`` over each rank's selected rows of the
        sliceable ``sh``.  Ranks' outputs of different shapes cannot be reduced."""
        sels = list(batch_s) if per_rank else [batch_s] * self.n
        def selected(sel):  # rows a batch_s selects, whatever the rank holds
            return sel.stop - (sel.start or 0) if isinstance(sel, slice) else len(sel)

        if batch_s is not None and not any(selected(s) for s in sels):
            raise Refused(ValueError)
        parts, problems = [], set()
        for r, sel in enumerate(sels):
            value = self.vals[sh][r]
            try:
                parts.append(value[rows_of(sel, len(value))])
            except Refused:
                problems.update((ValueError,) if r == self.master else (ValueError, _worker_error()))
        self._refuse(problems)
        parts = [p.astype(np.longdouble) for p in parts if len(p)]
        if not parts or len({p.shape[1:] for p in parts}) > 1:
            raise Refused(ValueError)
        dtype = self.variables[sh].dtype
        eps = float(np.finfo(dtype).eps)
        rows = np.concatenate(parts)
        ax = np.abs(rows)
        return [(rows.sum(axis=0).astype(dtype), 4 * (len(rows) + 4) * eps * ax.sum(axis=0)),
                (rows.max().astype(dtype), 0),
                ((rows.sum() / rows.size).astype(dtype), 4 * (rows.size + 4) * eps * ax.sum() / rows.size)]


def _worker_error():
    """``synkhronos.WorkerError``, imported only when a worker's failure is
    expected (the reference itself needs nothing of Synkhronos)."""
    from synkhronos import WorkerError

    return WorkerError
