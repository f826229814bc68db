"""Generated calls over the whole public API, for ``test_fuzz.py``.

A ``Fuzzer`` draws cases from a seeded generator.  Most are malformed: one
argument of an otherwise sound call is replaced by a bad value (a wrong type or
ndim, float64 for float32, an empty or out-of-range selection, a stepped slice, an
unknown reduce op, a bad rank, a variable no function uses, a call in the wrong
state, ...).  Each such case says which exception types may result and which
words the message must contain: the argument's name and the bad value.  The rest
are sound calls, some with NaN or Inf data, whose results are compared with
numpy, using the tests' one oracle (``_model.Reference``, which the model-based
test uses too): every rank's value of every shared variable, which each sound
call the session accepted updates as the library must.
"""

import numbers

import numpy as np
import pytensor
import pytensor.tensor as pt
from _model import Refused, rows_of

import synkhronos as synk

__all__ = ["Fuzzer", "Raises", "Valid", "Case", "build_functions", "F32"]

F32 = "float32"
N_ROWS = 20  # rows of the main input Data
N_SH = 12  # rows of the sliceable shared variable


class Raises:
    """Expect an exception of ``types`` whose message contains every string in
    ``mentions`` (case-sensitive)."""

    def __init__(self, types, *mentions):
        self.types = types if isinstance(types, tuple) else (types,)
        self.mentions = [str(m) for m in mentions]


class Valid:
    """Expect a result; ``check(result)`` raises AssertionError if it is wrong."""

    def __init__(self, check=None):
        self.check = check or (lambda result: None)


class Case:
    def __init__(self, api, what, call, expect):
        self.api = api  # the public name called
        self.what = what  # which argument is bad, and how
        self.call = call
        self.expect = expect

    def __repr__(self):
        return "%s: %s" % (self.api, self.what)


def build_functions():
    """Variables and Synkhronos functions of the fuzzed session (call between
    ``fork()`` and ``distribute()``)."""
    v = type("Vars", (), {})()
    v.x = pt.matrix("x", dtype=F32)
    v.b = pt.vector("b", dtype=F32)
    v.m = pt.matrix("m", dtype=F32)
    v.i = pt.vector("i", dtype="int32")
    v.s = pytensor.shared(np.zeros(5, dtype=F32), name="s")
    v.k = pytensor.shared(np.zeros(4, dtype="int32"), name="k")
    v.sh = pytensor.shared(np.zeros((N_SH, 3), dtype=F32), name="sh")
    v.st = pytensor.shared(np.zeros(3, dtype=F32), shape=(3,), name="st")
    v.free = pytensor.shared(np.zeros(3, dtype=F32), name="free")  # in no function
    v.fa = synk.function([v.x], [(v.x.dot(v.b).sum(), "sum"), (v.x.max(), "max"), v.x.mean(),
                                 ((v.x * 2).sum(axis=1), None)], bcast_inputs=[v.b], name="fa")
    v.fm = synk.function([v.x, v.m], ((v.x * v.m).sum(), "sum"), name="fm")
    v.fi = synk.function([v.i], (v.i.sum(), "sum"), name="fi")
    v.fs = synk.function([], [(v.sh.sum(), "sum"), (v.sh.max(), "max")], sliceable_shareds=[v.sh],
                         name="fs")
    v.fv = synk.function([], [(v.s.sum(), "sum"), (v.k.sum(), "sum"), (v.st.sum(), "sum")], name="fv")
    v.shareds = [v.s, v.k, v.sh, v.st]
    return v


def _r(value):
    return repr(value)


def follow(step):
    """Run ``step``, a sound call the session accepted, on the reference; the
    reference refusing it fails the case (the session should have refused it)."""
    try:
        return step()
    except Refused as refused:
        raise AssertionError("accepted, but the reference refuses it (%s)" % refused) from None


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64),
                               rtol=1e-5, atol=1e-5, equal_nan=True)


def _fail(got, want):
    raise AssertionError("got %r, expected %r" % (got, want))


