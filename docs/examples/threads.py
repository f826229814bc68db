"""Calls from several threads: one session serves them all, one call at a time,
each with its own inputs and its own results."""

import threading

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk

synk.fork(2)
x = pt.matrix("x")
c = pt.scalar("c")
f = synk.function([x], (x.sum() + c * x.shape[0], "sum"), bcast_inputs=[c])
synk.distribute()

results = {}


def worker(k):
    rows = synk.data(np.full((100 + k, 3), float(k)))  # each thread its own Data
    const = synk.data(np.asarray(1000.0 * k))
    results[k] = [float(f(rows, const)) for _ in range(50)]


threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for k, got in results.items():
    assert got == [3.0 * k * (100 + k) + 1000.0 * k * (100 + k)] * 50, (k, got[:3])
synk.close()
print("All assertions passed.")
