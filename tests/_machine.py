"""Model-based test of the whole public API: Hypothesis' stateful testing drives a
live Synkhronos session and ``_model.Reference`` (plain numpy and PyTensor) in
step, and after every step every rank's value of every shared variable, and
every Data, must equal the reference's.

Steps: ``data()``, ``Data.set_value``/``set_length``/item assignment/
``free_memory``, every collective with 1-4 variables per call (values as numpy
arrays, nested lists, other dtypes that PyTensor may or may not accept, or
Data), function calls with updates, ``batch``, ``batch_s`` (one for every rank
or one per rank), ``num_slices`` and ``output_subset``, and ``nccl=True/False``.
Payloads are drawn on both sides of every size threshold of the data path (a
command slot, the inline limit, the exchange segment's first size and its
growth: from a few bytes to a few MB) in every dtype the library accepts.

One session (``Session``) serves every example: forking anew for each would
spend the budget on start-up.  Each example begins by giving every variable a
known value.  Run as a script for long runs (``python tests/_machine.py
--help``); under ``mpirun`` every rank runs it and rank 0 drives.

Threads (``run_threads``, ``--threads K``): K machines drive the one session at
once, each from a thread of its own, against a reference of its own, on a Lane
of its own (variables and functions no other lane touches), so each must get
its own results however the threads' calls interleave.

Run as a script, it compiles as the suite does (``_flags.REFERENCE_FLAGS``,
unless ``PYTENSOR_FLAGS`` is set): the ranks as a user's (JAX on CPU ranks), the
reference each graph as written.
"""

import os

if __name__ == "__main__":
    from _flags import REFERENCE_FLAGS

    os.environ.setdefault("PYTENSOR_FLAGS", REFERENCE_FLAGS)

import argparse  # noqa: E402
import ast  # noqa: E402
import collections  # noqa: E402
import contextlib  # noqa: E402
import sys
import threading
import time
import traceback
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from _model import Freed, Reference, Refused, assert_matches
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import synkhronos as synk
from synkhronos._session import runtime
from synkhronos._wire.channel import SLOT_BYTES
from synkhronos._wire.exchange_buffer import INLINE_BYTES, MIN_SEGMENT

__all__ = ["Session", "Lane", "machine_for", "run", "run_threads", "STATS"]

ALL_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64", "complex64", "complex128")
# GPU ranks keep these exactly (with floatX float32, JAX narrows 64-bit types on the device).
GPU_DTYPES = ("bool", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32",
              "complex64")
NCCL_DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64")
WIDTH = 3  # columns of the 2-d values (some are drawn narrower)
HANG_S = 120.0  # fork(timeout=...): a step stuck this long is a hang
MAX_DATA = 8  # Data objects alive at once; older ones are dropped and collected
# Payload sizes in bytes, on both sides of every threshold of the data path.
BANDS = ((0, 48), (0, 400), (SLOT_BYTES - 300, SLOT_BYTES + 300), (INLINE_BYTES - 600, INLINE_BYTES + 600),
         (MIN_SEGMENT - 3000, MIN_SEGMENT + 3000), (2 * MIN_SEGMENT, 3 * MIN_SEGMENT))
OPS = ("avg", "sum", "prod", "max", "min")

STATS = collections.Counter(sequences=0, steps=0)
OUTCOMES = collections.Counter()  # (call, "done" or the exception it was refused with)
_COUNTING = threading.Lock()  # machines in several threads count into STATS and OUTCOMES


def _count(counter, key):
    """``counter[key] += 1``, which is no single step: two threads may both read the old count."""
    with _COUNTING:
        counter[key] += 1


