"""The collective tests of the CPU suite on one GPU rank (NCCL with a communicator
of one), for a machine with a single GPU."""

import pytest
import test_collectives
from test_collectives import *  # noqa: F401,F403  (the tests themselves)
from test_collectives import make_env

import synkhronos as synk

pytestmark = pytest.mark.gpus(1)

# These need ranks whose values differ in shape or content: two at least.
for _name in ("test_gather_uneven_shapes", "test_all_gather_refuses_what_does_not_concatenate",
              "test_integer_avg_truncates", "test_reduce_mismatched_shapes"):
    assert hasattr(test_collectives, _name), _name  # renamed there: update this list
    del globals()[_name]


@pytest.fixture(scope="module")
def env():
    yield make_env(1, use_gpu=True)
    synk.close()
