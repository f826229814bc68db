"""Checks ``MpiCpuDevice``'s collectives; run under ``mpirun -n 3`` (see
test_mpi_device.py).  Every rank knows every rank's values (they are a function
of the rank), so each result is checked against numpy here; values are
integer-valued, so MPI's order of summation cannot change them.  Exits non-zero,
printing what differed, on any mismatch."""

import sys
import time

import numpy as np
import pytensor
from mpi4py import MPI

from synkhronos._common import waiting
from synkhronos._common.reduce import reduce_values
from synkhronos._devices.cpu_mpi import MpiCpuDevice

__all__ = ["main"]

DTYPES = ("float32", "float64", "int32", "bool")
SHAPES = ((4, 3), ())  # two variables per call, one of them 0-d
failures = []


def value(rank, shape, dtype, salt=0):
    """Rank ``rank``'s value: small integers (products stay exact), bools varying by rank."""
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if dtype == "bool":
        return np.asarray((base + rank + salt) % 3 == 0)  # 0-d stays an array (a tensor)
    return np.asarray((base * (rank + 1) + salt) % 5 + rank - 1, dtype=dtype)  # some negatives


def check(what, got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        failures.append("%s: got %r, want %r" % (what, got, want))


def expect(what, exc_type, fn):
    """Call ``fn``; record a failure unless it raises ``exc_type``."""
    try:
        fn()
    except exc_type as exc:
        return str(exc)
    except Exception as exc:
        failures.append("%s: raised %r, want %s" % (what, exc, exc_type.__name__))
        return None
    failures.append("%s: did not raise %s" % (what, exc_type.__name__))
    return None


def shareds(rank, shapes, dtype, salt=0):
    return [pytensor.shared(value(rank, s, dtype, salt)) for s in shapes]


def reduced(op, n, shape, dtype, salt=0):
    """What the shared-memory path gives: numpy in rank order, cast back."""
    return np.asarray(reduce_values([value(r, shape, dtype, salt) for r in range(n)], op), dtype=dtype)


def main():
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    dev = MpiCpuDevice()
    expect("init_comm with the wrong size", RuntimeError, lambda: dev.init_comm(n + 1, rank, None))
    dev = MpiCpuDevice(comm_factory=lambda: comm)
    dev.init_comm(n, rank, MpiCpuDevice.new_uid())
    calls = [0]
    if rank == 0:  # the master's polling branch; the others use Waitall
        dev.wait_hook = lambda: calls.__setitem__(0, calls[0] + 1)

    for dtype in DTYPES:
        for op in ("avg", "sum", "prod", "max", "min"):
            salt = len(op)
            vs = shareds(rank, SHAPES, dtype, salt)
            dev.check_collective(vs)
            if rank == 1 and op == "avg":
                time.sleep(0.05)  # rank 0 waits > 1 ms: its hook must run
            dev.all_reduce(vs, op, SHAPES)
            for v, s in zip(vs, SHAPES):
                check("all_reduce %s %s %s" % (op, dtype, s), v.get_value(), reduced(op, n, s, dtype, salt))
            for root, in_place in ((1, False), (2, True)):
                vs = shareds(rank, SHAPES, dtype, salt)
                out = dev.reduce(vs, op, root, in_place, SHAPES)
                for k, (v, s) in enumerate(zip(vs, SHAPES)):
                    want = reduced(op, n, s, dtype, salt)
                    what = "reduce %s %s %s root %d in_place %s" % (op, dtype, s, root, in_place)
                    if rank == root and in_place:
                        check(what, v.get_value(), want)
                    else:
                        check(what + " (unchanged)", v.get_value(), value(rank, s, dtype, salt))
                    if rank == root and not in_place:
                        check(what, out[k], want)
                if rank != root or in_place:
                    check("reduce %s returns" % op, len(out), 0)

        vs = shareds(rank, SHAPES, dtype, salt=7)
        dev.broadcast(vs, 2, SHAPES)
        for v, s in zip(vs, SHAPES):
            check("broadcast %s %s" % (dtype, s), v.get_value(), value(2, s, dtype, 7))

        # Per-rank shapes: unequal lengths (one rank empty), equal ones, unequal trailing dims.
        cases = ([(r * 2, 3) for r in range(n)], [(2, 2)] * n, [(r + 1,) * (r + 1) for r in range(n)])
        for per_rank in cases:
            v = pytensor.shared(value(rank, per_rank[rank], dtype, 3))
            out = dev.gather([v], 0, [per_rank])
            if rank == 0:
                for r in range(n):
                    want = value(r, per_rank[r], dtype, 3)
                    check("gather %s %s rank %d" % (dtype, per_rank, r), out[0][r], want)
            else:
                check("gather returns", len(out), 0)
            if len({s[1:] for s in per_rank}) == 1:
                dev.all_gather([v], [per_rank])
                want = np.concatenate([value(r, per_rank[r], dtype, 3) for r in range(n)])
                check("all_gather %s %s" % (dtype, per_rank), v.get_value(), want)

    # Rank 1's first variable has the wrong shape: it raises, nobody hangs, the
    # second variable is still reduced, and the next collective works.
    vs = shareds(rank, SHAPES, "float64")
    if rank == 1:
        vs[0].set_value(np.zeros((2, 2)))
    call = lambda: dev.all_reduce(vs, "sum", SHAPES)  # noqa: E731
    if rank == 1:
        msg = expect("all_reduce of a wrong shape", ValueError, call)
        if msg is not None and "(2, 2)" not in msg:
            failures.append("the ValueError does not name the shape: %s" % msg)
        check("wrong shape left as it was", vs[0].get_value(), np.zeros((2, 2)))
    else:
        call()
        want = sum(value(r, (4, 3), "float64") for r in range(n) if r != 1)
        check("all_reduce beside a wrong shape", vs[0].get_value(), want)
    check("all_reduce beside a wrong shape, 0-d", vs[1].get_value(), reduced("sum", n, (), "float64"))
    v = pytensor.shared(value(rank, (1, 2), "int32"))
    per_rank = [(1, 2)] * n
    call = lambda: dev.all_gather([v], [per_rank])  # noqa: E731
    if rank == 2:
        v.set_value(np.zeros((3, 1), dtype="int32"))
        expect("all_gather of a wrong shape", ValueError, call)
    else:
        call()
        want = np.concatenate([value(r, (1, 2), "int32") if r != 2 else np.zeros((1, 2), "int32")
                               for r in range(n)])
        check("all_gather beside a wrong shape", v.get_value(), want)
    # The root's value has the wrong dtype (set behind PyTensor's back): it
    # raises; the others receive its zero stand-in, as on the GPU.
    v = pytensor.shared(value(rank, (2,), "float32"))
    if rank == 0:
        v.container.storage[0] = np.ones(2, dtype="float64")
        expect("broadcast of a wrong dtype", ValueError, lambda: dev.broadcast([v], 0, [(2,)]))
    else:
        dev.broadcast([v], 0, [(2,)])
        check("broadcast from a wrong dtype", v.get_value(), np.zeros(2, "float32"))

    # Dtypes MPI cannot move or reduce: refused on every rank before anything is posted.
    expect("check_collective of a random generator", TypeError,
           lambda: dev.check_collective([pytensor.shared(np.random.default_rng())]))
    c = pytensor.shared(np.ones(2, dtype="complex128"))
    expect("check_collective of a datetime", TypeError,
           lambda: dev.check_collective([type("V", (), {"dtype": "datetime64[s]"})()]))
    expect("max of complex", TypeError, lambda: dev.all_reduce([c], "max", [(2,)]))
    dev.all_reduce([c], "sum", [(2,)])
    check("complex sum", c.get_value(), np.full(2, n, dtype="complex128"))

    # A hook that raises (the master saw a worker die) breaks off the wait; the
    # requests, and so their buffers, must outlive it.  Rank 0 then finishes
    # them itself so that the ranks stay in step.
    v = pytensor.shared(value(rank, (3,), "float64"))
    if rank == 1:
        time.sleep(0.05)
    if rank == 0:
        def hook():
            raise KeyboardInterrupt

        dev.wait_hook, counting = hook, dev.wait_hook
        expect("a raising wait hook", KeyboardInterrupt, lambda: dev.all_reduce([v], "sum", [(3,)]))
        dev.wait_hook = counting
        if len(waiting._ABANDONED) != 1:
            failures.append("abandoned requests not kept: %r" % (waiting._ABANDONED,))
        else:
            MPI.Request.Waitall(waiting._ABANDONED.pop())
    else:
        dev.all_reduce([v], "sum", [(3,)])
        check("all_reduce beside a broken-off wait", v.get_value(),
              reduced("sum", n, (3,), "float64"))

    if rank == 0 and calls[0] == 0:
        failures.append("the wait hook was never called on rank 0")
    dev.close()
    for f in failures:
        print("rank %d: %s" % (rank, f), flush=True)
    bad = comm.allreduce(len(failures))
    if rank == 0:
        print("%s: %d failures over %d ranks (rank 0's hook ran %d times)"
              % ("FAILED" if bad else "OK", bad, n, calls[0]), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