def random_array(seed, dtype, shape):
    """Random values of ``dtype``: integers over their whole range (sums and
    products wrap), floats of either sign with an occasional infinity."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if rng.random() < 0.5:
            return rng.integers(-3 if dt.kind == "i" else 0, 4, shape).astype(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    values = rng.standard_normal(shape) * (1 if dt.itemsize <= 2 else 10.0 ** rng.integers(-3, 4))
    if dt.kind == "c":
        values = values + 1j * rng.standard_normal(shape)
    values = np.asarray(values).astype(dt)
    if values.size and rng.random() < 0.05 and dt.kind == "f":
        values.flat[rng.integers(values.size)] = np.inf if rng.random() < 0.5 else -np.inf
    return values


def _session_wide(name, doc):
    """A Lane's read-only view of its Session's ``name``."""
    return property(lambda lane: getattr(lane.session, name), doc=doc)


class Lane:
    """One machine's part of a Session: shared variables of every dtype (named
    with the suffix ``_L<index>``, none for lane 0) and the functions ``fx`` and
    ``fs`` on them.  A machine reads everything through its lane, so machines of
    different lanes can run in different threads at once without touching each
    other's variables; what is per session (the ranks, the device) is the
    Session's."""

    n = _session_wide("n", "ranks")
    master = _session_wide("master", "the master's rank")
    gpu = _session_wide("gpu", "whether the ranks are GPUs")
    xla = _session_wide("xla", "whether the functions compile with JAX (XLA rewrites NaN arithmetic)")
    mpi = _session_wide("mpi", "whether the session is an MPI launch")
    dtypes = _session_wide("dtypes", "the dtypes the variables and drawn values take")
    fdtype = _session_wide("fdtype", "the float dtype of the functions")
    rt = _session_wide("rt", "the live session's runtime")

    def __init__(self, session, index):
        self.session, self.index = session, index
        self.suffix = "_L%d" % index if index else ""
        self.first_error = None  # (when, exception) of the first failing step (see run_threads)

    @property
    def closed_by(self):
        return self.session.closed_by

    @closed_by.setter
    def closed_by(self, what):
        self.session.closed_by = what

    def device_refuses(self, dtype, op=None):
        return self.session.device_refuses(dtype, op)

    def failed(self, exc):
        """Note ``exc``, a step's error, if it is this lane's first."""
        if self.first_error is None:
            self.first_error = (time.monotonic(), exc)

    def build(self):
        """Make this lane's variables and functions (before ``distribute``)."""
        fd, sfx = self.fdtype, self.suffix
        self.variables = [pytensor.shared(np.zeros((1, WIDTH), dt), name="m_" + dt + sfx)
                          for dt in self.dtypes]
        self.variables += [pytensor.shared(np.zeros(2, "float32"), name="v" + sfx),
                           pytensor.shared(np.asarray(0, fd), name="s0" + sfx),
                           pytensor.shared(np.asarray(0, "int32" if self.gpu else "int64"), name="i0" + sfx)]
        acc = pytensor.shared(np.zeros(WIDTH, fd), shape=(WIDTH,), name="acc" + sfx)
        mx = pytensor.shared(np.zeros(WIDTH, fd), shape=(WIDTH,), name="mx" + sfx)
        sh = pytensor.shared(np.zeros((4, WIDTH), fd), name="sh" + sfx)
        holds = list(self.variables)
        self.variables += [acc, mx, sh]
        self.acc, self.mx, self.sh = range(len(self.variables) - 3, len(self.variables))
        x, b = pt.matrix("x", dtype=fd), pt.vector("b", dtype=fd)
        outputs = [(x.sum(axis=0), "sum"), (x.max(), "max"), x.mean(), ((2 * x).sum(axis=1), None)]
        self.fx = synk.function([x], outputs, bcast_inputs=[b], name="fx" + sfx,
                                updates=[(acc, acc + (x * b).sum(axis=0), "sum"),
                                         (mx, pt.maximum(mx, x.max(axis=0)), "max")])
        self.fs = synk.function([], [(sh.sum(axis=0), "sum"), (sh.max(), "max"), sh.mean()],
                                sliceable_shareds=[sh], name="fs" + sfx)
        # A function on the other variables, so that distribute() gives every rank a copy of each.
        synk.function([], [(pt.as_tensor(v).size, "sum") for v in holds], name="holds" + sfx)

    def initial(self, k):
        var = self.variables[k]
        shape = (var.type.shape[0],) if k in (self.acc, self.mx) else (1, WIDTH)[:var.ndim]
        if k == self.sh:
            shape = (4, WIDTH)
        return random_array(k, var.dtype, shape)

    def reset(self):
        """Every variable of this lane its initial value on every rank (nothing
        else from the last example matters; other lanes' variables are left
        alone, their machines may be running)."""
        self.session.ensure()
        synk.broadcast(self.variables, [self.initial(k) for k in range(len(self.variables))], nccl=False)