class Fuzzer:
    """Draws cases for the session in ``env`` (see ``test_fuzz``)."""

    def __init__(self, rng, env):
        self.rng = rng
        self.e = env
        self.n = env.n
        self.trail = []

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p):
        return self.rng.random() < p

    # ----------------------------------------------------------- bad values
    def bad_selection(self, argname, length, empty_is_bad=True):
        """A malformed ``batch``-like argument over ``length`` rows: (value,
        Raises).  An empty selection is malformed where a call needs rows
        (``empty_is_bad``), not where it sets values (``scatter``, ``set_value``)."""
        rng = self.rng
        k = int(rng.integers(1, 50))
        kinds = ["neg_int", "big_int", "float", "bool", "str", "dict", "none_list", "step", "neg_start",
                 "big_stop", "reversed", "float_slice", "neg_index", "big_index", "float_list", "two_d",
                 "mask", "huge_uint", "object_list", "str_list"]
        if empty_is_bad:
            kinds += ["empty_list", "zero", "empty_slice"]
        kind = self.pick(kinds)
        self.last_kind = kind
        if kind == "neg_int":
            return -k, Raises(ValueError, argname, -k)
        if kind == "big_int":
            return length + k, Raises(ValueError, argname, length + k)
        if kind == "float":
            v = k + 0.5
            return v, Raises(TypeError, argname, v)
        if kind == "bool":
            return True, Raises(TypeError, argname, "True")
        if kind == "str":
            v = "rows%d" % k
            return v, Raises(TypeError, argname, _r(v))
        if kind == "dict":
            return {"rows": k}, Raises(TypeError, argname, "dict")
        if kind == "none_list":
            return [0, None], Raises(TypeError, argname, "object")
        if kind == "step":
            v = slice(0, length, int(rng.integers(2, 5)))
            return v, Raises(ValueError, argname, _r(v))
        if kind == "neg_start":
            v = slice(-k, length)
            return v, Raises(ValueError, argname, _r(v))
        if kind == "big_stop":
            v = slice(0, length + k)
            return v, Raises(ValueError, argname, length + k)
        if kind == "reversed":
            v = slice(min(k, length), 0)
            if v.start == 0:
                v = slice(1, 0)
            return v, Raises(ValueError, argname, _r(v))
        if kind == "float_slice":
            v = slice(0.0, float(length))
            return v, Raises(TypeError, argname, _r(v))
        if kind == "neg_index":
            idx = list(rng.integers(0, length, int(rng.integers(1, 6))))
            idx.insert(int(rng.integers(len(idx) + 1)), -k)
            return [int(i) for i in idx], Raises(ValueError, argname, -k)
        if kind == "big_index":
            idx = [int(i) for i in rng.integers(0, length, int(rng.integers(1, 6)))]
            idx.insert(int(rng.integers(len(idx) + 1)), length + k - 1)
            return (np.array(idx) if self.chance(0.5) else idx), Raises(ValueError, argname, length + k - 1)
        if kind == "float_list":
            return [0.5, 1.0], Raises(TypeError, argname, "float64")
        if kind == "two_d":
            return np.zeros((2, 2), dtype=np.int64), Raises(TypeError, argname, "(2, 2)")
        if kind == "mask":
            return np.ones(length, dtype=bool), Raises(TypeError, argname, "bool")
        if kind == "empty_list":
            return [], Raises(ValueError, argname, "[]", "no rows")
        if kind == "zero":
            return 0, Raises(ValueError, argname, "0", "no rows")
        if kind == "empty_slice":
            j = int(rng.integers(0, length))
            v = slice(j, j)
            return v, Raises(ValueError, argname, _r(v), "no rows")
        if kind == "huge_uint":
            v = np.array([1, 2**63 + k], dtype=np.uint64)
            return v, Raises(ValueError, argname, 2**63 + k)
        if kind == "object_list":
            return [1, 10**20], Raises(TypeError, argname, "object")
        return ["a", "b"], Raises(TypeError, argname, "<U1")

    def bad_num_slices(self):
        k = int(self.rng.integers(1, 20))
        v, exc = self.pick([(0, ValueError), (-k, ValueError), (k + 0.5, ValueError), ("2", TypeError),
                            (None, TypeError), (True, TypeError), ([2], TypeError), (2 + 1j, TypeError)])
        return v, Raises(exc, "num_slices", _r(v))

    def bad_op(self):
        v = self.pick(["mean", "MAX", "median", "average", "", 1, True, None, ("sum",)])
        return v, Raises(ValueError, "op", _r(v))

    def bad_rank(self):
        n = self.n
        k = int(self.rng.integers(0, 10))
        v, exc = self.pick([(-1 - k, ValueError), (n + k, ValueError), (1.5, TypeError), ("0", TypeError),
                            (None, TypeError), (True, TypeError), ([0], TypeError)])
        return v, Raises(exc, "rank", _r(v))

    def bad_flag(self, argname):
        v = self.pick(["yes", 1, 0, None, "False", [True]])
        return v, Raises(TypeError, argname, _r(v))

    def bad_shared_vars(self):
        e = self.e
        v, mention, exc = self.pick([
            ("s", "'s'", TypeError), (e.v.x, "x", TypeError), (np.zeros(3), "array", TypeError),
            (3, "3", TypeError), ([], "[]", TypeError), ([e.v.s, "k"], "'k'", TypeError),
            ((e.v.s, None), "None", TypeError), (e.v.free, "free", ValueError),
            ([e.v.k, e.v.free], "free", ValueError), (None, "None", TypeError)])
        return v, Raises(exc, "shared_var" if exc is TypeError else "not used", mention)

    def bad_values(self, var):
        """A value that does not fit shared variable ``var``: (value, Raises)."""
        rng = self.rng
        kind = self.pick(["ndim", "float64", "str", "ragged", "static", "data_dtype", "data_ndim",
                          "data_nomem", "complex"])
        if kind == "ndim" or (kind == "static" and var is not self.e.v.st):
            v = np.zeros((2,) * (var.ndim + 1), dtype=var.dtype)
            return v, Raises(TypeError, "values", "ndim %d" % (var.ndim + 1))
        if kind == "float64":
            v = rng.standard_normal((3,) * var.ndim) + 0.1
            return v, Raises(TypeError, "values", "float64")
        if kind == "complex":
            v = np.ones((3,) * var.ndim, dtype=np.complex64)
            return v, Raises(TypeError, "values", "complex64")
        if kind == "str":
            return "abc", Raises(TypeError, "values", "'abc'")
        if kind == "ragged":
            return [[1.0], [1.0, 2.0]], Raises(TypeError, "values", "[[1.0], [1.0, 2.0]]")
        if kind == "static":
            n = int(self.pick([1, 2, 4, 7]))
            return np.zeros(n, dtype=F32), Raises(TypeError, "values", "(%d,)" % n, "fixed to (3,)")
        if kind == "data_dtype":
            d = self.e.d64 if var.ndim == 2 else self.e.dv64
            return d, Raises(TypeError, "values", "float64")
        if kind == "data_ndim":
            d = self.e.dv if var.ndim == 2 else self.e.dx
            return d, Raises(TypeError, "values", "ndim")
        if var.dtype != F32:  # the dtype does not fit either: which is said first is not specified
            return self.e.dnomem1, Raises((TypeError, ValueError), "values")
        return (self.e.dnomem if var.ndim == 2 else self.e.dnomem1), Raises(ValueError, "values", "no memory")

    # ---------------------------------------------------------------- values
    def value_for(self, var, length=None, special=True):
        """A sound random value for ``var`` (NaN/Inf sometimes, for floats)."""
        rng = self.rng
        if var is self.e.v.st:
            shape = (3,)
        elif var.ndim == 2:
            shape = (length if length is not None else int(rng.integers(1, 16)), 3)
        else:
            shape = (length if length is not None else int(rng.integers(1, 8)),)
        if np.dtype(var.dtype).kind == "i":
            return rng.integers(-50, 50, shape).astype(var.dtype)
        v = rng.standard_normal(shape).astype(var.dtype)
        if special and self.chance(0.1) and v.size:
            v.flat[int(rng.integers(v.size))] = self.pick([np.nan, np.inf, -np.inf])
        return v

    def selection(self, length, allow_list=True):
        """A sound, non-empty selection over ``length`` rows, as the user gives it."""
        rng = self.rng
        kind = self.pick(["int", "slice", "open", "list", "array"] if allow_list else ["int", "slice"])
        if kind == "int":
            return int(rng.integers(1, length + 1))
        if kind == "slice":
            a = int(rng.integers(0, length))
            return slice(a, int(rng.integers(a + 1, length + 1)))
        if kind == "open":
            return slice(int(rng.integers(0, length)), None)
        idx = rng.integers(0, length, int(rng.integers(1, 2 * length)))
        if kind == "list":
            return [int(i) for i in idx]
        return idx.astype(self.pick(["int64", "int32", "uint16"]))

    # ----------------------------------------------------------- function calls
    def call_fa(self):
        e, v, rng = self.e, self.e.v, self.rng
        what = self.pick(["input", "count", "keyword", "batch", "batch", "num_slices", "output_subset",
                          "batch_s", "valid", "valid", "valid"])
        api = "Function.__call__"
        if what == "input":
            slot = int(rng.integers(2))
            bad, why, exc = self.pick([
                (np.zeros((4, 3), dtype=F32), "ndarray", TypeError), ([1.0, 2.0], "list", TypeError),
                (None, "NoneType", TypeError), (7, "int", TypeError), ("dx", "str", TypeError),
                (e.d64 if slot == 0 else e.dv64, "float64", TypeError),
                (e.dv if slot == 0 else e.dx, "ndim", TypeError),
                (e.dnomem if slot == 0 else e.dnomem1, "no memory", ValueError),
                (e.di, "int32", TypeError)])
            args = [e.dx, e.db]
            args[slot] = bad
            name = ["x", "b"][slot]
            return Case(api, "input %s = %s" % (name, why), lambda: v.fa(*args),
                        Raises(exc, "input %d (%s)" % (slot, name), why))
        if what == "count":
            args = self.pick([[e.dx], [e.dx, e.db, e.db], []])
            return Case(api, "%d inputs" % len(args), lambda: v.fa(*args),
                        Raises(TypeError, "takes 2 data inputs, got %d" % len(args)))
        if what == "keyword":
            key = self.pick(["q", "xx", "batchsize", "X"])
            return Case(api, "unknown keyword %s" % key, lambda: v.fa(e.dx, e.db, **{key: e.db}),
                        Raises(TypeError, "unknown input name %r" % key))
        if what == "batch":
            bad, expect = self.bad_selection("batch", N_ROWS)
            return Case(api, "batch=%r" % (bad,), lambda: v.fa(e.dx, e.db, batch=bad), expect)
        if what == "num_slices":
            bad, expect = self.bad_num_slices()
            return Case(api, "num_slices=%r" % (bad,), lambda: v.fa(e.dx, e.db, num_slices=bad), expect)
        if what == "output_subset":
            bad, exc = self.pick([([4], ValueError), ([0, 9], ValueError), ([-1], ValueError),
                                  ("0", TypeError), (0, TypeError), ([0.5], TypeError), ([None], TypeError),
                                  ({0}, TypeError), ((True,), TypeError)])
            return Case(api, "output_subset=%r" % (bad,), lambda: v.fa(e.dx, e.db, output_subset=bad),
                        Raises(exc, "output_subset", _r(bad) if exc is TypeError else bad[-1]))
        if what == "batch_s":
            bad = self.pick([slice(0, 2), [0, 1], 3])
            return Case(api, "batch_s=%r on a function without sliceable shareds" % (bad,),
                        lambda: v.fa(e.dx, e.db, batch_s=bad), Raises(TypeError, "batch_s", _r(bad)))
        return self.valid_fa()

    def valid_fa(self):
        e, v, rng = self.e, self.e.v, self.rng
        data, xval = (e.dnan, e.nanval) if self.chance(0.15) else (e.dx, e.xval)
        kwargs = {}
        rows = np.arange(N_ROWS)
        if self.chance(0.7):
            kwargs["batch"] = self.selection(N_ROWS)
            rows = rows_of(kwargs["batch"], N_ROWS)
        if self.chance(0.4):
            kwargs["num_slices"] = int(self.pick([2, 3, 5, 100]))
        subset = None
        if self.chance(0.3):
            subset = [int(i) for i in rng.permutation(4)[:int(rng.integers(0, 5))]]
            kwargs["output_subset"] = subset
        xs = xval[rows]
        want = [np.sum(xs.dot(e.bval)), np.max(xs), np.mean(xs), (xs * 2).sum(axis=1)]

        def check(result):
            got = result if subset is not None else list(result)
            idx = subset if subset is not None else range(4)
            assert len(got) == len(idx)
            for g, i in zip(got, idx):
                if i == 3:
                    assert isinstance(g, list) and 1 <= len(g) <= self.n
                    g = np.concatenate(g)
                _close(g, want[i])

        return Case("Function.__call__", "valid %r" % (kwargs,), lambda: v.fa(data, e.db, **kwargs),
                    Valid(check))

    def call_fm(self):
        e, v = self.e, self.e.v
        what = self.pick(["short", "lengths", "valid"])
        if what == "short":
            n = int(self.rng.integers(7, N_ROWS + 1))
            return Case("Function.__call__", "minibatch input shorter than batch=%d" % n,
                        lambda: v.fm(e.dx, e.dm_short, batch=n),
                        Raises(ValueError, "minibatch input", "has 6 rows", "selects %d" % n))
        if what == "lengths":
            return Case("Function.__call__", "inputs of 20 and 7 rows", lambda: v.fm(e.dx, e.dx7),
                        Raises(ValueError, "different lengths [20, 7]"))
        sel = self.selection(N_ROWS)
        rows = rows_of(sel, N_ROWS)
        if len(rows) > N_ROWS:  # the minibatch input has N_ROWS rows
            sel = rows = rows[:N_ROWS]
        want = np.sum(e.xval[rows] * e.mval[:len(rows)])
        return Case("Function.__call__", "valid minibatch, batch=%r" % (sel,),
                    lambda: v.fm(e.dx, e.dm, batch=sel), Valid(lambda r: _close(r, want)))

    def call_fi(self):
        e, v = self.e, self.e.v
        if self.chance(0.5):
            bad, why = self.pick([(e.dif, "float32"), (e.di64, "int64")])
            return Case("Function.__call__", "input i = %s Data" % why, lambda: v.fi(bad),
                        Raises(TypeError, "input 0 (i)", why))
        sel = self.selection(N_ROWS)
        want = np.sum(e.ival[rows_of(sel, N_ROWS)].astype(np.int64))
        return Case("Function.__call__", "valid int, batch=%r" % (sel,),
                    lambda: v.fi(e.di16, batch=sel), Valid(lambda r: _close(r, want)))

    def call_fs(self):
        v, ref = self.e.v, self.e.ref
        lengths = [len(a) for a in ref.of(v.sh)]
        if min(lengths) == 0:
            if max(lengths) == 0:
                return Case("Function.__call__", "sh has no rows on any rank", lambda: v.fs(),
                            Raises(ValueError, "no rows"))
            value = self.value_for(v.sh, length=N_SH)
            return Case("broadcast", "valid sh (rows again)", lambda: synk.broadcast(v.sh, value),
                        Valid(lambda r: follow(lambda: ref.broadcast([ref.k(v.sh)], [value]))))
        what = self.pick(["batch_s", "batch_s", "per_rank", "batch", "num_slices", "too_long", "valid",
                          "valid", "valid"])
        api = "Function.__call__"
        if what == "batch_s":
            bad, expect = self.bad_selection("batch_s", min(lengths))
            if isinstance(bad, numbers.Integral) or isinstance(bad, (dict, float)) or bad is True:
                expect = Raises(TypeError, "batch_s", _r(bad))  # an int is no batch_s
            elif isinstance(bad, slice) and bad.stop is not None and bad.stop > min(lengths) \
                    and bad.start >= 0 and bad.step is None and bad.stop >= bad.start:
                expect = Raises((ValueError, synk.WorkerError), "batch_s", "needs %d rows" % bad.stop)
            elif self.last_kind == "big_index":
                top = int(np.max(bad))
                expect = Raises((ValueError, synk.WorkerError), "batch_s", "largest index %d" % top)
            return Case(api, "batch_s=%r" % (bad,), lambda: v.fs(batch_s=bad), expect)
        if what == "per_rank":
            kind = self.pick(["count", "mixed", "entry"])
            if kind == "count":
                k = self.pick([1, 2, self.n + 1, self.n + 3])
                if k == self.n:
                    k += 1
                bad = [slice(0, 1)] * k
                return Case(api, "batch_s per rank x%d" % k, lambda: v.fs(batch_s=bad),
                            Raises(ValueError, "batch_s", "each of the %d ranks, got %d" % (self.n, k)))
            if kind == "mixed":
                bad = [slice(0, 1)] + [[0, 1]] * (self.n - 1)
                return Case(api, "batch_s mixing slices and lists", lambda: v.fs(batch_s=bad),
                            Raises(TypeError, "batch_s", "one type"))
            bad = [[0]] * (self.n - 1) + ["ab"]
            return Case(api, "batch_s per rank with 'ab'", lambda: v.fs(batch_s=bad),
                        Raises(TypeError, "batch_s", "'ab'"))
        if what == "batch":
            return Case(api, "batch on a function without scattered inputs", lambda: v.fs(batch=2),
                        Raises(TypeError, "batch=2", "no scattered inputs"))
        if what == "num_slices":
            bad, expect = self.bad_num_slices()
            return Case(api, "num_slices=%r" % (bad,), lambda: v.fs(num_slices=bad), expect)
        if what == "too_long":
            if len(set(lengths)) == 1:  # shorten sh on one rank first
                r = int(self.rng.integers(self.n))
                return self._set_value_case(r, v.sh, ref.of(v.sh)[r][:max(1, lengths[r] - 3)], None)
            top = max(lengths)
            bad = slice(0, top)
            return Case(api, "batch_s=%r beyond a shorter rank's rows" % (bad,), lambda: v.fs(batch_s=bad),
                        Raises((ValueError, synk.WorkerError), "batch_s", "needs %d rows" % top))
        return self.valid_fs(lengths)

    def valid_fs(self, lengths):
        v = self.e.v
        values = self.e.ref.of(v.sh)
        kwargs = {}
        if self.chance(0.7):
            if self.chance(0.5):
                sel = self.selection(min(lengths))
                if isinstance(sel, numbers.Integral):
                    sel = slice(0, sel)
                elif isinstance(sel, slice) and sel.stop is None:  # batch_s has no length to fill in
                    sel = slice(sel.start, min(lengths))
                kwargs["batch_s"] = sel
                sels = [sel] * self.n
            else:
                as_slices = self.chance(0.5)
                sels = []
                for n in lengths:
                    if as_slices:
                        a = int(self.rng.integers(0, n))
                        sels.append(slice(a, int(self.rng.integers(a, n + 1))))
                    else:
                        sels.append([int(i) for i in self.rng.integers(0, n, int(self.rng.integers(0, 6)))])
                if not any(len(rows_of(s, n)) for s, n in zip(sels, lengths)):
                    sels[0] = slice(0, 1) if as_slices else [0]
                kwargs["batch_s"] = sels
        else:
            sels = [None] * self.n
        if self.chance(0.3):
            kwargs["num_slices"] = int(self.pick([2, 3]))
        parts = [a if s is None else a[rows_of(s, len(a))] for a, s in zip(values, sels)]
        parts = [p for p in parts if len(p)]
        # np.max, not max(): Python's max() skips a NaN depending on where it is
        want = [np.sum([np.sum(p) for p in parts]), np.max([np.max(p) for p in parts])]
        return Case("Function.__call__", "valid fs %r" % (kwargs,), lambda: v.fs(**kwargs),
                    Valid(lambda r: [_close(g, w) for g, w in zip(r, want)]))

    def call_fv(self):
        v, ref = self.e.v, self.e.ref
        want = [sum(np.sum(a) for a in ref.of(var)) for var in (v.s, v.k, v.st)]
        return Case("Function.__call__", "valid fv", lambda: v.fv(),
                    Valid(lambda r: [_close(g, w) for g, w in zip(r, want)]))

    # ------------------------------------------------------------- collectives
    def collective(self):
        name = self.pick(["broadcast", "scatter", "gather", "all_gather", "reduce", "all_reduce",
                          "set_value", "get_value", "get_shapes", "get_lengths"])
        if self.chance(0.45):
            return self.valid_collective(name)
        return getattr(self, "bad_" + name)()

    def _var(self, *exclude):
        return self.pick([var for var in self.e.v.shareds if var not in exclude])

    def _bad_common(self, name, call):
        """Malformed shared_vars for collective ``name``; ``call(shared_vars)``."""
        bad, expect = self.bad_shared_vars()
        return Case(name, "shared_vars=%r" % (bad,), lambda: call(bad), expect)

    def bad_broadcast(self):
        var = self._var()
        what = self.pick(["shared_vars", "values", "values", "count", "nccl"])
        if what == "shared_vars":
            return self._bad_common("broadcast", lambda sv: synk.broadcast(sv))
        if what == "values":
            bad, expect = self.bad_values(var)
            return Case("broadcast", "values=%s for %s" % (type(bad).__name__, var),
                        lambda: synk.broadcast(var, bad), expect)
        if what == "count":
            vals = [self.value_for(var)] * int(self.pick([1, 3]))
            return Case("broadcast", "%d values for 2 variables" % len(vals),
                        lambda: synk.broadcast([var, var], vals),
                        Raises(ValueError, "values", "one value for each of the 2"))
        bad, expect = self.bad_flag("nccl")
        return Case("broadcast", "nccl=%r" % (bad,), lambda: synk.broadcast(var, nccl=bad), expect)

    def bad_scatter(self):
        var = self._var(self.e.v.st)
        what = self.pick(["shared_vars", "values", "batch", "batch", "static"])
        if what == "shared_vars":
            value = self.value_for(var)
            return self._bad_common("scatter", lambda sv: synk.scatter(sv, value))
        if what == "values":
            bad, expect = self.bad_values(var)
            if isinstance(bad, np.ndarray) and bad.ndim == 0:
                expect = Raises(TypeError, "values")
            return Case("scatter", "values=%s for %s" % (type(bad).__name__, var),
                        lambda: synk.scatter(var, bad), expect)
        if what == "static":
            n = int(self.pick([2, 4, 5, 7]))
            value = np.zeros(n * self.n, dtype=F32)
            return Case("scatter", "%d rows into fixed shape (3,)" % len(value),
                        lambda: synk.scatter(self.e.v.st, value),
                        Raises(TypeError, "values", "(%d,)" % n, "fixed to (3,)"))
        value = self.value_for(var, length=int(self.rng.integers(3, 12)))
        bad, expect = self.bad_selection("batch", len(value), empty_is_bad=False)
        return Case("scatter", "batch=%r" % (bad,), lambda: synk.scatter(var, value, batch=bad), expect)

    def bad_gather(self):
        var = self._var()
        what = self.pick(["shared_vars", "nd_up", "nccl"])
        if what == "shared_vars":
            return self._bad_common("gather", lambda sv: synk.gather(sv))
        if what == "nd_up":
            bad = self.pick([2, -1, True, "1", None, 0.5])
            return Case("gather", "nd_up=%r" % (bad,), lambda: synk.gather(var, nd_up=bad),
                        Raises(ValueError, "nd_up", _r(bad)))
        bad, expect = self.bad_flag("nccl")
        return Case("gather", "nccl=%r" % (bad,), lambda: synk.gather(var, nccl=bad), expect)

    def bad_all_gather(self):
        var = self._var()
        if self.chance(0.5):
            return self._bad_common("all_gather", lambda sv: synk.all_gather(sv))
        if self.chance(0.5):
            return Case("all_gather", "st has a fixed shape", lambda: synk.all_gather(self.e.v.st),
                        Raises(TypeError, "(%d,)" % (3 * self.n), "fixed to (3,)"))
        bad, expect = self.bad_flag("nccl")
        return Case("all_gather", "nccl=%r" % (bad,), lambda: synk.all_gather(var, nccl=bad), expect)

    def _unequal(self, name, call):
        """A reduction over a variable whose shapes differ between ranks (made so
        first, by a sound set_value, if none is)."""
        ref, v = self.e.ref, self.e.v
        for var in (v.s, v.k, v.sh):
            if not ref.equal_shapes(ref.k(var)):
                return Case(name, "%s of unequal shapes %s" % (var, ref.shapes(ref.k(var))),
                            lambda var=var: call(var), Raises(ValueError, str(var), "shapes differ"))
        var = self.pick([v.s, v.k, v.sh])
        r = int(self.rng.integers(self.n))
        value = self.value_for(var, length=len(ref.of(var)[r]) + 1)
        return self._set_value_case(r, var, value, None)

    def bad_reduce(self):
        var = self._var()
        what = self.pick(["shared_vars", "op", "op", "in_place", "nccl", "unequal"])
        if what == "shared_vars":
            return self._bad_common("reduce", lambda sv: synk.reduce(sv))
        if what == "op":
            bad, expect = self.bad_op()
            return Case("reduce", "op=%r" % (bad,), lambda: synk.reduce(var, op=bad), expect)
        if what == "unequal":
            return self._unequal("reduce", lambda var: synk.reduce(var, in_place=False))
        bad, expect = self.bad_flag(what)
        return Case("reduce", "%s=%r" % (what, bad), lambda: synk.reduce(var, **{what: bad}), expect)

    def bad_all_reduce(self):
        var = self._var()
        what = self.pick(["shared_vars", "op", "op", "nccl", "unequal"])
        if what == "shared_vars":
            return self._bad_common("all_reduce", lambda sv: synk.all_reduce(sv))
        if what == "op":
            bad, expect = self.bad_op()
            return Case("all_reduce", "op=%r" % (bad,), lambda: synk.all_reduce(var, op=bad), expect)
        if what == "unequal":
            return self._unequal("all_reduce", lambda var: synk.all_reduce(var))
        bad, expect = self.bad_flag("nccl")
        return Case("all_reduce", "nccl=%r" % (bad,), lambda: synk.all_reduce(var, nccl=bad), expect)

    def bad_set_value(self):
        var = self._var()
        what = self.pick(["rank", "rank", "shared_vars", "values", "values", "batch", "count"])
        value = self.value_for(var)
        if what == "rank":
            bad, expect = self.bad_rank()
            return Case("set_value", "rank=%r" % (bad,), lambda: synk.set_value(bad, var, value), expect)
        if what == "shared_vars":
            return self._bad_common("set_value", lambda sv: synk.set_value(0, sv, value))
        if what == "values":
            bad, expect = self.bad_values(var)
            return Case("set_value", "values=%s for %s" % (type(bad).__name__, var),
                        lambda: synk.set_value(1, var, bad), expect)
        if what == "count":
            return Case("set_value", "3 values for 2 variables",
                        lambda: synk.set_value(1, [var, var], [value] * 3),
                        Raises(ValueError, "values", "one value for each of the 2"))
        bad, expect = self.bad_selection("batch", len(value), empty_is_bad=False)
        return Case("set_value", "batch=%r" % (bad,), lambda: synk.set_value(1, var, value, batch=bad),
                    expect)

    def bad_get_value(self):
        var = self._var()
        if self.chance(0.5):
            bad, expect = self.bad_rank()
            return Case("get_value", "rank=%r" % (bad,), lambda: synk.get_value(bad, var), expect)
        return self._bad_common("get_value", lambda sv: synk.get_value(0, sv))

    def bad_get_shapes(self):
        return self._bad_common("get_shapes", lambda sv: synk.get_shapes(sv))

    def bad_get_lengths(self):
        return self._bad_common("get_lengths", lambda sv: synk.get_lengths(sv))

    # ------------------------------------------------------ collectives, sound
    def _set_value_case(self, rank, var, value, batch):
        ref = self.e.ref

        def check(result):
            assert result is None
            follow(lambda: ref.set_value(rank, [ref.k(var)], [value], batch))

        return Case("set_value", "valid rank %d %s%s" % (rank, var, "" if batch is None else " batch"),
                    lambda: synk.set_value(rank, var, value, batch=batch), Valid(check))

    def valid_collective(self, name):
        ref, v, n = self.e.ref, self.e.v, self.n
        var = self._var()
        k = ref.k(var)
        if name == "broadcast":
            value = self.value_for(var) if self.chance(0.7) else None

            def check(result):
                follow(lambda: ref.broadcast([k], None if value is None else [value]))

            return Case(name, "valid %s" % var, lambda: synk.broadcast(var, value), Valid(check))
        if name == "scatter":
            var = self._var(v.st)
            value = self.value_for(var, length=int(self.rng.integers(n, 4 * n)))
            batch = self.selection(len(value)) if self.chance(0.5) else None

            def check(result):
                follow(lambda: ref.scatter([ref.k(var)], [value], batch))

            return Case(name, "valid %s" % var, lambda: synk.scatter(var, value, batch=batch), Valid(check))
        if name == "gather":
            nd_up = self.pick([0, 1])

            def check(result):
                want = follow(lambda: ref.gather([k], nd_up))[0]
                if isinstance(want, list):  # ranks' values of different shapes
                    assert isinstance(result, list) and len(result) == n
                    for g, w in zip(result, want):
                        _close(g, w)
                else:
                    _close(result, want)

            return Case(name, "valid %s nd_up=%d" % (var, nd_up), lambda: synk.gather(var, nd_up=nd_up),
                        Valid(check))
        if name == "all_gather":
            var = self._var(v.st)
            if sum(len(a) for a in ref.of(var)) > 40:  # keep the values small: broadcast instead
                return self.valid_collective("broadcast")

            def check(result):
                follow(lambda: ref.all_gather([ref.k(var)]))

            return Case(name, "valid %s" % var, lambda: synk.all_gather(var), Valid(check))
        if name in ("reduce", "all_reduce"):
            if not ref.equal_shapes(k):
                return self._unequal(name, getattr(synk, name))
            op = self.pick(["avg", "sum", "prod", "max", "min"])
            if name == "all_reduce":
                return Case(name, "valid %s op=%s" % (var, op), lambda: synk.all_reduce(var, op=op),
                            Valid(lambda r: follow(lambda: ref.all_reduce([k], op))))
            in_place = self.chance(0.5)

            def check(result):
                (want, _), = follow(lambda: ref.reduce([k], op, in_place))
                if in_place:
                    assert result is None
                else:
                    _close(result, want)

            return Case(name, "valid %s op=%s in_place=%s" % (var, op, in_place),
                        lambda: synk.reduce(var, op=op, in_place=in_place), Valid(check))
        if name == "set_value":
            r = int(self.rng.integers(n))
            value = self.value_for(var)
            batch = self.selection(len(value)) if var is not v.st and self.chance(0.4) else None
            return self._set_value_case(r, var, value, batch)
        if name == "get_value":
            r = int(self.rng.integers(n))
            want = ref.vals[k][r]
            return Case(name, "valid rank %d %s" % (r, var), lambda: synk.get_value(r, var),
                        Valid(lambda got: _close(got, want)))
        if name == "get_shapes":
            want = ref.shapes(k)
            return Case(name, "valid %s" % var, lambda: synk.get_shapes(var),
                        Valid(lambda got: got == want or _fail(got, want)))
        want = ref.lengths(k)
        return Case(name, "valid %s" % var, lambda: synk.get_lengths(var),
                    Valid(lambda got: got == want or _fail(got, want)))

    # -------------------------------------------------------------------- Data
    def data(self):
        if self.chance(0.3):
            return self.valid_data()
        e, rng = self.e, self.rng
        what = self.pick(["empty", "dtype", "ndim", "shape", "oversize", "var", "conflict", "value",
                          "flag", "name", "cast"])
        api = "data"
        if what == "empty":
            return Case(api, "no specification", lambda: synk.data(),
                        Raises(TypeError, "incomplete specification"))
        if what == "dtype":
            bad = self.pick(["notadtype", "object", object, "U5", "datetime64[s]", "S3", 3.5])
            return Case(api, "dtype=%r" % (bad,), lambda: synk.data(dtype=bad, ndim=1),
                        Raises(TypeError, "dtype", np.dtype(bad).name if bad in (object, "object") else bad
                               if isinstance(bad, str) and bad == "notadtype" else "dtype"))
        if what == "ndim":
            bad, exc = self.pick([(-1, TypeError), (1.5, TypeError), ("2", TypeError), (True, TypeError)])
            return Case(api, "ndim=%r" % (bad,), lambda: synk.data(dtype=F32, ndim=bad),
                        Raises(exc, "ndim", _r(bad)))
        if what == "shape":
            bad, mention = self.pick([(5, "5"), ((2, -1), "(2, -1)"), (("a",), "('a',)"), ((1.5,), "(1.5,)"),
                                      ("ab", "'ab'")])
            return Case(api, "shape=%r" % (bad,), lambda: synk.data(dtype=F32, shape=bad),
                        Raises(TypeError, "shape", mention))
        if what == "oversize":
            bad = self.pick([0.5, 3, "a", float("nan"), True, None, -1])
            return Case(api, "oversize=%r" % (bad,),
                        lambda: synk.data(np.zeros(3, dtype=F32), oversize=bad),
                        Raises(ValueError, "oversize", _r(bad)))
        if what == "var":
            bad, mention = self.pick([("x", "'x'"), (3, "3"), (np.zeros(3), "array("), (e.v.fa, "Function")])
            return Case(api, "var=%s" % mention, lambda: synk.data(var=bad),
                        Raises(TypeError, "var", mention))
        if what == "conflict":
            if self.chance(0.5):
                return Case(api, "var=x with dtype int32", lambda: synk.data(var=e.v.x, dtype="int32"),
                            Raises(TypeError, "dtype", "'int32'", "conflicts"))
            return Case(api, "var=x with ndim 1", lambda: synk.data(var=e.v.x, ndim=1),
                        Raises(TypeError, "ndim", "1", "conflicts"))
        if what == "value":
            bad, mention = self.pick([([[1.0], [1.0, 2.0]], "inhomogeneous"),
                                      (np.array([object(), 1]), "object"),
                                      (np.array(["a", "bc"]), "<U2"), ({"a": 1}, "object"),
                                      (e.dnomem, "no memory")])
            exc = ValueError if mention == "no memory" else TypeError
            return Case(api, "value=%s" % mention, lambda: synk.data(bad), Raises(exc, "value", mention))
        if what == "flag":
            arg = self.pick(["minibatch", "force_cast"])
            bad, expect = self.bad_flag(arg)
            return Case(api, "%s=%r" % (arg, bad), lambda: synk.data(np.zeros(3, dtype=F32), **{arg: bad}),
                        expect)
        if what == "name":
            bad = self.pick([3, ["x"], b"x"])
            return Case(api, "name=%r" % (bad,), lambda: synk.data(np.zeros(2, dtype=F32), name=bad),
                        Raises(TypeError, "name", _r(bad)))
        value = rng.standard_normal(4)
        return Case(api, "float64 value as float32", lambda: synk.data(value, dtype=F32),
                    Raises(TypeError, "value", "float64", "force_cast"))

    def valid_data(self):
        rng = self.rng
        dtype = self.pick([F32, "float64", "int16", "int64", "bool", "complex64", "uint8"])
        shape = tuple(int(d) for d in rng.integers(0, 5, int(rng.integers(0, 4))))
        value = (rng.standard_normal(shape) * 10).astype(dtype)
        minibatch = self.chance(0.3)

        def check(d):
            assert d.dtype == np.dtype(dtype).name and d.ndim == len(shape) and d.minibatch == minibatch
            np.testing.assert_array_equal(d.data, value)

        return Case("data", "valid %s %s" % (dtype, shape), lambda: synk.data(value, minibatch=minibatch),
                    Valid(check))

    def data_method(self):
        d = self.e.scratch
        rng = self.rng
        what = self.pick(["set_value", "set_value", "set_length", "set_shape", "oversize", "force_cast",
                          "valid", "valid"])
        api = "Data.%s" % what
        if what == "set_value":
            bad, mention = self.pick([(np.zeros(3, dtype=F32), "ndim=1"),
                                      (np.zeros((2, 2, 2), F32), "ndim=3"),
                                      (rng.standard_normal((2, 3)), "float64"),
                                      ([[1.0], [1.0, 2.0]], "inhomogeneous"), ("abc", "<U3"),
                                      (np.ones((2, 3), dtype=np.complex64), "complex64")])
            return Case(api, mention, lambda: d.set_value(bad), Raises(TypeError, "input_data", mention))
        if what == "set_length":
            bad, exc = self.pick([(-1, ValueError), ("a", ValueError), (1.5, ValueError), (None, ValueError),
                                  (True, ValueError)])
            return Case(api, "length=%r" % (bad,), lambda: d.set_length(bad), Raises(exc, "length", _r(bad)))
        if what == "set_shape":
            bad, mention = self.pick([("ab", "'ab'"), ((-1, 3), "(-1, 3)"), ((2,), "(2,)"),
                                      ((1.5, 3), "(1.5, 3)"),
                                      (5, "5"), ((2, 3, 4), "(2, 3, 4)")])
            return Case(api, "shape=%r" % (bad,), lambda: d.set_shape(bad),
                        Raises(TypeError, "shape", mention))
        if what == "oversize":
            bad = self.pick([0.5, 3, "a", float("nan"), True])
            call = self.pick([lambda: d.set_value(np.zeros((2, 3), F32), oversize=bad),
                              lambda: d.set_shape((2, 3), oversize=bad)])
            return Case("Data.set_value", "oversize=%r" % (bad,), call,
                        Raises(ValueError, "oversize", _r(bad)))
        if what == "force_cast":
            bad, expect = self.bad_flag("force_cast")
            return Case("Data.set_value", "force_cast=%r" % (bad,),
                        lambda: d.set_value(np.zeros((2, 3), F32), force_cast=bad), expect)
        shape = (int(rng.integers(0, 30)), 3)
        value = rng.standard_normal(shape).astype(F32)
        if self.chance(0.5):
            return Case("Data.set_value", "valid %s" % (shape,), lambda: d.set_value(value, oversize=1.5),
                        Valid(lambda r: np.testing.assert_array_equal(d.data, value)))
        old = np.array(d.data)
        n = shape[0]

        def check(result):
            assert d.shape == (n, 3)
            keep = min(n, len(old))
            np.testing.assert_array_equal(d.data[:keep], old[:keep])

        return Case("Data.set_length", "valid %d" % n, lambda: d.set_length(n), Valid(check))

    def build_inputs(self):
        fa = self.e.v.fa
        what = self.pick(["count", "minibatch", "value"])
        if what == "count":
            return Case("Function.build_inputs", "1 value for 2 inputs",
                        lambda: fa.build_inputs(np.zeros((2, 3), F32)),
                        Raises(TypeError, "takes 2 data inputs"))
        if what == "minibatch":
            return Case("Function.build_inputs", "minibatch list of 3 for 2 inputs",
                        lambda: fa.build_inputs(np.zeros((2, 3), F32), np.zeros(3, F32),
                                                minibatch=[True, False, True]),
                        Raises(ValueError, "minibatch", "2 entries, got 3"))
        return Case("Function.build_inputs", "ragged value",
                    lambda: fa.build_inputs([[1.0], [1.0, 2.0]], np.zeros(3, F32)),
                    Raises(TypeError, "build_inputs: input 0 (x)", "inhomogeneous"))

    # --------------------------------------------------------------- the draw
    def distributed_case(self):
        """A case for a distributed session."""
        kind = self.pick(["fa", "fa", "fa", "fm", "fi", "fs", "fs", "fv", "coll", "coll", "coll", "coll",
                          "data", "data", "data_method", "build_inputs"])
        return {"fa": self.call_fa, "fm": self.call_fm, "fi": self.call_fi, "fs": self.call_fs,
                "fv": self.call_fv, "coll": self.collective, "data": self.data,
                "data_method": self.data_method, "build_inputs": self.build_inputs}[kind]()


