"""The parts of the runtime that stand alone, tested without processes: the call
planner (against a plain split of the rows), the registry, the command payload
records, device selection, and the rule for which values fit a dtype."""

import math
import pickle
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synkhronos._call.plan import order_inputs, plan_call
from synkhronos._common.values import array_fits, fit_to
from synkhronos._devices import Device, cpu, select_device
from synkhronos._session.registry import Registry
from synkhronos._wire import protocol


class FakeData:
    """What the planner reads of a Data object."""

    def __init__(self, rows, minibatch=False, ref="ref"):
        self.rows, self.minibatch, self.ref = rows, minibatch, ref
        self._array = np.arange(rows)

    def __len__(self):
        return self.rows

    def _ref(self):
        return self.ref


def _rows(sel):
    return np.arange(10 ** 6)[sel] if isinstance(sel, slice) else np.asarray(sel)


@pytest.mark.parametrize("n_rows, n_parallel", [(1, 1), (7, 2), (10, 3), (3, 4), (100, 4)])
def test_plan_splits_the_rows_as_numpy_array_split(n_rows, n_parallel):
    d = FakeData(n_rows)
    plan = plan_call([d], 1, 1, [], n_parallel)
    got = [_rows(plan.rank_rows[r][0]) for r in range(n_parallel)]
    expect = np.array_split(np.arange(n_rows), n_parallel)
    assert all(np.array_equal(g, e) for g, e in zip(got, expect))
    assert plan.weighted == (n_rows % n_parallel != 0)
    assert plan.subset == (0,) and plan.num_slices == 1


def test_plan_takes_a_batch_then_splits_it_and_minibatch_inputs_by_position():
    full, mini = FakeData(20), FakeData(4, minibatch=True)
    plan = plan_call([full, mini], 2, 2, [], 2, batch=[5, 1, 9, 3])
    assert [list(_rows(plan.rank_rows[r][0])) for r in range(2)] == [[5, 1], [9, 3]]
    assert [list(_rows(plan.rank_rows[r][1])) for r in range(2)] == [[0, 1], [2, 3]]


def test_plan_gives_each_worker_its_call_record():
    a, b = FakeData(6, ref="A"), FakeData(1, ref="B")
    plan = plan_call([a, b], 1, 3, [], 3, output_subset=[2, 0])
    msgs = plan.messages(7, [1, 2])
    assert set(msgs) == {1, 2}
    m = msgs[2]
    assert isinstance(m, protocol.Call) and m.function == 7 and m.bcast == ["B"]
    assert m.scattered == [("A", plan.rank_rows[2][0])] and m.subset == (2, 0)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(output_subset=[3]), ValueError, "out of range"),
    (dict(output_subset="0"), TypeError, "output_subset"),
    (dict(num_slices=0), ValueError, "num_slices"),
    (dict(num_slices=True), TypeError, "num_slices"),
    (dict(batch_s=[0]), TypeError, "no sliceable_shareds"),
    (dict(batch=slice(3, 3)), ValueError, "selects no rows"),
])
def test_plan_refuses_bad_arguments_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_call([FakeData(5)], 1, 2, [], 2, **kwargs)


def test_order_inputs_by_position_and_name():
    assert order_inputs((1,), {"y": 2}, 2, {"x": 0, "y": 1}) == [1, 2]
    with pytest.raises(TypeError, match="given twice"):
        order_inputs((1,), {"x": 2}, 2, {"x": 0, "y": 1})
    with pytest.raises(TypeError, match="unknown input name"):
        order_inputs((), {"z": 2}, 1, {"x": 0})


def test_registry_keeps_each_shared_variable_once_and_forgets_shapes():
    reg = Registry()
    a, b = object(), object()
    assert reg.add_function("f", [a, b, a]) == 0 and reg.add_function("g", [b]) == 1
    assert reg.shareds == [a, b] and reg.shared_id(b) == 1 and reg.shared_id(object()) is None
    assert reg.function(1) == "g" and reg.next_function_index() == 2
    reg.record_shapes(1, [(2,), (3,)])
    assert reg.shapes(1) == [(2,), (3,)]
    reg.forget_shape(b)
    assert reg.shapes(1) is None
    reg.record_shapes(0, [(1,)])
    reg.forget_shapes([0, 5])
    assert reg.shapes(0) is None


class _Item:
    def __init__(self, ID):
        self.ID = ID


def test_registry_holds_data_weakly():
    reg = Registry()
    d = reg.add_data(_Item)
    e = reg.add_data(_Item)
    assert (d.ID, e.ID) == (0, 1) and len(reg.datas) == 2
    del d
    assert [x.ID for x in reg.datas] == [1]