class Session:
    """One Synkhronos session with ``lanes`` independent Lanes (variables and
    functions for one machine each, all made before one ``distribute``), kept
    across examples, and restarted if a failure closed it, unless machines run
    in threads (see ``ensure``).  ``n`` ranks; ``use_gpu`` as for ``fork``."""

    def __init__(self, n, use_gpu=False, lanes=1):
        self.asked, self.use_gpu = n, use_gpu
        self.lanes = [Lane(self, i) for i in range(lanes)]
        self.rt = None
        self.closed_by = None  # what closed the last session
        self.concurrent = False  # machines run in threads (see run_threads): never restart

    def ensure(self):
        """Start the session if there is none, or restart it if a failure closed
        it; but a restart would only fail the machines of other threads (their
        variables gone) or of other MPI ranks: then raise instead."""
        if self.rt is not None and runtime.current() is not self.rt and (self.mpi or self.concurrent):
            raise RuntimeError("the session closed (%s), and %s" % (self.closed_by, (
                "an MPI launch has one" if self.mpi else "machines in other threads use it")))
        if self.rt is None or runtime.current() is not self.rt:
            self._start()

    def _start(self):
        synk.close()
        self.n = synk.fork(self.asked, use_gpu=self.use_gpu, timeout=HANG_S)
        rt = self.rt = runtime.current()
        self.master = rt.master_rank
        self.gpu = rt.device.name == "gpu"
        self.xla = self.gpu or rt.device.jax_default
        self.mpi = rt.cluster is not None
        self.dtypes = GPU_DTYPES if self.gpu else ALL_DTYPES
        self.fdtype = "float32" if self.gpu else "float64"
        for lane in self.lanes:
            lane.build()
        synk.distribute()

    def device_refuses(self, dtype, op=None):
        """Whether this session's device collective (``nccl=True``) refuses
        ``dtype`` (under ``op`` for reductions): NCCL's and MPI's type tables."""
        dt = np.dtype(dtype)
        if self.gpu:
            return dt.name not in NCCL_DTYPES
        if self.mpi:
            if dt.kind == "c" and op in ("max", "min"):
                return True
            from mpi4py import MPI

            try:
                return MPI.Datatype.fromcode(dt.char) == MPI.DATATYPE_NULL
            except (KeyError, ValueError):
                return True
        return False


def _draw(data, strategy, label):
    return data.draw(strategy, label=label)