# ------------------------------------------------------------- other states
def _public_calls(v, d):
    """Every public call, with sound arguments, that needs a session."""
    x = np.zeros(3, dtype=F32)
    return {
        "function": lambda: synk.function([v.x], v.x.sum()) if v is not None else
        synk.function([pt.vector("q")], pt.vector("q").sum()),
        "distribute": lambda: synk.distribute(),
        "data": lambda: synk.data(x),
        "synchronize": lambda: synk.synchronize(),
        "broadcast": lambda: synk.broadcast(v.s),
        "scatter": lambda: synk.scatter(v.s, x),
        "gather": lambda: synk.gather(v.s),
        "all_gather": lambda: synk.all_gather(v.s),
        "reduce": lambda: synk.reduce(v.s),
        "all_reduce": lambda: synk.all_reduce(v.s),
        "set_value": lambda: synk.set_value(0, v.s, x),
        "get_value": lambda: synk.get_value(0, v.s),
        "get_shapes": lambda: synk.get_shapes(v.s),
        "get_lengths": lambda: synk.get_lengths(v.s),
        "Function.__call__": lambda: v.fa(d, d),
    }


def unforked_cases(rng, v, d, n_cases):
    """Calls before ``fork()`` (or after ``close()``, with objects of the closed
    session ``v``, ``d``) and malformed ``fork()`` arguments."""
    calls = _public_calls(v, d)
    cases = []
    fork_bad = [
        ("n_parallel", 0, ValueError), ("n_parallel", -3, ValueError), ("n_parallel", "2", TypeError),
        ("n_parallel", 2.5, TypeError), ("n_parallel", True, TypeError), ("use_gpu", "yes", TypeError),
        ("use_gpu", 1, TypeError), ("master_rank", -1, ValueError), ("master_rank", "0", TypeError),
        ("master_rank", 9, ValueError), ("max_n_var", 0, ValueError), ("max_dim", "a", TypeError),
        ("precision", "fp16", ValueError), ("precision", None, ValueError), ("timeout", 0, ValueError),
        ("timeout", "60", TypeError), ("timeout", -1.0, ValueError), ("profile_workers", "yes", TypeError),
        ("profile_workers", 1, TypeError),
    ]
    for _ in range(n_cases):
        if rng.random() < 0.5:
            name = sorted(calls)[int(rng.integers(len(calls)))]
            if v is None and name not in ("function", "distribute", "data", "synchronize"):
                name = "data"
            expect = Raises(RuntimeError, "fork()")
            cases.append(Case(name, "before fork()" if v is None else "after close()", calls[name], expect))
        else:
            arg, bad, exc = fork_bad[int(rng.integers(len(fork_bad)))]
            kwargs = {"use_gpu": False, "n_parallel": 2, arg: bad}
            cases.append(Case("fork", "%s=%r" % (arg, bad), lambda kw=kwargs: synk.fork(**kw),
                              Raises(exc, arg, _r(bad))))
    return cases


