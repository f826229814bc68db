"""Test settings: PyTensor compiles with FAST_COMPILE so that a cold machine does not
spend minutes in Numba; workers inherit the flag through the environment."""

import os

os.environ.setdefault("PYTENSOR_FLAGS", "mode=FAST_COMPILE")

import pytest  # noqa: E402

import synkhronos as synk  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _close_after_module():
    yield
    synk.close()
