"""The symbolic-shape tests of the CPU suite on 2 GPU ranks (JAX mode by default):
a CNN with a ``tensor4`` input of unknown size and parameters without static
shapes trains step for step like one CPU process."""

import pytest
from test_shapes import (  # noqa: F401  (the tests themselves)
    make_env,
    test_shape_computed_outputs,
    test_sliceable_shareds_with_symbolic_shapes,
    test_symbolic_cnn_trains_like_one_process,
)

import synkhronos as synk


@pytest.fixture(scope="module")
def env():
    yield make_env(2, use_gpu=True)
    synk.close()
