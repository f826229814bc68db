"""CPU ranks on a machine whose JAX has a GPU (``fork(use_gpu=False)``): every
rank computes on its CPU cores, the master's share included.  JAX's default
device there is the GPU, where a float32 product runs in TF32; the session makes
the CPU JAX's default device while it lasts, and close() gives the default back."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpus(1)

_SCRIPT = """
import json
import numpy as np, pytensor, pytensor.tensor as pt, jax
import synkhronos as synk
platform = jax.devices()[0].platform
synk.fork(2, use_gpu=False)
rng = np.random.default_rng(0)
x = pt.matrix("x", dtype="float32")
w = pytensor.shared(rng.standard_normal((512, 64)).astype("float32"))
f = synk.function([x], outputs=(pt.dot(x, w), None), mode="JAX")
synk.distribute()
xv = rng.standard_normal((256, 512)).astype("float32")
got = np.asarray(f(synk.data(xv))).reshape(256, 64)  # (None: each rank's rows, by rank)
want = xv.astype(np.float64) @ w.get_value().astype(np.float64)
err = np.abs(got - want) / (np.abs(want) + 1)
inside = repr(jax.config.jax_default_device)
synk.close()
print(json.dumps(dict(platform=platform, dtype=str(got.dtype), master_err=float(err[:128].max()),
                      worker_err=float(err[128:].max()), inside=inside,
                      after=repr(jax.config.jax_default_device))))
"""


def test_cpu_ranks_compute_on_the_cpu_where_jax_has_a_gpu():
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["platform"] == "gpu", "the premise: JAX's default device here is a GPU"
    assert out["dtype"] == "float32"
    # float32 on the CPU: 1.4e-5 on the VM; TF32 on the GPU: about 1e-3.
    assert out["worker_err"] < 1e-4, out
    assert out["master_err"] < 1e-4, "the master's rows were computed off the CPU: %s" % out
    assert out["inside"] == "'cpu'" and out["after"] == "None", out
