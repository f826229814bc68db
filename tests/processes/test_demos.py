"""Run the demos as scripts: each must exit cleanly and report that it passed."""

import subprocess
import sys
from pathlib import Path

import pytest
from _flags import reference_env

from synkhronos._devices.gpu import gpu_stack_available, visible_gpus

DEMOS = Path(__file__).resolve().parents[2] / "demos"
TIMEOUT = 300  # seconds; a demo takes a few (JAX compiles each function on every rank)


def run_demo(number, *args):
    env = reference_env()  # Synkhronos's functions as a user's; plain PyTensor's as FAST_COMPILE
    return subprocess.run([sys.executable, str(DEMOS / ("demo_%d.py" % number)), *args], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("number, n", [(1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (4, 3), (5, 3)])
def test_demo(number, n):
    proc = run_demo(number, "--n", str(n))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed" in proc.stdout, proc.stdout + proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr


_HAS_GPUS = gpu_stack_available() and bool(visible_gpus())


@pytest.mark.skipif(_HAS_GPUS, reason="GPUs here: tests/gpu runs the demos with --gpu")
def test_demo_gpu_flag_fails_clearly():
    proc = run_demo(1, "--gpu")
    assert proc.returncode != 0
    assert "use_gpu=False" in proc.stderr, proc.stderr
    assert "passed" not in proc.stdout
