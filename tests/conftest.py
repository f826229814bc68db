"""Test settings: PyTensor compiles with FAST_COMPILE so that a cold machine does not
spend minutes in Numba; workers inherit the flag through the environment.  PyTensor
2.x (which PyMC pins) still builds C thunks with g++ under FAST_COMPILE, seconds per
fresh process; ``cxx=`` gives it Python thunks, as PyTensor 3's FAST_COMPILE has.  Test
modules run in parallel (pytest-xdist, ``-n auto`` in pyproject.toml): how many at
once is decided here; ``-n 0`` runs them one after the other."""

import os
from importlib.metadata import version

PYTENSOR_2 = version("pytensor").startswith("2.")
os.environ.setdefault("PYTENSOR_FLAGS", "mode=FAST_COMPILE" + (",cxx=" if PYTENSOR_2 else ""))

import pytest  # noqa: E402

import synkhronos as synk  # noqa: E402

MAX_PARALLEL_MODULES = 4


def pytest_xdist_auto_num_workers(config):
    """Test processes for ``-n auto``: one per core up to MAX_PARALLEL_MODULES.
    Most tests wait on their sessions' workers more than they compute (run one
    module at a time, the suite keeps one of two cores busy), so two modules at
    once fit even on 2 cores.  None on one core, and none where GPUs
    are visible: GPU tests take every GPU, so two at once would share them."""
    from synkhronos._devices import visible_gpus

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores < 2 or visible_gpus():
        return 0
    return min(cores, MAX_PARALLEL_MODULES)


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
