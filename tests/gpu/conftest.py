"""GPU tests: marked ``gpu`` and skipped unless two GPUs, JAX and CuPy are there.

They reuse the CPU suites' tests with GPU ranks.  ``fork()``'s default precision
computes float32 matrix products in full float32, so results compare with
PyTensor on the CPU at float32 tolerances.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from synkhronos._devices.gpu import gpu_stack_available, visible_gpus  # noqa: E402

_REASON = None
if not gpu_stack_available():
    _REASON = "needs JAX and CuPy (pip install synkhronos[gpu])"
elif len(visible_gpus()) < 2:
    _REASON = "needs 2 GPUs"


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if _REASON:
                item.add_marker(pytest.mark.skip(reason=_REASON))
