"""Which function outputs a device reduces itself (GPU ranks reduce outputs of
static shape into the master over NCCL), decided alike on every rank, and how the
master finishes them.  The NCCL path itself runs in tests/gpu."""

import types

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

from synkhronos._call.results import take_reduced
from synkhronos._call.share import device_reduction
from synkhronos._common.reduce import identity
from synkhronos._devices import cpu, gpu
from synkhronos._graph.function_core import FunctionCore

REDUCING = types.SimpleNamespace(reduces_outputs=True, reduce_dtypes=gpu.GpuDevice.reduce_dtypes)


def _core(outputs, modes, n_scatter=1, sliceable=()):
    x = pt.matrix("x", dtype="float32")
    return FunctionCore(0, None, [x], n_scatter, outputs, modes, [], [], [], list(sliceable), {})


def test_static_shapes_with_modes_are_reduced_on_the_device():
    w = pytensor.shared(np.ones((4, 3), dtype="float32"), shape=(4, 3))
    x = pt.matrix("x", dtype="float32")
    z = x.dot(w)
    core = _core([z.sum(axis=0), z.max(), x.shape[0], z], ["avg", "max", "sum", None])
    assert device_reduction(core, REDUCING, (0, 1, 2), 1) == [
        ((3,), "float32", "avg"), ((), "float32", "max"), ((), "int64", "sum")]


@pytest.mark.parametrize("why", ["mode None", "unknown shape", "int avg", "bool", "sliced",
                                 "cpu device", "no outputs"])
def test_other_outputs_go_through_the_host(why):
    x = pt.matrix("x", dtype="float32")
    out, mode, device, subset, slices = x.sum(), "sum", REDUCING, (0,), 1
    if why == "mode None":
        mode = None
    elif why == "unknown shape":
        out = x.sum(axis=0)
    elif why == "int avg":
        out = x.shape[0]
        mode = "avg"
    elif why == "bool":
        out = pt.any(x > 0)
    elif why == "sliced":
        slices = 2
    elif why == "cpu device":
        device = cpu.CpuDevice()
    else:
        subset = ()
    assert device_reduction(_core([out], [mode]), device, subset, slices) is None


def test_one_host_output_sends_the_whole_call_through_the_host():
    x = pt.matrix("x", dtype="float32")
    assert device_reduction(_core([x.sum(), x.sum(axis=1)], ["sum", None]), REDUCING, (0, 1), 1) is None
    assert device_reduction(_core([x.sum(), x.sum(axis=1)], ["sum", None]), REDUCING, (0,), 1) is not None


@pytest.mark.parametrize("mode, dtype, expect", [
    ("sum", "float32", 0), ("avg", "float32", 0), ("prod", "int32", 1),
    ("max", "float32", -np.inf), ("min", "float64", np.inf),
    ("max", "int64", np.iinfo(np.int64).min), ("min", "uint8", 255)])
def test_identity_leaves_the_reduction_unchanged(mode, dtype, expect):
    ident = identity(mode, dtype)
    assert ident == expect
    v = np.array([3, 7], dtype=dtype)
    combine = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[mode]
    np.testing.assert_array_equal(combine(v, np.array(ident).astype(dtype)), v)


class _Taking:
    def __init__(self, values):
        self.values = values

    def take_outputs(self, results):
        assert results == "handle"
        return [np.asarray(v) for v in self.values]


def test_master_divides_avg_by_the_rows_of_ranks_that_had_rows():
    rt = types.SimpleNamespace(device=_Taking([np.float32(12.0), np.int64(9)]))
    specs = [((), "float32", "avg"), ((), "int64", "sum")]
    # master 3 rows; worker 1 had 2 rows; worker 2 had none (its weight must not count)
    got = take_reduced(rt.device, specs, (3, True, "handle"), {1: (2, True), 2: (7, False)})
    assert got[0] == pytest.approx(12.0 / 5) and got[0].dtype == np.float32
    assert got[1] == 9


def test_no_rows_anywhere_is_an_error():
    rt = types.SimpleNamespace(device=_Taking([0.0]))
    with pytest.raises(ValueError, match="selected no rows on any rank"):
        take_reduced(rt.device, [((), "float32", "avg")], (0, False, "handle"), {1: (0, False)})


def test_gpu_ranks_reduce_outputs_only_when_there_are_several():
    device = gpu.GpuDevice(gpu_ids=[])
    assert not device.reduces_outputs  # before the communicator exists
    device.n_parallel = 1
    assert not device.reduces_outputs
    device.n_parallel = 2
    assert device.reduces_outputs


def test_unweighted_avg_is_divided_by_the_ranks_that_had_rows():
    # Equal rows everywhere: ranks send their outputs as they are (no kernel to weight them).
    rt = types.SimpleNamespace(device=_Taking([np.float32(12.0), np.int64(9)]))
    specs = [((), "float32", "avg"), ((), "int64", "sum")]
    got = take_reduced(rt.device, specs, (4, True, "handle"), {1: (4, True), 2: (4, True)}, weighted=False)
    assert got[0] == pytest.approx(12.0 / 3) and got[0].dtype == np.float32
    assert got[1] == 9


def test_gpu_synchronize_waits_for_the_values_written_since_the_last_one(monkeypatch):
    """GPU ranks' synchronize() waits for the shared values that calls updated and
    set_value put on the GPU since the previous one, not for every shared value of
    the session (JAX's wait costs the host per array, and models have hundreds)."""
    import jax

    waited = []
    monkeypatch.setattr(jax, "block_until_ready", lambda values: waited.append(list(values)))
    device = gpu.GpuDevice(gpu_ids=[])
    a, b, c, d = (pytensor.shared(np.zeros(2, "float32"), name=n) for n in "abcd")
    step = types.SimpleNamespace(updates=[(a, None), (b, None)])
    device.after_updates(step)
    device.after_updates(step)  # called twice: its updates are waited for once
    device.set_value(c, np.ones(2, "float32"))
    device.synchronize([a, b, c, d])
    assert sorted(id(v) for v in waited[0]) == sorted(id(v.container.storage[0]) for v in (a, b, c))
    device.synchronize([a, b, c, d])  # nothing written since
    assert waited[1] == []