def test_every_command_has_one_payload_record_that_pickles():
    assert set(protocol.PAYLOADS) == set(protocol.Command)
    samples = {protocol.Sync: (), protocol.Exit: (True,)}
    for cmd, record in protocol.PAYLOADS.items():
        args = samples.get(record, (None,) * len(record._fields))
        msg = record(*args)
        number, fields, drops = pickle.loads(pickle.dumps(protocol.wire(msg, ["x"])))
        back = protocol.from_wire(number, fields)
        assert number == int(cmd) and back == msg and type(back) is record and drops == ["x"]
        assert protocol.COMMAND_OF[record] is cmd


def test_select_device_for_master_and_worker_on_cpu():
    dev = select_device(False, "bf16")
    assert isinstance(dev, cpu.CpuDevice) and isinstance(dev, Device) and dev.precision == "bf16"
    assert not dev.has_collectives and not dev.queued and dev.name == "cpu"
    worker = select_device(False, worker=True)
    assert type(worker) is cpu.CpuDevice and worker.precision == "highest"


def test_select_device_refuses_use_gpu_without_a_gpu(monkeypatch):
    from synkhronos._devices import gpu

    monkeypatch.setattr(gpu, "visible_gpus", lambda: [])
    with pytest.raises(RuntimeError, match="use_gpu=False"):
        select_device(True, "highest")
    assert select_device(None, "highest").name == "cpu"


def test_select_device_under_mpi_gives_cpu_ranks_mpi_collectives():
    cluster = types.SimpleNamespace(comm="comm", one_node=lambda n: True)
    dev = select_device(False, "highest", cluster, 2)
    assert dev.has_collectives and dev.name == "cpu" and type(dev).__name__ == "MpiCpuDevice"
    assert type(select_device(False, cluster=cluster, worker=True)).__name__ == "MpiCpuDevice"


def test_every_device_provides_the_interface():
    from synkhronos._devices import cpu_mpi, gpu

    members = [m for m in vars(Device) if not m.startswith("__")]
    for cls in (cpu.CpuDevice, cpu_mpi.MpiCpuDevice, gpu.GpuDevice):
        assert issubclass(cls, Device)
        assert all(hasattr(cls, m) for m in members)
    collectives = ("all_reduce", "reduce", "broadcast", "gather", "all_gather", "init_comm")
    for cls in (cpu_mpi.MpiCpuDevice, gpu.GpuDevice):  # has_collectives: each one its own
        assert cls.has_collectives and all(getattr(cls, m) is not getattr(Device, m) for m in collectives)


# ----------------------------------------------------------- which values fit
def _kept(x, dtype, floats):
    """The docs' rule for one Python number ``x`` of a list into ``dtype``:
    a float (in a list that holds any float) rounds into a float dtype unless
    it overflows; any other number must keep its exact value."""
    if dtype.kind in "fc" and floats:
        with np.errstate(over="ignore"):
            return not (math.isfinite(x) and math.isinf(float(np.asarray(x, dtype=dtype).real)))
    if dtype.kind == "b":
        return x in (0, 1)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return float(x).is_integer() and info.min <= x <= info.max if isinstance(x, float) \
            else info.min <= x <= info.max
    return int(np.asarray(x, dtype=dtype).real) == x  # an int into a float dtype: exact


FIT_DTYPES = [np.dtype(d) for d in ("bool", "int8", "uint8", "int32", "int64", "uint64", "float32",
                                    "float64", "complex64")]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=6),
                 st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6),
                 st.lists(st.one_of(st.integers(-300, 300), st.floats(allow_nan=False, width=64)),
                          min_size=1, max_size=6)),
       st.sampled_from(FIT_DTYPES))
def test_numbers_fit_when_each_keeps_its_value(values, dtype):
    arr = np.asarray(values)
    got = fit_to(values, arr, dtype)
    floats = any(isinstance(x, float) for x in values)
    if arr.dtype.kind == "O":  # ints numpy keeps only as objects: not numbers
        assert got is None
        return
    want = all(_kept(x, dtype, floats) for x in values)
    assert (got is not None) == want, (values, dtype, got)
    if got is not None:
        assert got.dtype == dtype
        if not (floats and dtype.kind in "fc"):  # every number exactly as given
            assert [complex(g) if dtype.kind == "c" else int(g) for g in got] == values


@pytest.mark.parametrize("source", ["bool", "int16", "int64", "uint64", "float32", "float64"])
@pytest.mark.parametrize("target", ["int32", "float32", "float64"])
def test_arrays_fit_when_numpy_casts_them_safely(source, target):
    arr = np.ones(3, dtype=source)
    safe = np.can_cast(source, target, "safe")
    assert array_fits(np.dtype(source), np.dtype(target)) == safe
    got = fit_to(arr, arr, np.dtype(target))
    assert (got is not None) == safe
    if safe:
        assert got.dtype == target and np.array_equal(got, arr)
