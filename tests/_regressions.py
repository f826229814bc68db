"""The faults the model-based test (``_machine.py``) found, each as a plain
check against numpy, for ``test_model.py``: run in pytest's process on CPU
ranks, under ``mpirun`` (``python _regressions.py``: every rank runs it), and on
one GPU rank (``tests/gpu``).  Each check raises AssertionError when its fault
is back."""

import sys
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
from _model import split

import synkhronos as synk
from synkhronos._wire.exchange_buffer import INLINE_BYTES, MIN_SEGMENT

__all__ = ["Env", "CHECKS", "main"]

ROWS = 200_000  # three values of this many rows: each over INLINE_BYTES, together over MIN_SEGMENT


class Env:
    """A session with the variables the checks use (``n`` ranks, ``use_gpu`` as
    for ``fork``)."""

    def __init__(self, n=None, use_gpu=False):
        self.n = synk.fork(n, use_gpu=use_gpu)
        self.gpu = use_gpu
        self.fd = "float32" if use_gpu else "float64"
        self.X = pytensor.shared(np.zeros((1, 3), self.fd), name="X")
        self.g = pytensor.shared(np.zeros(1, "int32"), name="g")
        self.y = pytensor.shared(np.zeros(1, self.fd), name="y")
        self.i64 = pytensor.shared(np.zeros(2, "int32" if use_gpu else "int64"), name="i64")
        self.i8 = pytensor.shared(np.zeros(70, "int8"), name="i8")
        self.c = pytensor.shared(np.zeros(2, "complex64"), name="c")
        self.st = pytensor.shared(np.zeros(3, self.fd), shape=(3,), name="st")
        self.sh = pytensor.shared(np.zeros((4, 3), self.fd), name="sh")
        held = [self.X, self.g, self.y, self.i64, self.i8, self.c, self.st]
        synk.function([], [(pt.as_tensor(v).size, "sum") for v in held])
        self.fs = synk.function([], (self.sh.sum(axis=0), "sum"), sliceable_shareds=[self.sh])
        synk.distribute()


def three_large_values_in_one_call(e):
    """scatter, broadcast and set_value of three numpy values over INLINE_BYTES
    each (PyMC's ``pm.Data`` arrays) in one call: each value was laid out alone at
    offset 0 of the master's exchange buffer, so every worker read the last one
    for all three (or, when the buffer grew part-way, found no segment)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((ROWS, 3)).astype(e.fd)
    g = rng.integers(0, 10, ROWS).astype("int32")
    y = rng.standard_normal(ROWS).astype(e.fd)
    assert min(a.nbytes for a in (X, g, y)) >= INLINE_BYTES and X.nbytes + g.nbytes + y.nbytes > MIN_SEGMENT
    variables = [e.X, e.g, e.y]
    synk.scatter(variables, [X, g, y])
    for r, (a, b) in enumerate(split(ROWS, e.n)):
        for var, want in zip(variables, (X[a:b], g[a:b], y[a:b])):
            np.testing.assert_array_equal(synk.get_value(r, var), want, "scatter %s rank %d" % (var, r))
    synk.broadcast(variables, [X * 2, g + 1, y * 2])
    for r in range(e.n):
        for var, want in zip(variables, (X * 2, g + 1, y * 2)):
            np.testing.assert_array_equal(synk.get_value(r, var), want, "broadcast %s rank %d" % (var, r))
    last = e.n - 1
    synk.set_value(last, variables, [X[:5], g, y[::-1]])
    for var, want in zip(variables, (X[:5], g, y[::-1])):
        np.testing.assert_array_equal(synk.get_value(last, var), want, err_msg="set_value %s" % var)


def int64_average_is_exact(e):
    """``avg`` of 64-bit integers went through float64 and lost the low bits
    (2**53 and over): the average of equal values must be those values."""
    if e.gpu:  # GPU ranks keep int64 in 32 bits (floatX float32)
        return
    big = np.array([208956467747957173, -(2**60) - 1], dtype="int64")  # sums of 4 do not wrap
    synk.broadcast(e.i64, big)
    for nccl in (False, True):
        synk.all_reduce(e.i64, op="avg", nccl=nccl)
        for r in range(e.n):
            np.testing.assert_array_equal(synk.get_value(r, e.i64), big)


def small_integer_sums_wrap(e):
    """Sums of int8 wrap around as numpy's do, at every length: Open MPI's
    vectorized sum of 8- and 16-bit integers saturates instead (from some length
    up), so the MPI path gave 127 where numpy and NCCL give a wrapped value."""
    value = np.full(70, 100, dtype="int8")
    for nccl in (True, False):
        synk.broadcast(e.i8, value, nccl=False)
        synk.all_reduce(e.i8, op="sum", nccl=nccl)
        want = (value.astype(np.int64) * e.n).astype("int8")
        np.testing.assert_array_equal(synk.get_value(0, e.i8), want)


def refused_collectives_leave_the_session_open(e):
    """A device collective that the device cannot do was refused only after the
    workers had it (MPI: max of complex values; an all_gather whose result does
    not fit a static shape): the master's failure then closed the session."""
    synk.broadcast(e.st, np.ones(3, e.fd))
    if e.n > 1:  # (on one rank the gathered value keeps its shape)
        _raises(TypeError, lambda: synk.all_gather(e.st, nccl=True))
    try:  # MPI and NCCL have no max of complex values; the shared-memory path computes it
        synk.reduce(e.c, op="max", nccl=True)
    except TypeError:
        pass
    assert synk.get_shapes(e.st) == [(3,)] * e.n  # the session goes on, the values as they were
    np.testing.assert_array_equal(synk.gather(e.st, nd_up=0), np.ones(3 * e.n, e.fd))


