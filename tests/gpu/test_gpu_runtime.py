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
from test_random import check_rank_streams
from test_seed_examples import INTRO, SHARED

import synkhronos as synk
from synkhronos._session import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def gpu2():
    yield synk.fork(2, use_gpu=True)
    synk.close()


@pytest.mark.gpus(1)
def test_default_fork_uses_every_gpu():
    """A script's ``fork()`` takes every visible GPU, one rank each, and the
    master's JAX sees its own GPU alone.  In a fresh process, as a user runs
    it: this one's JAX may have started before (on every GPU) in other tests."""
    script = ("import logging, synkhronos as synk\n"
              "logging.basicConfig(level=logging.INFO)\n"
              "n = synk.fork()\n"
              "import jax\n"
              "d = jax.devices()\n"
              "print('ranks', n, 'gpus', len(synk.gpus()), 'jax', len(d), d[0].platform)\n"
              "synk.close()\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    from synkhronos._devices.gpu import visible_gpus

    n = len(visible_gpus())
    assert "ranks %d gpus %d jax 1 gpu" % (n, n) in proc.stdout, proc.stdout + proc.stderr
    assert "detected GPUs" in proc.stderr


@pytest.mark.gpus(1)
def test_one_gpu_blocks_on_its_device_instead_of_polling():
    """With no workers there is nothing to watch while the master waits on its
    GPU: no hook, so it blocks on the event (a hook makes it poll and sleep)."""
    from synkhronos._session import runtime

    synk.fork(1, use_gpu=True)
    try:
        assert runtime.require().device.wait_hook is None
        x = pt.vector("x", dtype="float32")
        f = synk.function([x], outputs=(x * x).sum())
        synk.distribute()
        v = np.linspace(-1, 1, 1_000_003, dtype="float32")
        np.testing.assert_allclose(f(synk.data(v)), (v.astype("float64") ** 2).sum(), rtol=1e-5)
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


def _sum_of_rows_plus(y_rows):
    """A function of 5 rows (3 on the master, 2 on rank 1) plus a broadcast
    input of ``y_rows`` rows, which only the rank with that many rows can add."""
    x = pt.matrix("x")
    y = pt.matrix("y")
    f = synk.function([x], bcast_inputs=[y], outputs=(x + y).sum())
    synk.distribute()
    return f, synk.data(np.ones((5, 3), dtype="float32")), synk.data(np.ones((y_rows, 3), dtype="float32"))


def test_worker_error_on_gpu_names_rank(gpu2):
    f, xd, yd = _sum_of_rows_plus(3)  # fits rank 0's 3 rows, not rank 1's 2
    with pytest.raises(synk.WorkerError) as info:
        f(xd, yd)
    assert info.value.rank == 1 and info.value.worker_traceback
    assert "rank 1" in str(info.value)
    yd.set_value(np.ones((2, 3), dtype="float32"))
    np.testing.assert_allclose(f(xd, yd, batch=4), 2 * 3 * 2)  # the session still works


def test_outputs_of_static_shape_are_reduced_on_the_gpus(gpu2, monkeypatch):
    """Outputs whose shape the graph knows are reduced into the master over NCCL
    (no rank copies them to the host first) and equal plain PyTensor's for every
    mode, with uneven splits and with a rank that has no rows."""
    rng = np.random.default_rng(5)
    w = pytensor.shared(rng.standard_normal((4, 3)).astype("float32"), name="w", shape=(4, 3))
    x = pt.matrix("x")
    z = x.dot(w)
    outs = [z.mean(axis=0), (z.sum(axis=0), "sum"), (z.max(axis=0), "max"), (z.min(axis=0), "min"),
            ((1 + 0.01 * z).prod(axis=0), "prod"), (x.shape[0], "sum")]
    f = synk.function([x], outputs=outs)
    ref = pytensor.function([x], [o[0] if isinstance(o, tuple) else o for o in outs])
    synk.distribute()
    dev = synk._session.runtime.current().device
    reduced = []
    through_device = dev.reduce_outputs
    monkeypatch.setattr(dev, "reduce_outputs", lambda *a: reduced.append(a[1]) or through_device(*a))
    data = rng.standard_normal((23, 4)).astype("float32")
    d = synk.data(data)
    for batch in (None, [6], slice(3, 20)):
        rows = data if batch is None else data[batch]
        for got, want in zip(f(d, batch=batch), ref(rows)):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert len(reduced) == 3
    assert [m for _, _, m in reduced[0]] == ["avg", "sum", "max", "min", "prod", "sum"]


@pytest.mark.parametrize("cols", [1, 1 << 18, (1 << 18) + 1])  # 4 bytes, 1 MiB, past it
def test_reduced_outputs_across_the_pinned_copy_limit(gpu2, cols, monkeypatch):
    """Reduced outputs up to 1 MiB come to the host through page-locked buffers
    kept for the next call, larger ones after the wait: either way equal to
    numpy, in fresh arrays that the next call does not overwrite.  Outputs
    computed before their reduction starts are sent from where they are (in the
    master here, made to wait for them), others through a DLPack view (a long
    chain of products runs first)."""
    import jax

    from synkhronos._devices.gpu import _outputs

    x = pt.tensor("x", dtype="float32", shape=(None, cols))
    n = 2048
    y = pytensor.shared(np.eye(n, dtype="float32"), name="s", shape=(n, n))
    for _ in range(8):
        y = pt.tanh(y.dot(y))
    fast = synk.function([x], outputs=[(x.sum(axis=0), "sum"), (x.max(axis=0), "max"), x.mean(axis=0)])
    slow = synk.function([x], outputs=(x.sum(axis=0) + y[0, 0], "sum"))
    synk.distribute()
    dev = synk._session.runtime.current().device
    exports, through_device, to_cupy = [], dev.reduce_outputs, dev._to_cupy
    monkeypatch.setattr(dev, "_to_cupy", lambda v: exports.append(v) or to_cupy(v))

    def computed_first(outputs, *rest):
        return through_device(jax.block_until_ready(outputs), *rest)

    rng = np.random.default_rng(cols)
    datas = [rng.standard_normal((4, cols)).astype("float32") for _ in range(2)]  # rows 2 + 2
    y00 = np.float32(np.tanh(1.0))
    for _ in range(7):
        y00 = np.tanh(y00 * y00)
    monkeypatch.setattr(dev, "reduce_outputs", computed_first)
    got = [fast(synk.data(d)) for d in datas]
    assert not exports
    monkeypatch.setattr(dev, "reduce_outputs", through_device)
    got_slow = [slow(synk.data(d)) for d in datas]
    assert len(exports) == 2
    for g, g_slow, d in zip(got, got_slow, datas):
        want = [d.sum(axis=0), d.max(axis=0), d.mean(axis=0), d.sum(axis=0) + 2 * y00]
        for a, b in zip(g + [g_slow], want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    pinned = [k for k in dev._pinned_kept if k[1] == (cols,)]
    assert len(pinned) == (3 if 4 * cols <= _outputs._PINNED_MAX_BYTES else 0)


@pytest.mark.gpus(1)
@pytest.mark.parametrize("cols", [1, 1 << 18, (1 << 18) + 1])  # 4 bytes, 1 MiB, past it
def test_reduced_outputs_of_consecutive_calls_stay_apart(cols, monkeypatch):
    """Through the NCCL reduction (forced where one GPU is all there is: a
    communicator of one), outputs up to 1 MiB land in GPU and host buffers kept
    for the next call's output of the same position, shape and dtype.  Two
    functions alternate on the same buffers: every result equals numpy's, keeps
    its dtype (float32, float64, int64), and no result changes in the calls
    that follow."""
    from synkhronos._devices import gpu
    from synkhronos._devices.gpu import _outputs

    n = len(gpu.visible_gpus())
    monkeypatch.setattr(gpu.GpuDevice, "reduces_outputs", property(lambda self: True))
    synk.fork(n, use_gpu=True)
    try:
        x = pt.tensor("x", dtype="float32", shape=(None, cols))
        f = synk.function([x], outputs=[(x.sum(axis=0), "sum"), (x.max(axis=0), "max"),
                                         ((x > 0).sum(axis=0), "sum"), x.mean(axis=0),
                                         ((pt.cast(x, "float64") ** 2).sum(axis=0), "sum")])
        g = synk.function([x], outputs=[((2 * x).sum(axis=0), "sum"), ((-x).max(axis=0), "max"),
                                         ((x < 0).sum(axis=0), "sum")])
        synk.distribute()
        rng = np.random.default_rng(cols)
        got, want = [], []
        for _ in range(3):
            d = rng.standard_normal((2 * n + 1, cols)).astype("float32")  # uneven rows: weighted avg
            data = synk.data(d)
            got += [f(data), g(data)]
            want += [[d.sum(0), d.max(0), (d > 0).sum(0), d.mean(0), (d.astype("float64") ** 2).sum(0)],
                     [(2 * d).sum(0), (-d).max(0), (d < 0).sum(0)]]
        for results, expected in zip(got, want):
            for a, b in zip(results, expected):
                assert a.dtype == b.dtype and a.shape == b.shape
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
        dev = synk._session.runtime.current().device
        kept = [k for k in dev._pinned_kept if k[1] == (cols,)]
        # f's outputs of up to 1 MiB (int64 and float64 twice float32's size); g's three are f's.
        assert len(kept) == sum(cols * size <= _outputs._PINNED_MAX_BYTES for size in (4, 4, 8, 4, 8))
    finally:
        synk.close()


@pytest.mark.gpus(1)
def test_more_small_outputs_than_buffers_kept(monkeypatch):
    """A call of more small outputs than buffers are kept (``_PINNED_KEPT``):
    the kept ones are dropped partway through the call, whose results still
    come back right, as do the next call's."""
    from synkhronos._devices import gpu
    from synkhronos._devices.gpu import _outputs

    n = len(gpu.visible_gpus())
    monkeypatch.setattr(gpu.GpuDevice, "reduces_outputs", property(lambda self: True))
    synk.fork(n, use_gpu=True)
    try:
        count = _outputs._PINNED_KEPT + 6
        x = pt.vector("x", dtype="float32")
        f = synk.function([x], outputs=[((k + 1) * x.sum(), "sum") for k in range(count)])
        synk.distribute()
        for d in (np.arange(2 * n + 1, dtype="float32"), np.ones(3 * n, dtype="float32")):
            got = f(synk.data(d))
            np.testing.assert_allclose(got, [(k + 1) * d.sum() for k in range(count)], rtol=1e-6)
        assert 0 < len(synk._session.runtime.current().device._pinned_kept) <= _outputs._PINNED_KEPT
    finally:
        synk.close()


def test_failed_share_in_the_master_still_takes_part_in_the_reduction(gpu2):
    """The master's own share fails: it still sends identity values, so the
    worker's reduction does not wait forever, and the session goes on."""
    f, xd, yd = _sum_of_rows_plus(2)  # fits rank 1's 2 rows, not the master's 3
    with pytest.raises(Exception) as info:
        f(xd, yd)
    assert not isinstance(info.value, synk.WorkerError)
    np.testing.assert_allclose(f(xd, yd, batch=4), 2 * 3 * 2)
    np.testing.assert_allclose(f(xd, yd, batch=4), 2 * 3 * 2)


def test_close_leaves_nothing():
    """And the workers leave on their own, at once: NCCL's communicator destroy
    waits for every rank's, so the master's runs while they leave (run after
    them, each worker waited in its own until close killed it, 5 s later)."""
    synk.fork(2, use_gpu=True)
    rt = synk._session.runtime.current()
    a = pytensor.shared(np.arange(4, dtype="float32"), name="a")
    synk.function([], a.sum())
    synk.distribute()
    synk.all_reduce(a)  # the communicator in use
    synk.synchronize()
    token, processes = rt.token, [w.process for w in rt.workers.values()]
    pids = [p.pid for p in processes]
    t0 = time.monotonic()
    synk.close()
    assert time.monotonic() - t0 < launch.EXIT_TIMEOUT / 2
    assert [p.returncode for p in processes] == [0] * len(processes)  # not killed
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
    return proc


def test_seed_examples_same_values_on_gpus(tmp_path):
    proc = _run(INTRO, tmp_path)
    assert "detected GPUs" in proc.stderr and proc.stdout.strip().endswith("All assertions passed.")
    out = _run(SHARED, tmp_path).stdout
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
    assert "master_rank=1 passed" in _run(MASTER_1, tmp_path).stdout


def test_unsupported_dtype_is_refused_before_any_rank_starts(gpu2):
    b = pytensor.shared(np.zeros(4, dtype="int16"), name="b")
    synk.function([], outputs=b.sum())
    synk.distribute()
    with pytest.raises(TypeError, match="NCCL has no data type for int16; use nccl=False"):
        synk.all_reduce(b)
    synk.all_reduce(b, nccl=False)  # the session goes on
    assert synk.get_value(1, b).tolist() == [0] * 4


def test_rank_with_unexpected_shape_takes_part_and_raises(gpu2):
    """If the master's record of a worker's shape were wrong, that worker joins the
    collective with a stand-in of the expected size, so nobody waits forever, and
    its error arrives at the next round trip."""
    s = pytensor.shared(np.ones(64, dtype="float32"), name="s")
    synk.function([], outputs=s.sum())
    synk.distribute()
    synk.set_value(1, s, np.ones(32, dtype="float32"))
    rt = synk._session.runtime.current()
    rt.registry.record_shapes(rt.registry.shared_id(s), [(64,), (64,)])  # stale on purpose
    synk.all_reduce(s, op="sum")  # queued; must not hang
    with pytest.raises(synk.WorkerError) as info:
        synk.synchronize()
    assert info.value.rank == 1 and "expected (64,)" in str(info.value)
    assert "all_reduce" in info.value.worker_traceback
    np.testing.assert_allclose(s.get_value(), np.ones(64))  # rank 1 added zeros
    assert synk.get_shapes(s) == [(64,), (32,)]
    synk.set_value(1, s, np.full(64, 2, dtype="float32"))
    synk.all_reduce(s, op="sum")
    np.testing.assert_allclose(synk.get_value(1, s), np.full(64, 3))


def test_queued_collectives_are_ordered_with_functions(gpu2):
    """Collectives return once queued: a long chain of function updates and
    all-reduces with no synchronisation must give exactly the sequential result."""
    n, steps = 1 << 22, 25
    s = pytensor.shared(np.zeros(n, dtype="float32"), name="s", shape=(n,))
    x = pt.vector("x")
    # Each rank adds the sum of its rows, then the ranks' values are averaged.
    step = synk.function([x], updates=[(s, s * 0.5 + pt.sqrt(pt.exp(pt.log1p(x.sum())) - 1))])
    synk.distribute()
    rng = np.random.default_rng(1)
    expect = np.zeros(n, dtype="float64")
    for _ in range(steps):
        v = rng.random(8).astype("float32")
        step(synk.data(v))
        synk.all_reduce(s, op="avg")
        halves = [np.sqrt(v[:4].sum()), np.sqrt(v[4:].sum())]
        expect = expect * 0.5 + sum(halves) / 2
    for r in range(2):
        np.testing.assert_allclose(synk.get_value(r, s)[[0, n // 2, n - 1]], expect[[0, n // 2, n - 1]],
                                   rtol=1e-4)


def test_collective_reads_its_own_output_only_while_it_is_the_value(gpu2):
    """A collective on the value the previous collective wrote reads that buffer
    directly; once a function or set_value replaces the value, the new value is
    read (even while the old one is still referenced), and the old buffer is let
    go with the old value."""
    s = pytensor.shared(np.ones(1024, dtype="float32"), name="s", shape=(1024,))
    bump = synk.function([], updates=[(s, s + 1)])
    synk.distribute()
    own = synk._session.runtime.current().device._own
    synk.all_reduce(s, op="sum")  # 2 on each rank
    synk.all_reduce(s, op="sum")  # 4, from the first one's output
    kept = s.get_value(return_internal_type=True)
    bump()  # 5, written by XLA
    assert id(s) in own  # the old value lives on in `kept`
    synk.all_reduce(s, op="sum")  # 10
    del kept
    s.set_value(np.full(1024, 7, dtype="float32"))  # the master's value only
    assert id(s) not in own
    synk.all_reduce(s, op="sum")  # 17
    for r in range(2):
        np.testing.assert_array_equal(synk.get_value(r, s), np.full(1024, 17))


def test_collective_imports_its_outputs_after_its_other_cuda_calls(gpu2):
    """JAX's import of a buffer the NCCL stream is still writing makes the next
    CUDA call wait for that write: a collective on several variables launches
    every NCCL kernel and records its event before it imports its outputs, all
    in one call (else the kernels run one at a time), and values come out right."""
    vs = [pytensor.shared(np.full(256, k + 1, dtype="float32"), name="v%d" % k)
          for k in range(3)]
    synk.function([], outputs=sum(v.sum() for v in vs))
    synk.distribute()
    dev = synk._session.runtime.current().device
    synk.all_reduce(vs, op="sum")  # 2 (k + 1); the importer is made on first use
    order = []
    comm, imp, mark = dev._comm, dev._import, dev._mark

    class Recording:
        def __getattr__(self, name):
            def call(*args):
                order.append(name)
                return getattr(comm, name)(*args)
            return call

    def importing(bufs, after=None):
        order.append("import %d" % len(bufs))
        return imp(bufs, after)

    def marking():
        order.append("mark")
        return mark()

    dev._comm, dev._import, dev._mark = Recording(), importing, marking
    try:
        synk.all_reduce(vs, op="sum")  # 4 (k + 1)
        synk.all_gather(vs)
    finally:
        dev._comm, dev._import, dev._mark = comm, imp, mark
    per_call = ["mark", "import 3"]  # the outputs are imported together, last
    assert order == ["allReduce"] * 3 + per_call + ["allGather"] * 3 + per_call
    for r in range(2):
        for k, v in enumerate(synk.get_value(r, vs)):
            np.testing.assert_array_equal(v, np.full(512, 4 * (k + 1)))


def _run_on_one_gpu(code):
    """Run ``code`` in a fresh interpreter that sees one GPU; fail with its output
    if it fails."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.gpus(1)
def test_jax_importer_takes_the_fast_path_and_keeps_values():
    """The direct DLPack import must be in use on a supported JAX (else queued
    collectives pay ~45 us more per call), give the same arrays, make XLA wait
    for the stream still writing them, and leave that hand-off to its own
    untimed event (or the caller's): CuPy is asked for none (its event is timed)."""
    code = ("import cupy, jax, jax.numpy as jnp, numpy as np\n"
            "from synkhronos._devices.gpu._dlpack import jax_importer\n"
            "imp = jax_importer()\n"
            "assert imp.__name__ == 'fast', 'fell back to the public import'\n"
            "s = cupy.cuda.Stream(non_blocking=True)\n"
            "with s:\n"
            "    a = cupy.arange(12, dtype=cupy.float32).reshape(3, 4) * 2\n"
            "    j, h, k = imp([a, a[1] + 1, cupy.arange(3, dtype=cupy.int64)])\n"
            "assert isinstance(j, jax.Array) and j.shape == (3, 4)\n"
            "np.testing.assert_array_equal(np.asarray(j), np.arange(12).reshape(3, 4) * 2)\n"
            "np.testing.assert_array_equal(np.asarray(h), np.arange(4, 8) * 2 + 1)\n"
            "assert np.asarray(k).tolist() == [0, 1, 2]\n"
            "asked = []\n"
            "class Spy:\n"
            "    def __init__(self, a):\n"
            "        self.a, self.dtype = a, a.dtype\n"
            "    def __dlpack__(self, stream=None):\n"
            "        asked.append(stream)\n"
            "        return self.a.__dlpack__(stream=stream)\n"
            "with s:\n"
            "    big = cupy.zeros(1 << 26, dtype=cupy.float32)\n"
            "    for _ in range(30):\n"  # milliseconds of work still queued at the import
            "        big += 1\n"
            "    (late,) = imp([Spy(big)])\n"
            "assert asked == [-1], asked\n"
            "assert float(jnp.min(late)) == 30.0\n"
            "from synkhronos._devices.gpu._dlpack import untimed_event\n"
            "with s:\n"
            "    for _ in range(30):\n"
            "        big += 1\n"
            "    (given,) = imp([big], untimed_event(s))\n"  # the caller's event, as _finish passes
            "assert float(jnp.min(given)) == 60.0\n")
    _run_on_one_gpu(code)


@pytest.mark.gpus(1)
def test_cupy_exporter_takes_the_direct_path_and_keeps_values():
    """The direct DLPack export must be in use on a supported JAX, and give a view
    of the same memory, read on the NCCL stream after XLA's write."""
    code = ("import cupy, jax.numpy as jnp\n"
            "from synkhronos._devices.gpu._dlpack import cupy_exporter\n"
            "s = cupy.cuda.Stream(non_blocking=True)\n"
            "exp = cupy_exporter(s)\n"
            "assert exp.__name__ == 'fast', 'fell back to cupy.from_dlpack'\n"
            "x = jnp.ones(1 << 24, dtype=jnp.float32) * 3\n"  # may still be being written
            "v = exp(x)\n"
            "assert v.data.ptr == x.unsafe_buffer_pointer()\n"
            "with s:\n"
            "    total = float(v[::4096].sum())\n"
            "assert total == 3 * 4096, total\n")
    _run_on_one_gpu(code)


def test_calls_without_results_are_queued_in_order_and_errors_come_later(gpu2):
    """A call with no outputs and no Data returns once queued (as the training step's
    gradient and update calls do); chained with all-reduces and unsynchronised it
    must still give the sequential result, and a worker's error in it must reach
    the master at the next round trip."""
    n, steps = 1 << 20, 20
    d = pytensor.shared(np.arange(8, dtype="float32"), name="d")
    s = pytensor.shared(np.zeros(n, dtype="float32"), name="s", shape=(n,))
    step = synk.function([], updates=[(s, s * 0.5 + pt.sqrt(d.sum()))], sliceable_shareds=[d])
    synk.distribute()
    synk.scatter(d, np.arange(8, dtype="float32"))  # rank 0: 0..3, rank 1: 4..7
    rt = synk._session.runtime.current()
    expect = 0.0
    for k in range(steps):
        lo = k % 3
        step(batch_s=slice(lo, lo + 1 + k % 2))
        assert all(len(w.owed) > 0 for w in rt.workers.values())  # nothing waited for the worker
        synk.all_reduce(s, op="sum")
        rows = np.arange(lo, lo + 1 + k % 2)
        expect = 2 * expect * 0.5 + np.sqrt(rows.sum()) + np.sqrt((rows + 4).sum())
    for r in range(2):
        np.testing.assert_allclose(synk.get_value(r, s)[[0, n - 1]], [expect] * 2, rtol=1e-5)
    step(batch_s=[slice(0, 2), slice(0, 9)])  # rank 1 has 4 rows
    with pytest.raises(synk.WorkerError) as info:
        synk.synchronize()
    assert info.value.rank == 1 and "during an earlier call" in str(info.value)
    step(batch_s=slice(0, 1))
    synk.synchronize()


def test_synchronize_waits_for_a_queued_update(gpu2):
    """A call without outputs returns once queued; synchronize() returns only once
    the update it queued is computed (on every rank; checked in the master), though
    it waits for the values written since the last synchronize() only."""
    n = 4096
    s = pytensor.shared(np.eye(n, dtype="float32"), name="s", shape=(n, n))
    others = [pytensor.shared(np.ones(4, dtype="float32"), name="o%d" % i) for i in range(50)]
    x = s
    for _ in range(24):  # tens of milliseconds of products on an H200
        x = pt.tanh(x.dot(x) * np.float32(0.5))
    step = synk.function([], updates=[(s, x)])
    synk.function([], outputs=sum(o.sum() for o in others))
    synk.distribute()
    step()
    synk.synchronize()  # the first call: compiling made the master wait anyway
    for _ in range(3):
        step()
        synk.synchronize()
        assert s.get_value(return_internal_type=True).is_ready()
    np.testing.assert_allclose(synk.get_value(1, s)[:2, :2], s.get_value()[:2, :2])


def test_queued_collectives_hold_bounded_memory(gpu2, monkeypatch):
    """Each queued collective keeps its input alive until the GPU has used it; the
    host waits for the oldest once more than _INFLIGHT_BYTES are held (set small
    here, in the master), instead of piling up buffers, and values stay right."""
    from synkhronos._devices import gpu

    # 256 MB all-reduces take longer on the GPU than to queue, so the host runs ahead.
    monkeypatch.setattr(gpu._stream, "_INFLIGHT_BYTES", 300 << 20)
    size = 1 << 26
    s = pytensor.shared(np.ones(size, dtype="float32"), name="s", shape=(size,))
    synk.function([], outputs=s.sum())
    synk.distribute()
    dev = synk._session.runtime.current().device
    most = 0
    for _ in range(12):
        synk.all_reduce(s, op="max")
        most = max(most, dev._held)
    assert 0 < most <= 4 * size  # the limit, plus the one input just queued
    synk.all_reduce(s, op="sum")
    np.testing.assert_array_equal(synk.get_value(1, s)[[0, size - 1]], [2, 2])


def test_queued_collectives_record_events_without_timing(gpu2):
    """The events marking queued collectives carry no timestamp: a timed event
    between two NCCL kernels left the GPU idle ~3 us per call (1% at 64 MB)."""
    import cupy

    s = pytensor.shared(np.ones(1024, dtype="float32"), name="s")
    synk.function([], outputs=s.sum())
    synk.distribute()
    dev = synk._session.runtime.current().device
    synk.all_reduce(s, op="max")
    (event, _, _), = list(dev._inflight)[-1:]
    event.synchronize()
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError, match="cudaErrorInvalidResourceHandle"):
        cupy.cuda.get_elapsed_time(event, event)


@pytest.mark.filterwarnings("error:The RandomType SharedVariables:UserWarning")
def test_dropout_draws_per_rank_on_gpu():
    """JAX functions drawing random numbers load in the GPU workers, and each rank
    draws from its own stream, as plain PyTensor does on that rank's generator."""
    check_rank_streams(seed=5, mode="JAX", use_gpu=True)

