"""GPU tests: marked ``gpu`` and skipped unless JAX, CuPy and two GPUs are there
(one GPU for modules marked ``pytest.mark.gpus(1)``).

They reuse the CPU suites' tests (``tests/processes``, importable by module name:
``pythonpath`` in pyproject.toml) with GPU ranks, with ``floatX=float32`` (a GPU
user's usual choice; ``fork()`` leaves floatX as set).  ``fork()``'s default
precision computes float32 matrix products in full float32, so results compare
with PyTensor on the CPU at float32 tolerances.
"""

import os

import pytensor
import pytest

from synkhronos._devices.gpu import gpu_stack_available, visible_gpus

_STACK = gpu_stack_available()
_GPUS = len(visible_gpus()) if _STACK else 0


def pytest_configure(config):
    config.addinivalue_line("markers", "gpus(n): needs n GPUs (default 2)")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            marker = item.get_closest_marker("gpus")
            need = marker.args[0] if marker else 2
            if not _STACK:
                item.add_marker(pytest.mark.skip(reason="needs JAX and CuPy (pip install synkhronos[gpu])"))
            elif _GPUS < need:
                item.add_marker(pytest.mark.skip(reason="needs %d GPUs" % need))


@pytest.fixture(autouse=True, scope="module")
def _float32():
    """floatX float32 for each GPU module, as a GPU user sets it (restored after)."""
    before = pytensor.config.floatX
    pytensor.config.floatX = "float32"
    yield
    pytensor.config.floatX = before
