"""What only GPU ranks have: one GPU per process, values resident on the device,
NCCL collectives equal to the shared-memory path, errors and cleanup."""

import os
import subprocess
import sys
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _procs import proc_stat, segments
from test_seed_examples import INTRO, SHARED

import synkhronos as synk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def gpu2():
    yield synk.fork(2, use_gpu=True)
    synk.close()


def test_default_fork_uses_every_gpu(capsys):
    from synkhronos._devices.gpu import visible_gpus

    n = synk.fork()
    try:
        assert n == len(visible_gpus())
        assert "detected GPUs" in capsys.readouterr().out
        import jax

        assert len(jax.devices()) == 1 and jax.devices()[0].platform == "gpu"
    finally:
        synk.close()


def test_values_stay_on_device_and_master_sees_numpy(gpu2):
    import jax

    s = pytensor.shared(np.zeros(3, dtype="float32"), name="s")
    x = pt.matrix("x")
    f = synk.function([x], outputs=x.sum(), updates=[(s, s + x.sum(axis=0))])
    synk.distribute()
    v = np.arange(12, dtype="float32").reshape(4, 3)
    total = f(synk.data(v))
    assert isinstance(total, np.ndarray) and np.isclose(total, v.sum() / 2)  # avg of equal halves
    internal = s.get_value(return_internal_type=True)
    assert isinstance(internal, jax.Array) and internal.devices().pop().platform == "gpu"
    assert isinstance(s.get_value(), np.ndarray)
    np.testing.assert_allclose(s.get_value(), v[:2].sum(axis=0))
    s.set_value(np.ones(3, dtype="float32"))  # stays on the device
    assert isinstance(s.get_value(return_internal_type=True), jax.Array)
    np.testing.assert_allclose(synk.get_value(1, s), v[2:].sum(axis=0))


@pytest.mark.parametrize("op", ["avg", "sum", "max", "min", "prod"])
def test_nccl_matches_shared_memory_path(gpu2, op):
    a = pytensor.shared(np.zeros((64, 33), dtype="float32"), name="a")
    synk.function([], outputs=a.sum())
    synk.distribute()
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((64, 33)).astype("float32") for _ in range(2)]
    for r, v in enumerate(values):
        synk.set_value(r, a, v)
    host = synk.reduce(a, op=op, in_place=False, nccl=False)
    dev = synk.reduce(a, op=op, in_place=False, nccl=True)
    np.testing.assert_allclose(dev, host, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(synk.gather(a, nccl=True), synk.gather(a, nccl=False))
    synk.all_reduce(a, op=op)
    for r in range(2):
        np.testing.assert_allclose(synk.get_value(r, a), host, rtol=1e-5, atol=1e-6)


def test_worker_error_on_gpu_names_rank(gpu2):
    x = pt.matrix("x")
    y = pt.matrix("y")
    f = synk.function([x], bcast_inputs=[y], outputs=(x + y).sum())
    synk.distribute()
    xd = synk.data(np.ones((5, 3), dtype="float32"))
    yd = synk.data(np.ones((3, 3), dtype="float32"))  # fits rank 0's 3 rows, not rank 1's 2
    with pytest.raises(synk.WorkerError) as info:
        f(xd, yd)
    assert info.value.rank == 1 and info.value.worker_traceback
    assert "rank 1" in str(info.value)
    yd.set_value(np.ones((2, 3), dtype="float32"))
    np.testing.assert_allclose(f(xd, yd, batch=4), 2 * 3 * 2)  # the session still works


def test_close_leaves_nothing():
    synk.fork(2, use_gpu=True)
    rt = synk._runtime.current()
    token, pids = rt.token, [w.process.pid for w in rt.workers.values()]
    synk.close()
    time.sleep(0.2)
    assert not segments(token)
    for pid in pids:
        st = proc_stat(pid)
        assert st is None or st[0] in "ZX"  # gone, or exited and not yet reaped


def _run(script_text, tmp_path, *args):
    path = tmp_path / "script.py"
    path.write_text(script_text)
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_seed_examples_same_values_on_gpus(tmp_path):
    out = _run(INTRO, tmp_path)
    assert "detected GPUs" in out and out.strip().endswith("All assertions passed.")
    out = _run(SHARED, tmp_path)
    assert "gathered s: [[3.0, 3.0], [7.0, 7.0]]" in out
    assert "gathered s after reduce: [[10.0, 10.0], [7.0, 7.0]]" in out
    assert "gathered s after all-reduce: [[10.0, 10.0], [10.0, 10.0]]" in out


@pytest.mark.parametrize("demo", [1, 2, 3, 4, 5])
def test_demos_with_gpu_flag(demo):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "demos", "demo_%d.py" % demo), "--gpu",
                           "--n", "2"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed" in proc.stdout


MASTER_1 = """
import numpy as np
import pytensor
import synkhronos as synk

synk.fork(2, use_gpu=True, master_rank=1)
a = pytensor.shared(np.zeros((3, 2), dtype="float32"), name="a")
synk.function([], outputs=a.sum())
synk.distribute()
v = [np.full((3, 2), r + 1, dtype="float32") for r in range(2)]
for r in range(2):
    synk.set_value(r, a, v[r])
assert np.allclose(synk.gather(a, nd_up=0), np.concatenate(v))
assert np.allclose(synk.reduce(a, op="sum", in_place=False), v[0] + v[1])
synk.all_reduce(a, op="avg")
assert np.allclose(synk.get_value(0, a), 1.5) and np.allclose(a.get_value(), 1.5)
synk.broadcast(a, np.ones((4, 2), dtype="float32"))
assert synk.get_shapes(a) == [(4, 2), (4, 2)]
print("master_rank=1 passed")
"""


def test_master_rank_1(tmp_path):
    assert "master_rank=1 passed" in _run(MASTER_1, tmp_path)
