"""The model-based test of the public API (``tests/_machine.py``) and the faults it
found (``tests/_regressions.py``) on one GPU rank: NCCL with a communicator of
one, values on the GPU, host copies through CuPy."""

import warnings

import _machine
import _regressions
import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk

pytestmark = pytest.mark.gpus(1)


def test_public_api_against_the_model_on_one_gpu_rank():
    session = _machine.Session(1, use_gpu=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Unshrunk: a GPU compiles anew for each new shape, and shrinking replays hundreds.
            _machine.run(session, 40, 30, derandomize=True, shrink=False)
    finally:
        synk.close()


def test_faults_found_by_the_model_stay_fixed_on_one_gpu_rank():
    try:
        env = _regressions.Env(1, use_gpu=True)
        for check in _regressions.CHECKS:
            check(env)
    finally:
        synk.close()


def test_broadcast_of_a_dtype_nccl_lacks_leaves_the_masters_value():
    """``broadcast(var, value, nccl=True)`` set the master's value before NCCL
    refused the dtype: the refusal now comes first."""
    synk.fork(1, use_gpu=True)
    try:
        flags = pytensor.shared(np.zeros(4, "bool"), name="flags")
        synk.function([], (pt.as_tensor(flags).size, "sum"))
        synk.distribute()
        with pytest.raises(TypeError, match="NCCL has no data type for bool"):
            synk.broadcast(flags, np.ones(4, "bool"), nccl=True)
        np.testing.assert_array_equal(synk.get_value(0, flags), np.zeros(4, "bool"))
    finally:
        synk.close()