class SessionMachine(RuleBasedStateMachine):
    """The public API against ``Reference`` (see the module docstring)."""

    session = None  # the Lane it drives (set by machine_for)

    @initialize()
    def begin(self):
        s = self.session
        s.reset()
        self.ref = Reference(s.n, s.master, s.variables, [s.initial(k) for k in range(len(s.variables))])
        self.pool = {}  # key -> Data, with its values in self.ref.datas[key]
        self.next_key = 0
        _count(STATS, "sequences")

    def teardown(self):
        self.pool = {}
        # Hypothesis calls this in a finally clause: an error that ends the sequence is in flight.
        exc = sys.exc_info()[1]
        if isinstance(exc, Exception) and not isinstance(exc, HypothesisException):
            self.session.failed(exc)

    # ---------------------------------------------------------------- drawing
    def _shape(self, data, var_ndim, dtype, static=None):
        if static is not None and _draw(data, st.booleans(), "static shape"):
            return tuple(static)
        nbytes = _draw(data, st.sampled_from(BANDS).flatmap(lambda b: st.integers(*b)), "bytes")
        item = np.dtype(dtype).itemsize
        if var_ndim == 0:
            return ()
        if var_ndim == 1:
            return (nbytes // item,)
        width = _draw(data, st.sampled_from((WIDTH, WIDTH, 1, 2)), "width")
        return (nbytes // (item * width), width)

    def _new_data(self, value, keep=()):
        key = self.next_key
        self.next_key += 1
        if len(self.pool) >= MAX_DATA:  # drop the oldest (not in keep): collected, its segment forgotten
            oldest = min(k for k in self.pool if k not in keep)
            del self.pool[oldest]
            del self.ref.datas[oldest]
        self.pool[key] = synk.data(value)
        self.ref.datas[key] = np.array(value)
        return key

    def _value(self, data, k, keep):
        """(what the call gets, what the reference gets) for variable ``k``; a
        new Data made for it keeps the Data of ``keep`` alive."""
        var = self.session.variables[k]
        static = var.type.shape if k in (self.session.acc, self.session.mx) else None
        shape = self._shape(data, var.ndim, var.dtype, static)
        seed = _draw(data, st.integers(0, 2**31), "seed")
        kind = _draw(data, st.sampled_from(("numpy", "numpy", "data", "list", "other dtype")), "given as")
        value = random_array(seed, var.dtype, shape)
        if kind == "list" and value.size <= 20000:
            listed = value.tolist()
            return listed, listed
        if kind == "other dtype":
            other = random_array(seed, _draw(data, st.sampled_from(self.session.dtypes), "dtype"), shape)
            return other, other
        if kind == "data":
            matching = [key for key, v in self.ref.datas.items()
                        if isinstance(v, Freed) or (np.can_cast(v.dtype, value.dtype, "safe")
                                                    and v.ndim == value.ndim)]
            if matching and _draw(data, st.booleans(), "an existing Data"):
                key = _draw(data, st.sampled_from(sorted(matching)), "Data")
            else:
                key = self._new_data(value, keep)
            keep.append(key)
            return self.pool[key], ("data", key)
        return value, value

    def _targets(self, data):
        """(shared_vars argument, variable indices, single)."""
        s = self.session
        # The functions' variables as often as all the others together.
        one = st.integers(0, len(s.variables) - 1) | st.sampled_from((s.acc, s.mx, s.sh))
        ks = _draw(data, st.lists(one, min_size=1, max_size=4), "variables")
        variables = [self.session.variables[k] for k in ks]
        single = len(ks) == 1 and _draw(data, st.booleans(), "one variable, not a list")
        return (variables[0] if single else variables), ks, single

    def _values(self, data, ks, single):
        keep = []  # the Data this call passes
        pairs = [self._value(data, k, keep) for k in ks]
        given = [p[0] for p in pairs]
        return (given[0] if single else given), [p[1] for p in pairs]

    def _batch(self, data, length):
        kind = _draw(data, st.sampled_from(("none", "int", "slice", "open", "list", "array", "past the end")),
                     "batch")
        if kind == "none":
            return None
        if kind == "past the end":
            return slice(0, length + 1)
        if kind == "int":
            return _draw(data, st.integers(0, length), "rows")
        if kind in ("slice", "open"):
            a = _draw(data, st.integers(0, length), "start")
            return slice(a, None) if kind == "open" else slice(a, _draw(data, st.integers(a, length), "stop"))
        if length == 0:
            return []
        idx = _draw(data, st.lists(st.integers(0, length - 1), max_size=40), "indices")
        if kind == "array":
            dtype = _draw(data, st.sampled_from(("int64", "int32", "uint32")), "index dtype")
            return np.array(idx, dtype=dtype)
        return idx

    def _nccl(self, data):
        return _draw(data, st.booleans(), "nccl")

    # ------------------------------------------------------------- checking
    def _expect(self, what, call, predict):
        """``(got, want)``: the call's result and the reference's; or
        ``(Refused, None)`` once the call raised what the reference said."""
        _count(STATS, "steps")
        try:
            want = predict()
        except Refused as refused:
            try:
                self._call(what, call)
            except refused.types as exc:
                _count(OUTCOMES, (what, type(exc).__name__))
                return Refused, None
            except Exception as exc:
                raise AssertionError("%s: expected %s, got %s: %s" % (what, refused, type(exc).__name__,
                                                                      exc)) from exc
            raise AssertionError("%s: expected %s, but it was accepted" % (what, refused)) from None
        got = self._call(what, call)
        _count(OUTCOMES, (what, "done"))
        return got, want

    def _call(self, what, call):
        """``call()``; no call may close the session (say, a worker's error
        inside a collective)."""
        try:
            return call()
        except BaseException as exc:
            if runtime.current() is not self.session.rt:
                self.session.closed_by = "%s: %s: %s" % (what, type(exc).__name__, exc)
            raise
        finally:
            if runtime.current() is not self.session.rt:
                raise AssertionError("the session closed during %s" % what)

    def _adopt(self, ranks, ks, results):
        """Float reductions are right within a bound, not to the bit: check each
        rank's value against it and make the reference hold that value."""
        s = self.session
        for r in ranks:
            got = synk.get_value(r, [s.variables[k] for k in ks])
            for k, g, (want, bound) in zip(ks, got, results):
                assert_matches(g, want, bound, "%s on rank %d" % (s.variables[k], r))
                self.ref.vals[k][r] = np.array(g)

    @invariant()
    def every_rank_agrees(self):
        s = self.session
        for r in range(s.n):
            for k, got in enumerate(synk.get_value(r, s.variables)):
                assert_matches(got, self.ref.vals[k][r], what="%s on rank %d" % (s.variables[k], r))
        for key, d in self.pool.items():
            want = self.ref.datas[key]
            # _array, not .data: reading .data counts as a chance to write (see Data._version).
            freed = isinstance(want, Freed)
            assert (d._array is None) == freed, "Data %d: allocated %s" % (key, d._array is not None)
            assert (d.dtype, d.ndim) == (want.dtype.name, want.ndim), "Data %d: %s" % (key, d)
            if not freed:
                assert_matches(d._array, want, what="Data %d" % key)

    # ------------------------------------------------------------------ Data
    @rule(data=st.data())
    def new_data(self, data):
        _count(STATS, "steps")
        dtype = _draw(data, st.sampled_from(self.session.dtypes), "dtype")
        ndim = _draw(data, st.sampled_from((2, 2, 1, 0)), "ndim")
        seed = _draw(data, st.integers(0, 2**31), "seed")
        self._new_data(random_array(seed, dtype, self._shape(data, ndim, dtype)))

    def _some_data(self, data):
        if not self.pool:
            return None
        key = _draw(data, st.sampled_from(sorted(self.pool)), "Data")
        return key, self.pool[key], self.ref.datas[key]

    @rule(data=st.data())
    def data_set_value(self, data):
        picked = self._some_data(data)
        if picked is None:
            return
        key, d, old = picked
        dtype = _draw(data, st.sampled_from((d.dtype,) * 3 + self.session.dtypes), "dtype")
        seed = _draw(data, st.integers(0, 2**31), "seed")
        value = random_array(seed, dtype, self._shape(data, d.ndim, dtype))
        force = _draw(data, st.booleans(), "force_cast")

        def predict():
            if value.dtype != np.dtype(d.dtype) and not (force or np.can_cast(value.dtype, d.dtype, "safe")):
                raise Refused(TypeError)
            self.ref.datas[key] = value.astype(d.dtype)

        self._expect("Data.set_value", lambda: d.set_value(value, force_cast=force), predict)

    @rule(data=st.data())
    def data_grow_or_cut(self, data):
        picked = self._some_data(data)
        if picked is None or isinstance(picked[2], Freed) or picked[2].ndim == 0:
            return
        key, d, old = picked
        n = _draw(data, st.integers(0, 2 * len(old) + 10), "length")
        fresh = random_array(_draw(data, st.integers(0, 2**31), "seed"), d.dtype, (max(0, n - len(old)),) +
                             old.shape[1:])
        _count(STATS, "steps")
        d.set_length(n)  # keeps the rows both lengths have; new ones are set next
        d[len(old):] = fresh
        self.ref.datas[key] = np.concatenate([old[:n], fresh])

    @rule(data=st.data())
    def data_free(self, data):
        picked = self._some_data(data)
        if picked is None:
            return
        _count(STATS, "steps")
        picked[1].free_memory()
        if not isinstance(picked[2], Freed):
            self.ref.datas[picked[0]] = Freed(picked[2])

    # ------------------------------------------------------------ collectives
    def _with_capability(self, ks, nccl, op, predict):
        """``predict``, unless the device collective refuses a variable's dtype first."""
        s = self.session

        def checked():
            if nccl and any(s.device_refuses(s.variables[k].dtype, op) for k in ks):
                raise Refused(TypeError, ValueError)  # which check comes first is not specified
            return predict()

        return checked

    @rule(data=st.data())
    def broadcast(self, data):
        shared_vars, ks, single = self._targets(data)
        nccl = self._nccl(data)
        if _draw(data, st.booleans(), "the master's values"):
            given, ref_given = None, None
        else:
            given, ref_given = self._values(data, ks, single)
        self._expect("broadcast", lambda: synk.broadcast(shared_vars, given, nccl=nccl),
                     self._with_capability(ks, nccl, None, lambda: self.ref.broadcast(ks, ref_given)))

    @rule(data=st.data())
    def scatter(self, data):
        shared_vars, ks, single = self._targets(data)
        given, ref_given = self._values(data, ks, single)
        length = min((len(v) if hasattr(v, "__len__") and np.ndim(v) else 0) for v in
                     ([given] if single else given))
        batch = self._batch(data, length)
        self._expect("scatter", lambda: synk.scatter(shared_vars, given, batch=batch),
                     lambda: self.ref.scatter(ks, ref_given, batch))

    @rule(data=st.data())
    def set_value(self, data):
        shared_vars, ks, single = self._targets(data)
        rank = _draw(data, st.integers(0, self.session.n - 1), "rank")
        given, ref_given = self._values(data, ks, single)
        batch = None
        if _draw(data, st.booleans(), "with batch"):
            lengths = [len(v) if np.ndim(v) else 0 for v in ([given] if single else given)]
            batch = self._batch(data, min(lengths))
        self._expect("set_value", lambda: synk.set_value(rank, shared_vars, given, batch=batch),
                     lambda: self.ref.set_value(rank, ks, ref_given, batch))

    @rule(data=st.data())
    def gather(self, data):
        shared_vars, ks, single = self._targets(data)
        nd_up, nccl = _draw(data, st.sampled_from((0, 1)), "nd_up"), self._nccl(data)
        got, want = self._expect("gather", lambda: synk.gather(shared_vars, nd_up=nd_up, nccl=nccl),
                                 self._with_capability(ks, nccl, None, lambda: self.ref.gather(ks, nd_up)))
        if got is Refused:
            return
        got = [got] if single else list(got)
        assert len(got) == len(want)
        for k, g, w in zip(ks, got, want):
            if isinstance(w, list):
                var = self.session.variables[k]
                assert isinstance(g, list) and len(g) == len(w), "gather of %s: %r" % (var, g)
                for r, (gr, wr) in enumerate(zip(g, w)):
                    assert_matches(gr, wr, what="gather of %s, rank %d" % (var, r))
            else:
                assert_matches(g, w, what="gather of %s" % self.session.variables[k])

    @rule(data=st.data())
    def all_gather(self, data):
        shared_vars, ks, single = self._targets(data)
        # Each all_gather multiplies a length by the ranks: keep values to a few MB.
        ks = [k for k in ks if sum(v.nbytes for v in self.ref.vals[k]) <= BANDS[-1][1]]
        if not ks:
            return
        variables = [self.session.variables[k] for k in ks]
        shared_vars = variables[0] if single else variables
        nccl = self._nccl(data)
        self._expect("all_gather", lambda: synk.all_gather(shared_vars, nccl=nccl),
                     self._with_capability(ks, nccl, None, lambda: self.ref.all_gather(ks)))

    @rule(data=st.data())
    def reduce(self, data):
        shared_vars, ks, single = self._targets(data)
        op, in_place = _draw(data, st.sampled_from(OPS), "op"), _draw(data, st.booleans(), "in_place")
        nccl = self._nccl(data)
        got, want = self._expect(
            "reduce", lambda: synk.reduce(shared_vars, op=op, in_place=in_place, nccl=nccl),
            self._with_capability(ks, nccl, op, lambda: self.ref.reduce(ks, op, in_place)))
        if got is Refused:
            return
        if in_place:
            assert got is None
            self._adopt([self.session.master], ks, want)
            return
        got = [got] if single else list(got)
        for k, g, (w, bound) in zip(ks, got, want):
            assert_matches(g, w, bound, "reduce of %s, op %s" % (self.session.variables[k], op))

    @rule(data=st.data())
    def all_reduce(self, data):
        shared_vars, ks, _ = self._targets(data)
        op, nccl = _draw(data, st.sampled_from(OPS), "op"), self._nccl(data)
        got, want = self._expect("all_reduce", lambda: synk.all_reduce(shared_vars, op=op, nccl=nccl),
                                 self._with_capability(ks, nccl, op, lambda: self.ref.all_reduce(ks, op)))
        if got is not Refused:
            assert got is None
            self._adopt(range(self.session.n), ks, want)

    @rule(data=st.data())
    def get_value_shapes_lengths(self, data):
        shared_vars, ks, single = self._targets(data)
        s = self.session
        rank = _draw(data, st.integers(0, s.n - 1), "rank")
        _count(STATS, "steps")
        got = synk.get_value(rank, shared_vars)
        for k, g in zip(ks, [got] if single else got):
            assert_matches(g, self.ref.vals[k][rank], what="get_value of %s" % s.variables[k])
        shapes = synk.get_shapes(shared_vars)
        assert shapes == ([self.ref.shapes(k) for k in ks] if not single else self.ref.shapes(ks[0]))
        got, want = self._expect("get_lengths", lambda: synk.get_lengths(shared_vars),
                                 lambda: [self.ref.lengths(k) for k in ks])
        if got is not Refused:
            assert got == (want[0] if single else want)

    # -------------------------------------------------------------- functions
    def _fx_inputs(self, data):
        """Keys of an x (2-d, WIDTH columns) and a b (WIDTH values) Data, made if
        the pool has none; freed ones stay candidates."""
        def pick(fits, make, label, keep=()):
            keys = [k for k, v in self.ref.datas.items() if isinstance(v, Freed) or fits(v)]
            if keys and _draw(data, st.booleans(), "an existing " + label):
                return _draw(data, st.sampled_from(sorted(keys)), label)
            return self._new_data(make(), keep)

        fd = self.session.fdtype
        seed = _draw(data, st.integers(0, 2**31), "seed")
        xkey = pick(lambda v: v.ndim == 2 and v.shape[1] == WIDTH, lambda: random_array(
            seed, _draw(data, st.sampled_from((fd, fd) + self.session.dtypes), "x dtype"),
            (self._shape(data, 2, fd)[0], WIDTH)), "x")
        bkey = pick(lambda v: v.shape == (WIDTH,), lambda: random_array(seed + 1, fd, (WIDTH,)), "b", (xkey,))
        return xkey, bkey

    @rule(data=st.data())
    def call_fx(self, data):
        s = self.session
        xkey, bkey = self._fx_inputs(data)
        x = self.ref.datas[xkey]
        batch = self._batch(data, 0 if isinstance(x, Freed) else len(x))
        kwargs = {"num_slices": _draw(data, st.integers(1, 5), "num_slices")}
        if batch is not None:
            kwargs["batch"] = batch
        subset = _draw(data, st.sampled_from((None, None, (2,), (3, 0), ())), "output_subset")
        if subset is not None:
            kwargs["output_subset"] = list(subset)
        got, want = self._expect("fx", lambda: s.fx(self.pool[xkey], self.pool[bkey], **kwargs),
                                 lambda: self.ref.call_fx(xkey, bkey, batch, kwargs["num_slices"], subset,
                                                          s.acc, s.mx, s.fdtype))
        if got is Refused:
            return
        outputs, updates = want
        got = list(got)
        assert len(got) == len(outputs)
        loose = s.xla  # see assert_matches
        for i, (g, w) in enumerate(zip(got, outputs)):
            if isinstance(w, list):  # reduce mode None: one per rank that had rows
                assert isinstance(g, list) and len(g) == len(w), "fx output %d: %r" % (i, g)
                for gr, (wr, br) in zip(g, w):
                    assert_matches(gr, wr, br, "fx output %d" % i, loose)
            else:
                assert_matches(g, w[0], w[1], "fx output %d" % i, loose)
        for r, per_var in updates.items():
            for k, (w, bound) in per_var.items():
                g = synk.get_value(r, s.variables[k])
                assert_matches(g, w, bound, "fx update of %s on rank %d" % (s.variables[k], r), loose)
                self.ref.vals[k][r] = np.array(g)

    @rule(data=st.data())
    def call_fs(self, data):
        s = self.session
        lengths = [len(v) for v in self.ref.vals[s.sh]]
        kind = _draw(data, st.sampled_from(("none", "one", "per rank")), "batch_s")
        if kind == "none":
            batch_s = None
        elif kind == "one":
            batch_s = self._batch(data, min(lengths))
            batch_s = slice(0, batch_s) if isinstance(batch_s, int) else batch_s
            if batch_s is None or (isinstance(batch_s, slice) and batch_s.stop is None):
                batch_s = slice(0, min(lengths))
        else:
            as_slices = _draw(data, st.booleans(), "slices")
            batch_s = []
            for n in lengths:
                if as_slices:
                    a = _draw(data, st.integers(0, n), "start")
                    batch_s.append(slice(a, _draw(data, st.integers(a, n + (n == 0)), "stop")))
                else:
                    indices = st.lists(st.integers(0, max(n - 1, 0)), max_size=12)
                    batch_s.append(_draw(data, indices, "indices"))
        num_slices = _draw(data, st.integers(1, 4), "num_slices")
        kwargs = {"num_slices": num_slices}
        if batch_s is not None:
            kwargs["batch_s"] = batch_s
        got, want = self._expect("fs", lambda: s.fs(**kwargs),
                                 lambda: self.ref.call_fs(s.sh, batch_s, kind == "per rank", num_slices))
        if got is Refused:
            return
        for i, (g, (w, bound)) in enumerate(zip(got, want)):
            assert_matches(g, w, bound, "fs output %d" % i, s.xla)


def machine_for(lane):
    """The state machine class bound to ``lane`` (given a Session: its first lane)."""
    if isinstance(lane, Session):
        lane = lane.lanes[0]
    return type("SessionMachine", (SessionMachine,), {"session": lane})


def _settings(examples, steps, derandomize, shrink):
    """A failing sequence is shrunk to a minimal one unless ``shrink`` is False
    (or ``SYNKHRONOS_MODEL_SHRINK=0``: on a GPU, where new shapes compile anew,
    shrinking can take longer than the run)."""
    shrink = shrink and os.environ.get("SYNKHRONOS_MODEL_SHRINK", "1") != "0"
    phases = [p for p in Phase if shrink or p not in (Phase.shrink, Phase.explain)]
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=derandomize,
                    database=None, print_blob=True, phases=phases, suppress_health_check=list(HealthCheck))


def run(session, examples, steps, derandomize, shrink=True):
    """Run ``examples`` sequences of up to ``steps`` steps against ``session``'s
    first lane (see ``_settings`` for ``shrink``)."""
    machine = machine_for(session)
    machine.TestCase.settings = _settings(examples, steps, derandomize, shrink)
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)


