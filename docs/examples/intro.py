"""The introductory example of the original Synkhronos manual, ported to PyTensor.

Only the imports changed: ``import pytensor as theano`` and ``import
pytensor.tensor as T`` keep the Theano names.
"""

import numpy as np
import pytensor as theano
import pytensor.tensor as T

import synkhronos as synk

synk.fork()                      # 1. start one rank per GPU, or per CPU core
x = T.matrix("x")                # 2. build variables and graphs as usual
y = T.vector("y")
z = T.mean(x.dot(y), axis=0)
f_th = theano.function(inputs=[x, y], outputs=z)
f = synk.function(inputs=[x], bcast_inputs=[y], outputs=z)  # 3. build through Synkhronos
synk.distribute()                # 4. replicate the functions in the workers

x_dat = np.random.randn(100, 10).astype("float32")          # 5. run
y_dat = np.random.randn(10).astype("float32")
x_synk = synk.data(x_dat)
y_synk = synk.data(y_dat)
r_th = f_th(x_dat, y_dat)
r = f(x_synk, y_synk)

assert np.allclose(r, r_th, atol=1e-6)  # float32 sums in another order: close to 0, rtol alone is too strict
print("All assertions passed.")
