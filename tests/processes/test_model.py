"""The model-based test of the whole public API (``_machine.py``): Hypothesis
drives random sequences of calls against a plain-numpy model, on 1-4 CPU ranks
and under MPI over loopback (every rank its own host), with the same sequences
every run; also from 2 and 4 threads at once against one session, each thread
with its own machine and model.  Then the faults it found, each as a plain test
(``_regressions.py``).

``python tests/_machine.py --seconds 600`` runs fresh sequences for as long as
asked and prints how many ran (``--threads 4``: from four threads at once).
"""

import subprocess
import sys
import warnings

import _machine
import _regressions
import pytest
from _mpirun import MPIRUN, ROOT, mpi_env

import synkhronos as synk

HERE = ROOT / "tests"
# Sequences per rank count: about 40 s in all on a 2-core machine.
EXAMPLES = {1: 40, 2: 40, 3: 35, 4: 30}
STEPS = 30
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="needs mpi4py and mpirun (synkhronos[mpi])")


@pytest.mark.parametrize("n", sorted(EXAMPLES))
def test_public_api_against_the_model(n):
    session = _machine.Session(n)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the drawn values' NaN and infinity arithmetic
            _machine.run(session, EXAMPLES[n], STEPS, derandomize=True)
    finally:
        synk.close()


# Sequences per thread, on 2 ranks: about 35 s for both on a 2-core machine.
THREADED = {2: 40, 4: 25}


@pytest.mark.parametrize("threads", sorted(THREADED))
def test_public_api_from_threads_against_the_model(threads):
    """``threads`` machines drive one session at once, each from its own thread,
    on its own variables and functions and against its own model."""
    session = _machine.Session(2, lanes=threads)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # filters are global: this covers the threads too
            _machine.run_threads(session, threads, THREADED[threads], STEPS, derandomize=True)
    finally:
        synk.close()


def _mpirun(n, *args):
    return subprocess.run([MPIRUN, "-n", str(n), "--oversubscribe", sys.executable, *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=mpi_env(SYNKHRONOS_HOST_PER_RANK="1"))


@needs_mpi
def test_public_api_against_the_model_under_mpi():
    out = _mpirun(3, HERE / "_machine.py", "--ranks", "3", "--examples", 30, "--steps", STEPS)
    assert out.returncode == 0, out.stdout + out.stderr[-6000:]
    assert "model-based test: 3 ranks (CPU, MPI)" in out.stdout and "0 failures" in out.stdout


@pytest.fixture(scope="module", params=[2, 3], ids=["n2", "n3"])
def env(request):
    yield _regressions.Env(request.param)
    synk.close()


@pytest.mark.parametrize("check", _regressions.CHECKS, ids=lambda c: c.__name__)
def test_fault_found_by_the_model_stays_fixed(env, check):
    check(env)


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_faults_found_by_the_model_stay_fixed_under_mpi(n):
    out = _mpirun(n, HERE / "_regressions.py")
    assert out.returncode == 0, out.stdout + out.stderr[-6000:]
    assert [ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("ok ")] == \
        [c.__name__ for c in _regressions.CHECKS]
