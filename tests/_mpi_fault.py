"""A rank on another "host" dies during a call or a collective: the master must
raise WorkerError naming its rank and host within seconds (tests/mpi/test_mpi.py).

Usage, under ``mpirun --enable-recovery`` with ``SYNKHRONOS_FAULT`` set to crash
rank 2: ``python _mpi_fault.py {call,nccl}``.
"""

import sys
import time

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

where = sys.argv[1]
synk.fork(use_gpu=False)
x = pt.matrix("x")
s = pytensor.shared(np.zeros(3, "float32"), name="s")
f = synk.function([x], (pt.sum(x), "sum"), updates=[(s, s + 1)])
synk.distribute()
d = synk.data(np.ones((8, 2), "float32"))
assert f(d) == 16
t0 = time.monotonic()
try:
    if where == "call":
        f(d)  # rank 2 dies before answering
    else:
        synk.all_reduce(s)  # rank 2 dies before joining: the others wait inside MPI
        synk.synchronize()
except synk.WorkerError as exc:
    print("CAUGHT after %.2f s: %s" % (time.monotonic() - t0, str(exc).splitlines()[0]), flush=True)
    assert exc.rank == 2, exc.rank
    if exc.exc_type == "RuntimeError":  # raised on rank 2, which lives on: the session goes on
        assert "fault injected" in str(exc) and "Worker traceback (rank 2)" in str(exc), str(exc)
        assert f(d) == 16
        synk.close()
        sys.exit(0)
    assert "host" in str(exc), str(exc)
else:
    raise SystemExit("no WorkerError")
try:
    f(d)
except RuntimeError as exc:
    print("CLOSED:", exc, flush=True)
