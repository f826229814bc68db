"""synk.Data: numpy behaviour, allocation, and what the workers see."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk


@pytest.fixture(scope="module")
def fsum():
    synk.fork(2, use_gpu=False)
    x = pt.matrix("x")
    f = synk.function([x], outputs=[(x.sum(axis=0), "sum"), (x.shape[0], "sum")])
    synk.distribute()
    yield f
    synk.close()


def test_properties_and_numpy_behaviour(fsum):
    v = np.arange(20, dtype="float32").reshape(5, 4)
    d = synk.data(v, name="v")
    assert (d.dtype, d.ndim, d.shape, d.size, len(d), d.name, d.minibatch) == \
        ("float32", 2, (5, 4), 20, 5, "v", False)
    assert isinstance(d.data, np.ndarray) and d.alloc_size == 20
    np.testing.assert_array_equal(d[2:4], v[2:4])
    d[3] = 0
    assert d.data[3].sum() == 0
    np.testing.assert_array_equal(np.asarray(d), d.data)
    assert "float32" in repr(d) and "'v'" in repr(d)


def test_spec_from_var_dtype_shape(fsum):
    x = pt.tensor3("t3", dtype="int16")
    d = synk.data(var=x)
    assert (d.dtype, d.ndim, d.shape, d.name, d.data, len(d)) == ("int16", 3, None, "t3", None, 0)
    d2 = synk.data(dtype="float64", shape=(3, 2))
    assert d2.shape == (3, 2) and d2.alloc_size == 6
    d3 = synk.data(dtype="int32", ndim=1, minibatch=True)
    assert d3.minibatch and d3.size == 0
    s = synk.data(np.float32(2.5))  # 0-d data, e.g. a learning rate
    assert s.ndim == 0 and float(s.data) == 2.5


def test_set_value_oversize_and_reuse(fsum):
    d = synk.data(np.zeros((5, 4), dtype="float32"))
    big = np.ones((100, 4), dtype="float32")
    d.set_value(big, oversize=1.5)
    assert d.shape == (100, 4) and d.alloc_size == 600
    seg = d._memory.segment.name
    d.set_value(np.ones((120, 4), dtype="float32"))  # fits: no reallocation
    assert d._memory.segment.name == seg and d.alloc_size == 600 and len(d) == 120
    d.set_value(np.ones((10, 4), dtype="float32"))
    assert d.alloc_size == 600  # shrinking keeps the allocation
    d.free_memory()
    assert d.data is None and d.alloc_size == 0
    d.set_value(np.full((3, 4), 2, dtype="float32"))
    assert d.alloc_size == 12
    np.testing.assert_array_equal(fsum(d)[0], [6, 6, 6, 6])


def test_set_length_keeps_rows_and_reaches_workers(fsum):
    v = np.arange(12, dtype="float32").reshape(6, 2)
    d = synk.data(v)
    d.set_length(9)  # grows: reallocates, keeps the 6 rows
    np.testing.assert_array_equal(d[:6], v)
    d[6:] = 1
    np.testing.assert_allclose(fsum(d)[0], v.sum(axis=0) + 3)
    assert int(fsum(d)[1]) == 9
    d.set_length(4)
    np.testing.assert_array_equal(d.data, v[:4])
    np.testing.assert_allclose(fsum(d)[0], v[:4].sum(axis=0))
    d.set_shape((2, 2))
    assert d.shape == (2, 2)
    np.testing.assert_array_equal(d.data, v[:2])


def test_force_cast_and_condition_data(fsum):
    d = synk.data(np.zeros(3, dtype="float32"))
    with pytest.raises(TypeError, match="force_cast"):
        d.set_value(np.ones(3, dtype="float64"))
    d.set_value(np.array([1.5, 2.5, 3.5]), force_cast=True)
    assert d.dtype == "float32" and d.data.dtype == np.float32
    c = d.condition_data(np.arange(4, dtype="int8"))  # safe upcast
    assert c.dtype == np.float32 and c.shape == (4,)
    d.set_value([1, 2])  # a Python list converts
    np.testing.assert_array_equal(d.data, [1, 2])
    with pytest.raises(TypeError, match="ndim"):
        d.condition_data(np.zeros((2, 2), dtype="float32"))


def test_numbers_fit_data_only_when_each_keeps_its_value(fsum):
    """Python numbers: a float rounds into a float dtype; nothing wraps, loses its
    fraction or overflows (``[300]`` into int8 was once stored as 44)."""
    i8 = synk.data(np.zeros(2, dtype="int8"))
    i8.set_value([-128, 127])
    np.testing.assert_array_equal(i8.data, np.array([-128, 127], dtype="int8"))
    for bad in ([300, 1], [2.5], [float("nan")]):
        with pytest.raises(TypeError, match=r"cannot store the numbers .* int8 without loss.*force_cast"):
            i8.set_value(bad)
    np.testing.assert_array_equal(i8.data, [-128, 127])  # a refused value changes nothing
    f32 = synk.data([0.1, 0.2], dtype="float32")
    np.testing.assert_array_equal(f32.data, np.array([0.1, 0.2], dtype="float32"))
    for bad in ([1e300], [2**25 + 1]):
        with pytest.raises(TypeError, match="without loss"):
            f32.set_value(bad)
    u64 = synk.data([2**64 - 1, 3], dtype="uint64")  # numpy alone would infer float64 here
    assert u64.data.tolist() == [2**64 - 1, 3]


def test_build_inputs(fsum):
    x = np.ones((4, 3), dtype=pytensor.config.floatX)
    d = fsum.build_inputs(x, minibatch=True, oversize=2)
    assert isinstance(d, synk.Data) and d.minibatch and d.alloc_size == 24
    assert d.name == "x"


def test_data_from_data_copies(fsum):
    a = synk.data(np.arange(4, dtype="float32"))
    b = synk.data(a)
    b[0] = 10
    assert a[0] == 0 and b[0] == 10
