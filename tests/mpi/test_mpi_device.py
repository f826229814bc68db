"""MpiCpuDevice's collectives across 3 MPI ranks (tests/_mpi_device_check.py,
under ``mpirun``); skipped without mpi4py or ``mpirun``."""

import subprocess
import sys

import pytest
from _mpirun import MPIRUN, ROOT, mpi_env

__all__ = []

SCRIPT = ROOT / "tests" / "_mpi_device_check.py"
N_RANKS = 3


@pytest.mark.skipif(MPIRUN is None, reason="needs mpi4py and mpirun (pip install synkhronos[mpi])")
def test_mpi_collectives():
    env = mpi_env()
    mpirun = MPIRUN
    # --oversubscribe: 3 ranks on a machine with fewer cores.  ``-m mpi4py``
    # aborts every rank when one raises, so a failing rank cannot leave the
    # others waiting in a collective.
    cmd = [mpirun, "-n", str(N_RANKS), "--oversubscribe", sys.executable, "-m", "mpi4py", str(SCRIPT)]
    try:
        proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail("mpirun did not finish in 120 s:\n%s\n%s" % (exc.stdout, exc.stderr))
    assert proc.returncode == 0, "mpirun exited with %d:\n%s\n%s" % (proc.returncode, proc.stdout,
                                                                      proc.stderr)
    assert "OK: 0 failures" in proc.stdout, proc.stdout
