"""Several hosts under MPI, on one machine: ``mpirun -n 4 --oversubscribe`` with
``SYNKHRONOS_HOST_PER_RANK=1``, so that every rank is its own "host" and the
cross-host paths (Data copies over MPI, inline arrays, MPI collectives, commands
over TCP) really run.  Skipped without mpi4py and an ``mpirun``."""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from _mpirun import MPICH, MPIRUN, ROOT, mpi_env
from _procs import new_orphans, session_segments

HERE = ROOT / "tests"

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="needs mpi4py and mpirun (synkhronos[mpi])")


def mpirun(n, script, *args, options=(), env=None, timeout=180):
    """Run ``script`` on ``n`` MPI ranks, every rank its own host unless ``env``
    says otherwise."""
    env = mpi_env(**{"SYNKHRONOS_HOST_PER_RANK": "1", **(env or {})})
    cmd = [MPIRUN, "-n", str(n), "--oversubscribe", *options, sys.executable, str(script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.parametrize("layout, hosts", [({}, 4), ({"SYNKHRONOS_RANKS_PER_HOST": "2"}, 2)],
                         ids=["4 hosts of 1", "2 hosts of 2"])
def test_functions_and_collectives_match_the_single_host_runtime(tmp_path, layout, hosts):
    """Every rank its own host, and 2 hosts of 2 ranks (the second host's
    leader is not the master, and shares its segments with rank 3)."""
    before = session_segments()
    multi = mpirun(4, HERE / "_mpi_session.py", tmp_path / "mpi.npz", env=layout)
    assert multi.returncode == 0, multi.stdout + multi.stderr
    assert "4 MPI ranks on %d hosts" % hosts in multi.stderr
    single = subprocess.run([sys.executable, str(HERE / "_mpi_session.py"), tmp_path / "one.npz"],
                            capture_output=True, text=True, timeout=180, env=mpi_env(), cwd=ROOT)
    assert single.returncode == 0, single.stderr
    one, many = np.load(tmp_path / "one.npz"), np.load(tmp_path / "mpi.npz")
    assert sorted(one.files) == sorted(many.files) and len(one.files) > 40
    for key in one.files:
        np.testing.assert_allclose(many[key], one[key], rtol=1e-6, err_msg=key)
    assert not new_orphans(before)


def test_an_error_on_another_host_reaches_the_master_and_the_session_goes_on():
    out = mpirun(4, HERE / "_mpi_fault.py", "call", env={"SYNKHRONOS_FAULT": "2:call:2:raise"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CAUGHT" in out.stdout and "RuntimeError in worker rank 2" in out.stdout


@pytest.mark.parametrize("where, fault", [("call", "2:call:2:crash"), ("collective", "2:collective:1:crash")])
def test_a_dead_rank_on_another_host_raises_in_the_master(where, fault):
    """``--enable-recovery``: Open MPI's launcher lets the other ranks run on."""
    before = session_segments()
    t0 = time.monotonic()
    out = mpirun(4, HERE / "_mpi_fault.py", where, options=["--enable-recovery"],
                 env={"SYNKHRONOS_FAULT": fault}, timeout=120)
    caught = [ln for ln in out.stdout.splitlines() if ln.startswith("CAUGHT")]
    assert caught, out.stdout + out.stderr
    assert "worker rank 2" in caught[0] and "host" in caught[0] and "rank2" in caught[0]
    assert float(caught[0].split()[2]) < 10
    assert "CLOSED: Synkhronos is not forked" in out.stdout
    assert time.monotonic() - t0 < 60
    assert not new_orphans(before)


def test_fewer_ranks_than_launched_and_an_unchanged_example(tmp_path):
    """The docs' examples call ``fork(2)``: under ``mpirun -n 4`` ranks 2 and 3
    wait for the end, and the example's own checks pass."""
    for name in ("functions.py", "shared_variables.py"):
        out = mpirun(4, ROOT / "docs" / "examples" / name)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "All assertions passed." in out.stdout
        assert "2 MPI ranks on 2 hosts" in out.stderr


def test_too_many_ranks_asked_is_an_error_and_nothing_hangs():
    script = ("import synkhronos as synk\n"
              "try:\n    synk.fork(5, use_gpu=False)\n"
              "except ValueError as e:\n    print('REFUSED', e)\n")
    out = subprocess.run([MPIRUN, "-n", "2", "--oversubscribe", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=120, env=mpi_env(), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "REFUSED n_parallel must be at most the number of MPI ranks (2) under an MPI launch, got 5" \
        in out.stdout


def test_seed_examples_run_unchanged_with_the_single_process_output(tmp_path):
    """The manual's two examples under ``mpirun -n 4``: the intro's own checks pass,
    and the shared-variable example (``fork(2)``) prints what it prints without MPI."""
    from test_seed_examples import INTRO, SHARED

    for name, script in (("intro.py", INTRO), ("shared.py", SHARED)):
        (tmp_path / name).write_text(script)
    intro = mpirun(4, tmp_path / "intro.py")
    assert intro.returncode == 0, intro.stdout + intro.stderr
    assert "4 MPI ranks on 4 hosts" in intro.stderr and "All assertions passed." in intro.stdout
    multi = mpirun(4, tmp_path / "shared.py")
    assert multi.returncode == 0, multi.stdout + multi.stderr
    single = subprocess.run([sys.executable, str(tmp_path / "shared.py")], capture_output=True, text=True,
                            timeout=180, env=mpi_env(), cwd=ROOT)
    assert single.returncode == 0, single.stderr
    assert multi.stdout == single.stdout and "gathered s after all-reduce" in multi.stdout


def test_demos_run_unchanged_with_the_single_process_results(tmp_path):
    """The MNIST demo (one epoch) under ``mpirun -n 4`` and the ResNet demo (a tiny
    ResNet, 2 steps) under ``mpirun -n 2``: the same accuracies and losses as
    without MPI."""
    mnist = [str(ROOT / "demos" / "mnist" / "train_mnist.py"), "--n", "2", "--epochs", "1"]
    multi = mpirun(4, *mnist)
    single = subprocess.run([sys.executable, *mnist], capture_output=True, text=True, timeout=300,
                            env=mpi_env(), cwd=ROOT)
    assert multi.returncode == 0 and single.returncode == 0, multi.stderr + single.stderr
    accuracy = [re.findall(r"accuracy ([0-9.]+)", ln)
                for ln in (multi.stdout + "\n" + single.stdout).splitlines() if ln.startswith("Summary")]
    assert len(accuracy) == 2 and len(accuracy[0]) == 2 and accuracy[0] == accuracy[1], accuracy
    # (Batch norm over 4 images of 1x1 pixels in the last stage would amplify the
    # different summation order of MPI's all-reduce into visibly different losses.)
    resnet = [str(ROOT / "demos" / "resnet" / "train_resnet.py"), "--cpu", "--steps", "2", "--warmup", "0",
              "--blocks", "1,1,1,1", "--image-size", "32", "--width", "8", "--classes", "10",
              "--batch-size", "4"]
    multi = mpirun(2, *resnet)
    # (The demo's own child run on 2 ranks: its parent would also time 1 rank, for nothing here.)
    single = subprocess.run([sys.executable, *resnet, "--_child", "2"], capture_output=True, text=True,
                            timeout=300, env=mpi_env(), cwd=ROOT)
    assert multi.returncode == 0 and single.returncode == 0, multi.stderr + single.stderr
    # "  2 rank(s) step 0: loss 3.139, 18.8 images/s": the losses, not the speeds
    losses = [[float(ln.split(",")[0].split()[-1]) for ln in out.stdout.splitlines()
               if ln.startswith("  2 rank(s) step")] for out in (multi, single)]
    assert len(losses[0]) == 2 and np.allclose(losses[0], losses[1], rtol=2e-3), losses
    assert "on 2 MPI ranks" in multi.stdout


@pytest.mark.skipif(MPICH is None, reason="set SYNKHRONOS_TEST_MPICH to an MPICH prefix (pip install mpich)")
def test_mpich_hydra_launch(tmp_path):
    """The README's MPICH line: the session under MPICH's ``mpiexec`` equals the
    single-host run, and with ``-disable-auto-cleanup`` a dead rank raises in
    the master instead of Hydra ending the job."""
    hydra = os.path.join(MPICH, "bin", "mpiexec")
    env = mpi_env(SYNKHRONOS_HOST_PER_RANK="1", MPI4PY_LIBMPI=os.path.join(MPICH, "lib", "libmpi.so.12"))
    run = [hydra, "-n", "4", sys.executable]
    multi = subprocess.run(run + [str(HERE / "_mpi_session.py"), str(tmp_path / "mpich.npz")],
                           capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert multi.returncode == 0, multi.stdout + multi.stderr
    assert "on 4 hosts" in multi.stderr
    single = subprocess.run([sys.executable, str(HERE / "_mpi_session.py"), str(tmp_path / "one.npz")],
                            capture_output=True, text=True, timeout=180, env=mpi_env(), cwd=ROOT)
    assert single.returncode == 0, single.stderr
    one, many = np.load(tmp_path / "one.npz"), np.load(tmp_path / "mpich.npz")
    assert sorted(one.files) == sorted(many.files)
    for key in one.files:
        np.testing.assert_allclose(many[key], one[key], rtol=1e-6, err_msg=key)
    before = session_segments()
    crash = subprocess.run([hydra, "-disable-auto-cleanup", "-n", "4", sys.executable,
                            str(HERE / "_mpi_fault.py"), "call"], capture_output=True, text=True,
                           timeout=120, env=dict(env, SYNKHRONOS_FAULT="2:call:2:crash"), cwd=ROOT)
    caught = [ln for ln in crash.stdout.splitlines() if ln.startswith("CAUGHT")]
    assert caught and "worker rank 2" in caught[0], crash.stdout + crash.stderr
    assert float(caught[0].split()[2]) < 10
    assert "CLOSED: Synkhronos is not forked" in crash.stdout
    assert not new_orphans(before)