def forked_cases(rng, v, d, n_cases):
    """Calls between ``fork()`` and ``distribute()``: those that need
    distribute() first, and malformed ``function()`` arguments."""
    calls = _public_calls(v, d)
    needs = ["broadcast", "scatter", "gather", "all_gather", "reduce", "all_reduce", "set_value", "get_value",
             "get_shapes", "get_lengths", "Function.__call__"]
    x, y, s, free, s0 = v.x, v.b, v.s, v.free, pytensor.shared(np.float32(0), name="s0")
    bad_function = [
        ("inputs='x'", lambda: synk.function("x", x.sum()), TypeError, "inputs", "'x'"),
        ("inputs=[x, 3]", lambda: synk.function([x, 3], x.sum()), TypeError, "inputs", "3"),
        ("inputs=[x, x]", lambda: synk.function([x, x], x.sum()), ValueError, "inputs", "x", "twice"),
        ("0-d input", lambda: synk.function([pt.scalar("a")], pt.scalar("a") * 2), TypeError, "input", "0-d"),
        ("bcast_inputs='b'", lambda: synk.function([x], x.sum(), bcast_inputs="b"), TypeError,
         "bcast_inputs", "'b'"),
        ("outputs=5", lambda: synk.function([x], 5), TypeError, "outputs", "5"),
        ("outputs op 'mean'", lambda: synk.function([x], (x.sum(), "mean")), ValueError, "reduce operation",
         "'mean'"),
        ("outputs=[z, 'a']", lambda: synk.function([x], [x.sum(), "a"]), TypeError, "output", "'a'"),
        ("updates target x", lambda: synk.function([x], x.sum(), updates=[(y, y + 1)]), TypeError,
         "update target", "b"),
        ("updates op 'median'", lambda: synk.function([x], x.sum(), updates=[(s, s + 1, "median")]),
         ValueError, "update reduce operation", "'median'"),
        ("updates='s'", lambda: synk.function([x], x.sum(), updates="s"), TypeError, "updates", "'s'"),
        ("updates=[(s,)]", lambda: synk.function([x], x.sum(), updates=[(s,)]), TypeError, "update",
         "(s,)"),
        ("update of the wrong type", lambda: synk.function([x], x.sum(), updates=[(s, x)]), TypeError,
         "update", "s"),
        ("givens='g'", lambda: synk.function([x], x.sum(), givens="g"), TypeError, "givens", "'g'"),
        ("sliceable unused", lambda: synk.function([x], x.sum(), sliceable_shareds=[free]), ValueError,
         "sliceable shared variable", "free"),
        ("sliceable non-shared", lambda: synk.function([x], x.sum(), sliceable_shareds=[x]), TypeError,
         "sliceable_shareds", "[x]"),
        ("sliceable 0-d", lambda: synk.function([], s0 * 2, sliceable_shareds=[s0]), TypeError,
         "sliceable shared variable", "s0"),
        ("unknown keyword", lambda: synk.function([x], x.sum(), zz=1), TypeError, "zz"),
        ("mode='NOPE'", lambda: synk.function([x], x.sum(), mode="NOPE"), ValueError, "mode", "NOPE"),
    ]
    cases = []
    for _ in range(n_cases):
        if rng.random() < 0.4:
            name = needs[int(rng.integers(len(needs)))]
            cases.append(Case(name, "before distribute()", calls[name],
                              Raises(RuntimeError, "distribute()")))
        else:
            what, call, exc, *mentions = bad_function[int(rng.integers(len(bad_function)))]
            cases.append(Case("function", what, call, Raises(exc, *mentions)))
    return cases
