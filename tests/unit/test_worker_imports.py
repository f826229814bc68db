"""A worker imports what its first ``distribute()`` needs while the master is still
building graphs: PyTensor, and on a CPU rank whose functions compile with JAX by
default, JAX and PyTensor's JAX backend, without starting a JAX backend (its
platform and cores are chosen at ``distribute()``)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

_PROBE = """
import sys
from synkhronos._session.worker import _import_libraries
_import_libraries(sys.argv[1])
from jax._src.xla_bridge import backends_are_initialized
print("pytensor" in sys.modules, "pytensor.link.jax.dispatch" in sys.modules, backends_are_initialized())
"""


def _imported(device, flags=""):
    """(PyTensor imported, PyTensor's JAX backend imported, a JAX backend started)
    after a worker's background import, in a fresh process."""
    env = dict(os.environ, PYTENSOR_FLAGS=flags)
    proc = subprocess.run([sys.executable, "-c", _PROBE, device], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return tuple(word == "True" for word in proc.stdout.split())


def test_a_cpu_rank_imports_jax_where_it_is_the_default_linker_and_starts_no_backend():
    assert _imported("cpu") == (True, True, False)


def test_a_cpu_rank_whose_mode_is_chosen_leaves_jax_unimported():
    assert _imported("cpu", "mode=NUMBA") == (True, False, False)


def test_a_gpu_rank_imports_pytensor_only_here():
    """A GPU rank imports JAX as it joins the NCCL communicator."""
    assert _imported("gpu") == (True, False, False)
