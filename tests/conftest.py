"""Test settings: PyTensor compiles with FAST_COMPILE so that a cold machine does not
spend minutes in Numba; workers inherit the flag through the environment."""

import os

os.environ.setdefault("PYTENSOR_FLAGS", "mode=FAST_COMPILE")

import pytest  # noqa: E402

import synkhronos as synk  # noqa: E402


def pytest_addoption(parser):
    group = parser.getgroup("synkhronos")
    group.addoption("--fuzz-n", type=int, default=2000,
                    help="malformed calls the fuzz suite makes (default 2000; more for local runs)")
    group.addoption("--fuzz-seed", type=int, default=0, help="seed of the fuzz suite (default 0)")
    group.addoption("--leak-cycles", type=int, default=12,
                    help="fork/close cycles of the leak test (default 12)")


@pytest.fixture(autouse=True, scope="module")
def _close_after_module():
    yield
    synk.close()
