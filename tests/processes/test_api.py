"""The public surface: names, docstrings, status lines, lifecycle."""

import importlib
import importlib.util
import inspect
import os
import pkgutil
import subprocess
import sys

import pytest

import synkhronos as synk


@pytest.mark.parametrize("module", ["synkhronos", "synkhronos.extensions.updates",
                                    "synkhronos.extensions.train", "synkhronos.extensions.nnet"])
def test_every_public_name_has_a_docstring(module):
    module = importlib.import_module(module)
    for name in module.__all__:
        obj = getattr(module, name)
        assert obj.__doc__ and obj.__doc__.strip(), name
        if not isinstance(obj, type):
            continue
        for attr, member in vars(obj).items():
            if not attr.startswith("_") and (callable(member) or isinstance(member, property)):
                # getdoc: an Op's make_node, perform... inherit PyTensor's docstrings.
                assert inspect.getdoc(getattr(obj, attr)), "%s.%s" % (name, attr)


def test_every_module_declares_all():
    no_pymc = importlib.util.find_spec("pymc") is None  # synkhronos.pymc needs it
    for info in pkgutil.walk_packages(synk.__path__, "synkhronos.", onerror=lambda name: None):
        if no_pymc and info.name.startswith("synkhronos.pymc"):
            continue
        module = importlib.import_module(info.name)
        assert hasattr(module, "__all__"), info.name


def test_data_reference_methods_exist():
    names = ["data", "dtype", "ndim", "shape", "size", "alloc_size", "minibatch", "name",
             "__getitem__", "__setitem__", "__len__", "set_value", "set_length", "set_shape",
             "condition_data", "free_memory"]
    for n in names:
        assert hasattr(synk.Data, n), n
    for n in ["__call__", "as_theano", "build_inputs", "name", "output_modes", "update_modes"]:
        assert hasattr(synk.Function, n), n


def test_compat_module_names():
    from synkhronos.data_module import Data
    from synkhronos.function_module import Function

    assert Data is synk.Data and Function is synk.Function


def test_status_lines_lifecycle_and_refork(caplog):
    caplog.set_level("INFO", logger="synkhronos")  # status lines are log records (test_logging.py)
    with pytest.warns(UserWarning, match=r"max_n_var and max_dim do nothing") as said:
        assert synk.fork(2, use_gpu=False, max_n_var=10, max_dim=4) == 2
    assert said[0].filename == __file__, "the warning points at the caller's line"
    out = caplog.text
    assert "Synkhronos attempting to use 2 of" in out
    assert "Synkhronos: 2 CPU workers initialized, master rank: 0" in out
    with pytest.raises(RuntimeError, match="already forked"):
        synk.fork(2, use_gpu=False)
    synk.distribute()
    out = caplog.text
    assert "Synkhronos distributing functions..." in out and "...distribution complete (" in out
    synk.close()
    synk.close()  # idempotent
    assert synk.fork(n_parallel=1, use_gpu=False) == 1  # a fresh session; one rank, no workers
    synk.close()


def test_use_gpu_true_names_the_cpu_option():
    with pytest.raises(RuntimeError, match="use_gpu=False"):
        synk.fork(use_gpu=True)


def test_single_rank_runs_in_master():
    import numpy as np
    import pytensor.tensor as pt

    synk.fork(1, use_gpu=False)
    x = pt.matrix("x")
    f = synk.function([x], outputs=[x.mean(), (x.sum(axis=1), None)])
    synk.distribute()
    v = np.arange(12, dtype=x.dtype).reshape(4, 3)
    mean, rows = f(synk.data(v), num_slices=2)
    assert np.isclose(mean, v.mean()) and len(rows) == 1
    np.testing.assert_allclose(rows[0], v.sum(axis=1))
    synk.close()


def test_profile_workers_writes_profiles(tmp_path, monkeypatch):
    import glob
    import os
    import tempfile
    import time

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # workers inherit TMPDIR; reset our own cache too
    try:
        synk.fork(2, use_gpu=False, profile_workers=True)
        pid = synk._session.runtime.current().workers[1].process.pid
        synk.close()
    finally:
        tempfile.tempdir = None
    deadline = time.monotonic() + 10
    while not glob.glob(os.path.join(str(tmp_path), "synkhronos_worker_1_%d.prof" % pid)):
        assert time.monotonic() < deadline, os.listdir(tmp_path)
        time.sleep(0.05)


