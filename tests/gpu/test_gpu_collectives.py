"""Every collective test of the CPU suite, on 2 GPU ranks (NCCL by default)."""

import pytest
from test_collectives import *  # noqa: F401,F403  (the tests themselves)
from test_collectives import make_env

import synkhronos as synk


@pytest.fixture(scope="module")
def env():
    # The master keeps the GPU JAX started on, so master_rank=1 is tested in its
    # own process (test_gpu_runtime.py).
    yield make_env(2, use_gpu=True)
    synk.close()
