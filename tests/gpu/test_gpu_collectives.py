"""Every collective test of the CPU suite, on 2 GPU ranks (NCCL by default)."""

import pytest
from test_collectives import *  # noqa: F401,F403  (the tests themselves)
from test_collectives import make_env

import synkhronos as synk


@pytest.fixture(scope="module", params=[0, 1], ids=["master0", "master1"])
def env(request):
    yield make_env(2, use_gpu=True, master_rank=request.param)
    synk.close()
