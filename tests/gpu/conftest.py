"""GPU tests: marked ``gpu`` and skipped unless two GPUs, JAX and CuPy are there.

They reuse the CPU suites' tests with GPU ranks.  JAX computes float32 matrix
products at full precision here, so results compare with PyTensor on the CPU.
"""

import os
import sys

os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
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