def run_threads(session, threads, examples, steps, derandomize, shrink=True, timeout=None):
    """Run a machine against each of the first ``threads`` lanes of ``session``,
    each in a thread of its own and all at once, each ``examples`` sequences of up
    to ``steps`` steps with a reference of its own.  The threads' calls interleave
    on the one session: each must still get its own results.

    Hypothesis runs tests from several threads at once (6.155 here); each thread
    has its own machine class, settings and random source.  Derandomized, lane 0
    runs the sequences ``run`` runs and lane ``k`` those of ``hypothesis.seed(k)``
    (one digest for all would give every lane the same sequences).

    Raises AssertionError naming the lane whose step failed first (in time: one
    lane's fault can make the others fail after it, say by closing the session),
    with that step's error and what Hypothesis made of it in that lane (the
    shrunk sequence), chained to the latter, and every lane's outcome listed.  Or
    naming the threads still running after ``timeout`` seconds (default: a
    second a step, far more than a step takes, plus two stalls' worth), with
    their stacks; the threads are daemons, so a hung one does not keep the
    process alive.
    """
    if threads > len(session.lanes):
        raise ValueError("%d threads, but the session has %d lanes" % (threads, len(session.lanes)))
    if timeout is None:
        timeout = 2 * HANG_S + examples * steps
    lanes = session.lanes[:threads]
    session.ensure()  # started here, once: a failure that closes it fails every lane (see Session.ensure)
    errors = {}  # lane index -> the exception its run raised

    def drive(lane):
        machine = machine_for(lane)
        if derandomize and lane.index:
            machine = seed(lane.index)(machine)
        try:
            run_state_machine_as_test(machine, settings=_settings(examples, steps, derandomize, shrink))
        except BaseException as exc:
            errors[lane.index] = exc
            lane.failed(exc)  # a failure outside any step (say, of Hypothesis itself)

    workers = [threading.Thread(target=drive, args=(lane,), name="model lane %d" % lane.index, daemon=True)
               for lane in lanes]
    for lane in lanes:
        lane.first_error = None
    session.concurrent = True
    try:
        with _one_parse_at_a_time():
            for w in workers:
                w.start()
            deadline = time.monotonic() + timeout
            for w in workers:
                w.join(max(0.0, deadline - time.monotonic()))
    finally:
        session.concurrent = False
    hung = [w for w in workers if w.is_alive()]
    outcomes = ""
    for lane, w in zip(lanes, workers):
        ended = _summary(errors[lane.index]) if lane.index in errors else "passed"
        outcomes += "\n  lane %d: %s" % (lane.index, "still running" if w.is_alive() else ended)
    if hung:
        frames = sys._current_frames()
        raise AssertionError("%d of %d threads still running after %.0f s:%s%s" % (
            len(hung), threads, timeout, outcomes, "".join("\n%s:\n%s" % (w.name, "".join(
                traceback.format_stack(frames[w.ident]))) for w in hung if w.ident in frames)))
    if errors:
        first = min((lane for lane in lanes if lane.first_error), key=lambda lane: lane.first_error[0])
        final = errors.get(first.index)
        exc = first.first_error[1]
        message = "lane %d of %d threads failed first: %s%s\n\nThat step:\n%s\nLane %d ended with:\n%s" % (
            first.index, threads, _summary(exc), outcomes, "".join(traceback.format_exception(exc)),
            first.index, "".join(traceback.format_exception(final)) if final else "passed")
        raise AssertionError(message) from final


