"""One Synkhronos session that exercises functions and every collective, for
tests/mpi/test_mpi.py: run under ``mpirun -n 4`` (every rank its own host) and as a
plain single-host run, it must give the same results.

Usage: ``python _mpi_session.py OUT.npz [gpu]``: 4 CPU ranks, or with ``gpu``
every GPU (under MPI: every rank).  Each result is also checked here against
numpy or the plain PyTensor function on the same data.
"""

import os
import sys

import numpy as np
import pytensor
import pytensor.tensor as pt
from threadpoolctl import threadpool_info

import synkhronos as synk
from synkhronos._devices.cpu import THREAD_VARS, usable_cores
from synkhronos._session import runtime
from synkhronos._wire.protocol import ThreadPools

results = {}


def keep(name, value, expected=None):
    value = np.asarray(value)
    if expected is not None:
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6, err_msg=name)
    results[name] = value


GPU = sys.argv[2:] == ["gpu"]
pytensor.config.floatX = "float32"  # the float32 data below go into T.matrix() inputs
n = synk.fork(None if GPU else 4, use_gpu=GPU)
if not GPU and not any(os.environ.get(v) for v in THREAD_VARS):
    # Each rank's BLAS and OpenMP pools: its share of its host's cores, here one machine's.
    def pools():
        return sorted((i["internal_api"], i["num_threads"]) for i in threadpool_info())

    mine, replies = runtime.current().dispatcher.request(ThreadPools(), local=pools)
    share = max(1, usable_cores() // n)
    for rank, ranks_pools in {0: mine, **replies}.items():
        assert ranks_pools and all(k == share for _, k in ranks_pools), (rank, ranks_pools, share)
last = n - 1
rng = np.random.default_rng(0)
x = pt.matrix("x")
y = pt.vector("y")
w = pytensor.shared(np.linspace(-1, 1, 3).astype("float32"), name="w")
err = x.dot(w) - y
f = synk.function([x, y], [pt.mean(err ** 2), (pt.sum(err), "sum"), (pt.max(err), "max"), (err, None)])
f_pt = pytensor.function([x, y], [pt.mean(err ** 2), pt.sum(err), pt.max(err)])
# A sliceable shared variable and an update: s accumulates the rows each rank saw.
s = pytensor.shared(np.zeros(3, "float32"), name="s")
z = pytensor.shared(np.arange(40, dtype="float32").reshape(20, 2), name="z")
g = synk.function([x], (pt.sum(z) + pt.sum(x), "sum"), updates=[(s, s + pt.sum(x, axis=0))],
                  sliceable_shareds=[z])
ints = pytensor.shared(np.zeros(4, "int32"), name="ints")
h = synk.function([], (pt.sum(ints), "sum"))
synk.distribute()

x_np = rng.standard_normal((101, 3)).astype("float32")
y_np = rng.standard_normal(101).astype("float32")
xd, yd = synk.data(x_np), synk.data(y_np)
keep("plain", f(xd, yd)[:3], f_pt(x_np, y_np))
keep("per_rank", np.concatenate(f(xd, yd)[3]), x_np.dot(w.get_value()) - y_np)
idx = rng.permutation(101)[:37]
for label, batch, rows in [("int", 10, np.arange(10)), ("slice", slice(20, 61), np.arange(20, 61)),
                           ("list", idx, idx)]:
    for k in (1, 3):
        keep("batch_%s_%d" % (label, k), f(xd, yd, batch=batch, num_slices=k)[:3],
             f_pt(x_np[rows], y_np[rows]))
# Changed Data reaches every host: set_value and item assignment.
xd.set_value(x_np * 2)
keep("after_set_value", f(xd, yd)[:3], f_pt(x_np * 2, y_np))
xd[:5] = 0
x2 = x_np * 2
x2[:5] = 0
keep("after_setitem", f(xd, yd)[:3], f_pt(x2, y_np))
xd.data[5:10] = 1
x2[5:10] = 1
keep("after_inplace", f(xd, yd)[:3], f_pt(x2, y_np))
# A view taken before a call and written after it: the other hosts see the new values too.
view = xd.data[10:]
keep("old_view_before", f(xd, yd)[:3], f_pt(x2, y_np))
view[:] = 3
x2[10:] = 3
keep("old_view_after", f(xd, yd)[:3], f_pt(x2, y_np))
del view

# Memory released and allocated again (the other hosts drop their copies and take new ones),
# and a Data that is garbage-collected.
xd.free_memory()
xd.set_value(x_np[:60])
keep("after_free", f(xd, yd, batch=slice(0, 60))[:3], f_pt(x_np[:60], y_np[:60]))
gone = synk.data(x_np[:10] + 1)
keep("collected_before", f(gone, yd, batch=10)[:3], f_pt(x_np[:10] + 1, y_np[:10]))
del gone
keep("collected_after", f(xd, yd, batch=10)[:3], f_pt(x_np[:10], y_np[:10]))

picks = [[0, 1], [1, 5], [10, 11], [19, 3], [4, 4], [7, 2], [8, 9], [12, 6]][:n]
x3 = np.ones((2 * n, 3), "float32")
keep("batch_s", g(synk.data(x3), batch_s=picks), z.get_value()[np.concatenate(picks)].sum() + x3.sum())
keep("s_gathered", synk.gather(s, nd_up=1), np.full((n, 3), 2))

for nccl in (True, False):
    tag = "mpi" if nccl else "shm"
    synk.scatter(s, np.arange(3 * n, dtype="float32") + 1)
    keep("scatter_" + tag, synk.gather(s, nd_up=1), np.arange(3 * n).reshape(n, 3) + 1)
    synk.all_gather(s, nccl=nccl)
    keep("all_gather_" + tag, synk.get_value(1, s), np.arange(3 * n) + 1)
    for op, red in [("sum", np.sum), ("avg", np.mean), ("max", np.max), ("min", np.min), ("prod", np.prod)]:
        vals = np.arange(3 * n, dtype="float32").reshape(n, 3) + 1
        synk.scatter(s, vals.reshape(-1))
        keep("reduce_%s_%s" % (op, tag), synk.reduce(s, op=op, in_place=False, nccl=nccl),
             red(vals, axis=0))
        synk.all_reduce(s, op=op, nccl=nccl)
        keep("all_reduce_%s_%s" % (op, tag), synk.gather(s, nd_up=1), np.tile(red(vals, axis=0), (n, 1)))
    synk.scatter(ints, np.arange(4 * n, dtype="int32"))
    synk.all_reduce(ints, op="avg", nccl=nccl)
    keep("int_avg_" + tag, synk.get_value(n - 1, ints),
         (np.arange(4 * n).reshape(n, 4).sum(axis=0) / n).astype("int32"))
    synk.broadcast(s, np.full(3, 7, "float32"), nccl=nccl)
    keep("broadcast_" + tag, synk.gather(s, nd_up=1), np.full((n, 3), 7))
    synk.set_value(last, s, np.array([1, 2, 3], "float32"))
    keep("set_value_" + tag, synk.get_value(last, s), [1, 2, 3])
    synk.broadcast(s, nccl=nccl)  # the master's value to all
    keep("broadcast_master_" + tag, synk.gather(s, nd_up=1), np.full((n, 3), 7))

# Uneven shapes: scatter with batch splits rows unevenly, gather joins them.
zz = np.arange(22, dtype="float32").reshape(11, 2)
synk.scatter(z, zz)
keep("lengths", synk.get_lengths(z), [len(p) for p in np.array_split(zz, n)])
keep("gather_uneven", synk.gather(z, nd_up=0), zz)
keep("gather_uneven_shm", synk.gather(z, nd_up=0, nccl=False), zz)
synk.all_gather(z)
keep("all_gather_uneven", synk.get_value(last, z), zz)
synk.close()
np.savez(sys.argv[1], **results)
print("session done: %d results" % len(results))
