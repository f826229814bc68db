"""Test settings for every folder of the suite (see docs/contributing.md, "Tests").

Synkhronos functions compile as a user's do (JAX on CPU ranks), the tests' own
PyTensor functions as FAST_COMPILE does, so that a cold machine does not spend
minutes in Numba or g++ on references (``_flags.REFERENCE_FLAGS``); workers
inherit the flags through the environment.

Ctrl-C: a process started with SIGINT ignored (a background job of a script,
``cmd &``, as the shell starts it) would pass the ignoring on to every child, and
Python installs no KeyboardInterrupt handler where SIGINT is ignored at start-up,
so the tests that signal pytest's own process or a user script would wait in
vain.  Here pytest's process takes Python's default handler back; the children it
starts then begin with the default disposition, as from a terminal.  (The library
is not touched: its workers still ignore SIGINT themselves.)

Parallel modules: with pytest-xdist installed (and not disabled, ``-p no:xdist``),
a run with no ``-n`` of its own gets ``-n auto --dist loadfile``: a module's tests
stay together, in order, in one process, and ``_Parallel`` decides how many
processes.  ``-n 0`` runs the modules one after the other; without pytest-xdist
the suite runs in pytest's process alone."""

import os
import signal

from _flags import REFERENCE_FLAGS

os.environ.setdefault("PYTENSOR_FLAGS", REFERENCE_FLAGS)
# synkhronos.pymc's copies share their rows among every rank, and CPU ranks run
# them with JAX, rather than choosing either by timing: a test's path must not
# hang on how busy the machine is.  tests/processes/test_pymc_placement.py and
# test_pymc_linker.py run the choices.
os.environ.setdefault("SYNKHRONOS_PYMC_RANKS", "all")
os.environ.setdefault("SYNKHRONOS_PYMC_LINKER", "jax")

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

import synkhronos as synk  # noqa: E402

MAX_PARALLEL_MODULES = 4


class _Parallel:
    """pytest-xdist's settings, registered only where xdist is loaded (an unknown
    hook would stop pytest where it is not)."""

    @pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the options
    def pytest_cmdline_main(self, config):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return  # a worker runs its share itself
        if config.option.numprocesses is None:
            config.option.numprocesses = "auto"
        if config.option.dist == "no" and not config.option.distload:
            config.option.dist = "loadfile"

    def pytest_xdist_auto_num_workers(self, config):
        """Test processes for ``-n auto``: one more than the cores, up to
        MAX_PARALLEL_MODULES.  Most tests wait on their sessions' workers, on
        timeouts and on subprocesses more than they compute (run one module at a
        time, the suite keeps one of two cores busy), so on 2 cores three modules
        at once finished sooner than two (see docs/contributing.md).  None on one
        core.  GPU modules share the GPUs the same way: each session's JAX
        allocates as it goes (no preallocation), and NCCL communicators of
        different sessions do not meet."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if cores < 2:
            return 0
        return min(cores + 1, MAX_PARALLEL_MODULES)


def pytest_addoption(parser, pluginmanager):
    if pluginmanager.hasplugin("xdist") and not pluginmanager.has_plugin("synkhronos-parallel"):
        pluginmanager.register(_Parallel(), "synkhronos-parallel")
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
