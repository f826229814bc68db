"""The seed documentation's two examples, run as the user scripts they are (no
``__main__`` guard, only the imports of ``theano`` renamed to ``pytensor``), with their
printed values.  The shared-variable example mixes float32 data with ``T.matrix``, as
Theano setups with ``floatX = float32`` in their ``.theanorc`` did: it sets that
floatX in its first line (``fork()`` leaves floatX as the user set it)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# The manual's introductory example is also the docs' (tests/processes/test_docs.py runs it too).
INTRO = (Path(__file__).resolve().parents[2] / "docs" / "examples" / "intro.py").read_text()

SHARED = """
import numpy as np
import pytensor as theano
import pytensor.tensor as T
import synkhronos as synk
theano.config.floatX = "float32"  # the manual's .theanorc

synk.fork(2)
s_init = np.ones(2, dtype='float32')
x = T.matrix('x')
s = theano.shared(s_init, name='s')
f = synk.function([x], updates=[(s, T.sum(x * s, axis=0))])
synk.distribute()
x_dat = synk.data(np.array([[1, 1],
                            [2, 2],
                            [3, 3],
                            [4, 4]]).astype('float32'))
print("s initial:", s.get_value().tolist())
f.as_theano(x_dat.data)
print("s after Theano call:", s.get_value().tolist())
s.set_value(s_init)
f(x_dat)
print("local s after reset and Synkhronos call:", s.get_value().tolist())
gathered_s = synk.gather(s, nd_up=1)
print("gathered s:", gathered_s.tolist())
synk.reduce(s, op="sum")
print("local s after in-place reduce:", s.get_value().tolist())
gathered_s = synk.gather(s, nd_up=1)
print("gathered s after reduce:", gathered_s.tolist())
synk.broadcast(s, s_init)
f(x_dat)
synk.all_reduce(s, op="sum")
gathered_s = synk.gather(s, nd_up=1)
print("gathered s after all-reduce:", gathered_s.tolist())
"""


def run(script, tmp_path, flags=None, stderr=False):
    """``script``'s output, run as a user runs it: PyTensor's flags ``flags``
    (default none: Synkhronos's functions compile with JAX)."""
    path = tmp_path / "example.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ)
    env.pop("PYTENSOR_FLAGS", None)
    if flags:
        env["PYTENSOR_FLAGS"] = flags
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return (proc.stdout, proc.stderr) if stderr else proc.stdout


def test_introductory_example(tmp_path):
    out, err = run(INTRO, tmp_path, stderr=True)
    # Status lines are log records, on stderr (tests/processes/test_logging.py).
    assert "Synkhronos attempting to use 2 of 2 detected CPU cores..." in err or "detected CPU" in err
    assert "...distribution complete (" in err
    assert out.strip().endswith("All assertions passed.")


def test_shared_variable_example(tmp_path):
    out = run(SHARED, tmp_path)
    expected = [
        "s initial: [1.0, 1.0]",
        "s after Theano call: [10.0, 10.0]",
        "local s after reset and Synkhronos call: [3.0, 3.0]",
        "gathered s: [[3.0, 3.0], [7.0, 7.0]]",
        "local s after in-place reduce: [10.0, 10.0]",
        "gathered s after reduce: [[10.0, 10.0], [7.0, 7.0]]",
        "gathered s after all-reduce: [[10.0, 10.0], [10.0, 10.0]]",
    ]
    lines = [line for line in out.splitlines() if not line.startswith(("Synkhronos", "..."))]
    assert lines == expected
