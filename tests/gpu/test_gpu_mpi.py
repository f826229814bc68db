"""Several "hosts" on one GPU machine: ``mpirun -n <GPUs>`` with every rank its own
host (``SYNKHRONOS_HOST_PER_RANK=1``), so that Data copies, inline arrays and one
NCCL communicator across the "hosts" really run; every function result and
collective must equal the single-host GPU run's."""

import subprocess
import sys

import numpy as np
import pytest
from _mpirun import MPIRUN, ROOT, mpi_env

from synkhronos._devices.gpu import visible_gpus

SESSION = ROOT / "tests" / "_mpi_session.py"


@pytest.mark.skipif(MPIRUN is None, reason="needs mpi4py and mpirun (synkhronos[mpi])")
def test_gpu_session_under_mpirun_matches_the_single_host_run(tmp_path):
    n = len(visible_gpus())
    env = mpi_env(gpus=True, SYNKHRONOS_HOST_PER_RANK="1")
    cmd = [MPIRUN, "-n", str(n), sys.executable, str(SESSION), str(tmp_path / "mpi.npz"), "gpu"]
    multi = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert multi.returncode == 0, multi.stdout[-3000:] + multi.stderr[-3000:]
    assert "%d GPUs initialized on %d hosts" % (n, n) in multi.stderr
    single = subprocess.run([sys.executable, str(SESSION), str(tmp_path / "one.npz"), "gpu"],
                            capture_output=True, text=True, timeout=600, env=mpi_env(gpus=True), cwd=ROOT)
    assert single.returncode == 0, single.stderr[-3000:]
    one, many = np.load(tmp_path / "one.npz"), np.load(tmp_path / "mpi.npz")
    assert sorted(one.files) == sorted(many.files)
    for key in one.files:
        np.testing.assert_allclose(many[key], one[key], rtol=1e-5, atol=1e-6, err_msg=key)