def test_receive_spin_is_read_from_the_environment_at_fork(monkeypatch):
    from synkhronos._common.env import SPIN_DEFAULT, SPIN_ENV, spin_seconds
    from synkhronos._session import runtime

    monkeypatch.delenv(SPIN_ENV, raising=False)
    assert spin_seconds() == SPIN_DEFAULT
    monkeypatch.setenv(SPIN_ENV, "250")
    assert spin_seconds() == pytest.approx(250e-6)
    synk.fork(2, use_gpu=False)
    try:
        assert runtime.current().spin == pytest.approx(250e-6)
        synk.distribute()  # the worker took its spin from the master's configuration
    finally:
        synk.close()


@pytest.mark.parametrize("bad", ["fast", "-5", "inf", "nan"])
def test_bad_spin_variable_is_named_and_nothing_starts(monkeypatch, bad):
    from synkhronos._common.env import SPIN_ENV
    from synkhronos._session import runtime

    monkeypatch.setenv(SPIN_ENV, bad)
    with pytest.raises(ValueError, match="%s must be a non-negative number of microseconds, got '%s'"
                       % (SPIN_ENV, bad)):
        synk.fork(2, use_gpu=False)
    assert runtime.current() is None


def test_mpi_launch_without_mpi4py_says_what_to_install(monkeypatch):
    """A script started by mpirun on a machine without mpi4py: a clear error from
    fork(), and SYNKHRONOS_MPI=0 to run without the launch."""
    import sys

    from synkhronos._session import mpi

    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.delenv(mpi._PID_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import fails
    with pytest.raises(RuntimeError, match=r"started by an MPI launcher \(OMPI_COMM_WORLD_SIZE is set\) "
                                           r"but mpi4py is not installed.*SYNKHRONOS_MPI=0"):
        synk.fork(2, use_gpu=False)
    monkeypatch.setenv("SYNKHRONOS_MPI", "0")
    assert not mpi.launched()
    monkeypatch.setenv("SYNKHRONOS_MPI", "maybe")
    with pytest.raises(ValueError, match="SYNKHRONOS_MPI must be 1 or 0 .* got 'maybe'"):
        mpi.launched()


@pytest.mark.parametrize("value, expected", [(None, None), ("1", 1), ("2", 2), (" 3 ", 3), ("0", ValueError),
                                             ("-1", ValueError), ("two", ValueError), ("1.5", ValueError)])
def test_ranks_per_host_reads_its_variable_or_names_it(monkeypatch, value, expected):
    """``SYNKHRONOS_RANKS_PER_HOST`` groups a machine's ranks into "hosts" (2 x 2
    GPUs on one 4-GPU machine); a bad value is refused with the variable's name."""
    from synkhronos._session import mpi

    monkeypatch.delenv(mpi.HOST_ENV, raising=False)
    if value is None:
        monkeypatch.delenv(mpi.RANKS_PER_HOST_ENV, raising=False)
    else:
        monkeypatch.setenv(mpi.RANKS_PER_HOST_ENV, value)
    if expected is ValueError:
        with pytest.raises(ValueError, match="SYNKHRONOS_RANKS_PER_HOST=%r: give a whole number" % value):
            mpi.ranks_per_host()
    else:
        assert mpi.ranks_per_host() == expected
    if value is None:
        monkeypatch.setenv(mpi.HOST_ENV, "1")
        assert mpi.ranks_per_host() == 1


FLOATX_SCRIPT = """
import numpy as np, pytensor, pytensor.tensor as pt, synkhronos as synk
before = pytensor.config.floatX
synk.fork(2, use_gpu=False)
x = pt.matrix("x")
f = synk.function([x], outputs=(x.sum(), "sum"))
synk.distribute()
r = f(synk.data(np.full((4, 2), 0.1)))
print(before, pytensor.config.floatX, r.dtype, repr(float(r)))
"""


def test_fork_leaves_floatx_as_the_user_has_it(tmp_path):
    """PyTensor's default floatX (float64) survives fork(), on the master and the
    ranks: a graph built after fork() computes in float64 everywhere (with float32
    the sum of 0.1s would be 0.800000011920929)."""
    env = dict(os.environ)  # conftest's PYTENSOR_FLAGS, with no floatX
    (tmp_path / "s.py").write_text(FLOATX_SCRIPT)
    proc = subprocess.run([sys.executable, str(tmp_path / "s.py")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    before, after, dtype, value = proc.stdout.split()
    assert (before, after, dtype) == ("float64", "float64", "float64")
    assert abs(float(value) - 0.8) < 1e-15
