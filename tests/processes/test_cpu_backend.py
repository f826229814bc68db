"""CPU ranks compile a function that names no mode with JAX where PyTensor's mode
is its default, and a graph JAX cannot compute as it is with PyTensor's own
linker, saying why; a mode named by the user (argument or flag) is theirs.

The suite sets PyTensor's default linker and rewrites for its references
(``_flags.REFERENCE_FLAGS``), so these checks run in a fresh process with
PyTensor's defaults, linker included (the one a graph JAX cannot compute gets)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

_SCRIPT = """
import json, logging, sys
sys.path.insert(0, %r)
import numpy as np, pytensor, pytensor.tensor as pt
import synkhronos as synk
from _sleepy import sleepy  # a user's Op with a Python perform only: no JAX implementation

records = []

class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())

logging.getLogger("synkhronos").addHandler(Keep())
logging.getLogger("synkhronos").setLevel(logging.DEBUG)  # each function's linker, and why
pytensor.config.floatX = "float32"
synk.fork(2, use_gpu=False)
x = pt.matrix("x", dtype="float32")
d = pt.matrix("d", dtype="float64")
fns = {"plain": synk.function([x], outputs=((x ** 2).sum(), "sum"), name="plain"),
       "custom_op": synk.function([x], outputs=(sleepy(x, 0).sum(), "sum"), name="custom_op"),
              "numba_named": synk.function([x], outputs=(x.sum(), "sum"), name="numba_named", mode="NUMBA")}
synk.distribute()
x_np = np.arange(12, dtype="float32").reshape(6, 2)
out = {name: [type(f._core.plain.maker.linker).__name__, float(f(synk.data(x_np)))]
       for name, f in fns.items()}
w = pytensor.shared(np.ones(2, "float32"), name="w")  # updated by JAX, then read by Numba
step = synk.function([x], outputs=((x * w).sum(), "sum"), updates=[(w, w * 2)], name="step")
read = synk.function([x], outputs=((x * w).sum(), "sum"), name="read", mode="NUMBA")
synk.distribute()
out["mixed"] = [float(step(synk.data(x_np))), float(read(synk.data(x_np)))]
plain_read = pytensor.function([x], (x * w).sum(), mode="NUMBA")  # a user's own function
out["plain_after"] = float(plain_read(x_np))
synk.close()
pytensor.config.floatX = "float64"  # PyMC's precision: JAX's 64-bit mode
synk.fork(2, use_gpu=False)
d = pt.matrix("d", dtype="float64")
f64 = synk.function([d], outputs=((d * d).sum(), "sum"))
synk.distribute()
out["float64"] = [type(f64._core.plain.maker.linker).__name__, float(f64(synk.data(np.full((6, 2), 1 / 3))))]
synk.close()
print("@@" + json.dumps({"out": out, "log": records}))
"""


@pytest.fixture(scope="module")
def report():
    flags = ",".join(f for f in os.environ.get("PYTENSOR_FLAGS", "").split(",")
                     if f and not f.startswith(("mode=", "linker=", "optimizer=")))
    env = dict(os.environ, PYTENSOR_FLAGS=flags)
    script = _SCRIPT % os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: _sleepy
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")][-1]
    return json.loads(line[2:])


def test_a_function_naming_no_mode_compiles_with_jax(report):
    linker, value = report["out"]["plain"]
    assert linker == "JAXLinker"
    assert value == float((__import__("numpy").arange(12.0) ** 2).sum())


def test_an_op_without_jax_falls_back_and_is_named(report):
    linker, value = report["out"]["custom_op"]
    assert linker != "JAXLinker" and value == 66.0
    said = [m for m in report["log"] if "custom_op" in m]
    assert said and "Sleepy" in said[0] and "default linker" in said[0], report["log"]


def test_float64_stays_float64_where_floatx_is_float64(report):
    """JAX's 64-bit mode follows floatX, as on GPU ranks; the status line says which."""
    linker, value = report["out"]["float64"]
    assert linker == "JAXLinker"
    assert abs(value - 12 / 9) < 1e-14  # float32 would be off by about 1e-7
    said = [m for m in report["log"] if "compile with JAX" in m]
    assert len(said) == 2 and "floatX float32: float64 and int64 values are kept in 32 bits" in said[0]
    assert "floatX float64: float64 graphs run in float64" in said[1], said


def test_values_a_jax_function_updated_are_read_by_other_linkers(report):
    """A JAX function leaves JAX arrays in the shared variables it updates: a Numba
    function of the session, and the user's own, read them after it (sum of the
    rows 0..11 times w: 66 with w = 1, then 132 with w = 2)."""
    assert report["out"]["mixed"] == [66.0, 132.0]
    assert report["out"]["plain_after"] == 132.0


def test_a_mode_named_by_the_user_stands(report):
    assert report["out"]["numba_named"][0] == "NumbaLinker"


def test_the_log_says_which_linker_each_function_got_and_why(report):
    def built(name):
        lines = [m for m in report["log"] if "built by PyTensor" in m and repr(name) in m]
        assert len(lines) == 1, report["log"]
        return lines[0]

    assert "linker JAXLinker: CPU ranks' default" in built("plain")
    assert "JAX cannot compile it" in built("custom_op") and "Sleepy" in built("custom_op")
    assert "linker NumbaLinker: the mode the function names" in built("numba_named")
