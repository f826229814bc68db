"""Shared variables on every rank, and the collectives that move their values.

The shared-variable example of the original manual, with two ranks: each rank
holds its own copy of ``s``, a function's updates change only the local copies,
and collectives combine them.
"""

import numpy as np
import pytensor as theano
import pytensor.tensor as T

import synkhronos as synk

theano.config.floatX = "float32"  # the original manual's Theano setup (its .theanorc) had this
synk.fork(2)
s_init = np.ones(2, dtype="float32")
x = T.matrix("x")
s = theano.shared(s_init, name="s")
f = synk.function([x], updates=[(s, T.sum(x * s, axis=0))])
synk.distribute()
x_dat = synk.data(np.array([[1, 1], [2, 2], [3, 3], [4, 4]], dtype="float32"))

f.as_theano(x_dat.data)          # the plain PyTensor function, in the master only
print("s after a plain call:", s.get_value())
assert np.array_equal(s.get_value(), [10, 10])

s.set_value(s_init)              # the master's copy only
f(x_dat)                         # rank 0 gets rows 0-1, rank 1 rows 2-3
print("local s after a Synkhronos call:", s.get_value())
gathered = synk.gather(s, nd_up=1)
print("gathered s:\n", gathered)
assert np.array_equal(gathered, [[3, 3], [7, 7]])

synk.reduce(s, op="sum")         # into the master, in place
assert np.array_equal(synk.gather(s, nd_up=1), [[10, 10], [7, 7]])

synk.broadcast(s, s_init)        # every rank gets s_init
f(x_dat)
synk.all_reduce(s, op="sum")     # every rank gets the sum
print("gathered s after broadcast, call and all_reduce:\n", synk.gather(s, nd_up=1))
assert np.array_equal(synk.gather(s, nd_up=1), [[10, 10], [10, 10]])

# One rank at a time, and what each rank holds.
synk.set_value(1, s, np.zeros(2, dtype="float32"))
assert np.array_equal(synk.get_value(1, s), [0, 0])
print("lengths per rank:", synk.get_lengths(s), "shapes per rank:", synk.get_shapes(s))
synk.close()
print("All assertions passed.")