@contextlib.contextmanager
def _one_parse_at_a_time():
    """Make ``ast.parse`` hold a lock.  CPython counts the depth of the syntax
    tree it is turning into Python objects in state that all threads share (3.11
    at least), so two threads parsing at once fail now and then with
    "SystemError: AST constructor recursion depth mismatch" (see
    python/cpython#106905).  Each thread's Hypothesis parses source: the
    machine's and its own (for the derandomized seed), and the constants of
    newly imported modules."""
    parse, lock = ast.parse, threading.Lock()

    def one_at_a_time(*args, **kwargs):
        with lock:
            return parse(*args, **kwargs)

    ast.parse = one_at_a_time
    try:
        yield
    finally:
        ast.parse = parse


def _summary(exc):
    """One line: ``exc``'s type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, lines[0] if lines else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4], help="rank counts to test")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="time to spend on each rank count, in fresh random sequences")
    parser.add_argument("--examples", type=int, default=None,
                        help="instead: this many sequences per rank count, the same ones every run")
    parser.add_argument("--steps", type=int, default=40, help="most steps in one sequence")
    parser.add_argument("--gpu", action="store_true", help="GPU ranks (use_gpu=True)")
    parser.add_argument("--threads", type=int, default=1,
                        help="machines driving the session at once, each from a thread of its own")
    parser.add_argument("--outcomes", action="store_true", help="count each call's outcomes")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")

    def sequences(session, examples, derandomize):
        if args.threads == 1:
            run(session, examples, args.steps, derandomize)
        else:
            run_threads(session, args.threads, examples, args.steps, derandomize)

    warnings.simplefilter("ignore")  # the drawn values' NaN and infinity arithmetic, complex casts
    t_all = time.monotonic()
    for n in args.ranks:
        session = Session(n, use_gpu=args.gpu, lanes=args.threads)
        before = dict(STATS)
        t0 = time.monotonic()
        if args.examples is not None:
            sequences(session, args.examples, derandomize=True)
        while args.examples is None and time.monotonic() - t0 < args.seconds:
            sequences(session, 20, derandomize=False)
        print("model-based test: %d ranks (%s%s%s): %d sequences, %d steps in %.0f s, 0 failures" % (
            session.n, "GPU" if session.gpu else "CPU", ", MPI" if session.mpi else "",
            ", %d threads" % args.threads if args.threads > 1 else "",
            STATS["sequences"] - before["sequences"], STATS["steps"] - before["steps"],
            time.monotonic() - t0), flush=True)
        synk.close()
    print("model-based test: %d sequences, %d steps in %.0f s, 0 failures" % (
        STATS["sequences"], STATS["steps"], time.monotonic() - t_all), flush=True)
    if args.outcomes:
        for (what, outcome), count in sorted(OUTCOMES.items()):
            print("  %-14s %-14s %7d" % (what, outcome, count))


if __name__ == "__main__":
    main()
