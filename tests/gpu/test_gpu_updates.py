"""Every update-rule training test of the CPU suite, on 2 GPU ranks (JAX mode, NCCL)."""

import pytest
from test_updates import *  # noqa: F401,F403  (the tests themselves)
from test_updates import make_env

import synkhronos as synk


@pytest.fixture(scope="module")
def env():
    yield make_env(2, use_gpu=True)
    synk.close()