def _raises(error, call):
    try:
        call()
    except error:
        return
    raise AssertionError("%s was not raised" % error.__name__)


def other_dtype_with_batch_fits_static_shape(e):
    """A value of another dtype was checked against a static shape before the
    batch selected its rows, so ``set_value(r, st, ints, batch=[0, 1, 2])`` was
    refused where the same value as floats was accepted."""
    ints = np.arange(10, dtype="int8")
    synk.set_value(0, e.st, ints, batch=[4, 5, 6])
    np.testing.assert_array_equal(synk.get_value(0, e.st), np.array([4, 5, 6], e.fd))


def outputs_of_different_shapes_are_refused(e):
    """Outputs reduced over ranks whose shapes differ were broadcast against each
    other without a word ((3,) + (1,)): now a ValueError naming the shapes."""
    if e.n < 2:
        return
    synk.broadcast(e.sh, np.ones((4, 3), e.fd))
    synk.set_value(e.n - 1, e.sh, np.ones((5, 1), e.fd))
    try:
        e.fs()
    except (ValueError, synk.WorkerError) as exc:
        assert "(3,)" in str(exc) and "(1,)" in str(exc), exc
    else:
        raise AssertionError("outputs of shapes (3,) and (1,) were reduced")
    synk.broadcast(e.sh, np.ones((4, 3), e.fd))
    np.testing.assert_array_equal(e.fs(), np.full(3, 4.0 * e.n, e.fd))


def averages_keep_every_element(e):
    """On a GPU rank alone, NCCL's one-rank average (before NCCL 2.29.7) left the
    last elements of the result unwritten (NVIDIA/nccl#1950): an ``avg`` of equal
    values must give those values, at every length."""
    rng = np.random.default_rng(3)
    for rows in (1, 5, 33, 1000, 5189, 22599):
        value = rng.integers(-100, 100, (rows, 3)).astype(e.fd)  # sums and halves stay exact
        for call in (lambda: synk.all_reduce(e.sh, op="avg", nccl=True),
                     lambda: synk.reduce(e.sh, op="avg", in_place=True, nccl=True)):
            synk.broadcast(e.sh, value)
            call()
            np.testing.assert_array_equal(synk.get_value(0, e.sh), value, "avg of %d rows" % rows)


CHECKS = [three_large_values_in_one_call, averages_keep_every_element, int64_average_is_exact,
          small_integer_sums_wrap, refused_collectives_leave_the_session_open,
          other_dtype_with_batch_fits_static_shape, outputs_of_different_shapes_are_refused]


def main():
    """Every check on a session of all ranks (under ``mpirun``: every rank its own host)."""
    warnings.simplefilter("ignore")
    e = Env(use_gpu="gpu" in sys.argv[1:])
    for check in CHECKS:
        check(e)
        print("ok", check.__name__, flush=True)
    synk.close()


if __name__ == "__main__":
    main()
