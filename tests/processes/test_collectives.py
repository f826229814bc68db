"""Collectives on shared variables against numpy, on 2 and 3 ranks."""

import types

import numpy as np
import pytensor
import pytest

import synkhronos as synk
from synkhronos._common.selections import split_bounds
from synkhronos._wire.exchange_buffer import INLINE_BYTES


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def make_env(n, use_gpu, master_rank=0):
    """Fork ``n`` ranks, build a function using every shared variable, distribute."""
    synk.fork(n, use_gpu=use_gpu, master_rank=master_rank)
    fx = pytensor.config.floatX
    ns = types.SimpleNamespace(n=n, fx=fx, rng=np.random.default_rng(7))
    ns.a = pytensor.shared(np.zeros((5, 3), dtype=fx), name="a")
    ns.b = pytensor.shared(np.zeros(4, dtype=fx), name="b")
    ns.big = pytensor.shared(np.zeros((1, 1000), dtype=fx), name="big")  # rows > 64 KiB go via shm
    ns.c = pytensor.shared(np.float64(0.0).astype(fx), name="c")
    ns.i = pytensor.shared(np.zeros(3, dtype="int32"), name="i")
    ns.unused = pytensor.shared(np.zeros(2, dtype=fx), name="unused")
    synk.function([], outputs=ns.a.sum() + ns.b.sum() + ns.big.sum() + ns.c + ns.i.sum())
    synk.distribute()
    return ns


@pytest.fixture(scope="module", params=[2, 3], ids=["n2", "n3"])
def env(request):
    n = request.param
    yield make_env(n, use_gpu=False, master_rank=n - 1 if n == 3 else 0)
    synk.close()


def rand(env, *shape):
    return env.rng.standard_normal(shape).astype(env.fx)


def set_each(env, var, values):
    for r, v in enumerate(values):
        synk.set_value(r, var, v)


@pytest.mark.parametrize("source", ["numpy", "data"])
def test_broadcast_values(env, source):
    v = rand(env, 5, 3)
    synk.broadcast(env.a, synk.data(v) if source == "data" else v)
    for g in synk.gather(env.a):
        close(g, v)
    close(env.a.get_value(), v)


def test_broadcast_masters_value_and_list(env):
    va, vb = rand(env, 2, 3), rand(env, 4)
    env.a.set_value(va)
    env.b.set_value(vb)
    synk.broadcast([env.a, env.b])
    ga, gb = synk.gather([env.a, env.b])
    close(ga, np.stack([va] * env.n))
    close(gb, np.stack([vb] * env.n))


@pytest.mark.parametrize("rows", [7, 300])
@pytest.mark.parametrize("source", ["numpy", "data"])
def test_scatter_uneven(env, rows, source):
    v = rand(env, rows, 1000)
    synk.scatter(env.big, synk.data(v) if source == "data" else v)
    assert synk.get_lengths(env.big) == [b - a for a, b in split_bounds(rows, env.n)]
    for r, (a, b) in enumerate(split_bounds(rows, env.n)):
        close(synk.get_value(r, env.big), v[a:b])
    close(synk.gather(env.big, nd_up=0), v)


@pytest.mark.parametrize("batch", [4, slice(2, 9), [8, 0, 0, 3, 5]], ids=["int", "slice", "list"])
@pytest.mark.parametrize("source", ["numpy", "data"])
def test_scatter_batch(env, batch, source):
    v = rand(env, 10, 3)
    synk.scatter(env.a, synk.data(v) if source == "data" else v, batch=batch)
    sel = v[np.arange(10)[slice(0, batch) if isinstance(batch, int) else batch]]
    close(synk.gather(env.a, nd_up=0), sel)


def test_scatter_list_of_vars(env):
    va, vb = rand(env, 6, 3), rand(env, 6)
    synk.scatter([env.a, env.b], [va, vb])
    ga, gb = synk.gather([env.a, env.b], nd_up=0)
    close(ga, va)
    close(gb, vb)


def test_gather_uneven_shapes(env):
    values = [rand(env, r + 1, 3) for r in range(env.n)]
    set_each(env, env.a, values)
    close(synk.gather(env.a, nd_up=0), np.concatenate(values))
    stacked = synk.gather(env.a, nd_up=1)  # shapes differ: one array per rank
    assert isinstance(stacked, list) and len(stacked) == env.n
    for g, v in zip(stacked, values):
        close(g, v)
    assert synk.get_shapes(env.a) == [(r + 1, 3) for r in range(env.n)]


def test_gather_scalar(env):
    set_each(env, env.c, [np.asarray(float(r), dtype=env.fx) for r in range(env.n)])
    close(synk.gather(env.c), np.arange(env.n))
    with pytest.raises(ValueError, match="0-d"):
        synk.gather(env.c, nd_up=0)


@pytest.mark.parametrize("even", [False, True], ids=["uneven", "even"])
def test_all_gather(env, even):
    values = [rand(env, 2 if even else r + 2, 3) for r in range(env.n)]
    set_each(env, env.a, values)
    synk.all_gather(env.a)
    full = np.concatenate(values)
    for r in range(env.n):
        close(synk.get_value(r, env.a), full)


def test_all_gather_refuses_what_does_not_concatenate(env):
    values = [rand(env, 2, 3 + r) for r in range(env.n)]  # trailing shapes differ
    set_each(env, env.a, values)
    with pytest.raises(ValueError, match="cannot concatenate values of a with shapes"):
        synk.all_gather(env.a)
    for r in range(env.n):  # nothing changed
        close(synk.get_value(r, env.a), values[r])
    with pytest.raises(ValueError, match="cannot concatenate 0-d values of c"):
        synk.all_gather(env.c)


@pytest.mark.parametrize("op,fn", [("avg", np.mean), ("sum", np.sum), ("prod", np.prod),
                                   ("max", np.max), ("min", np.min)])
def test_reduce_ops(env, op, fn):
    values = [rand(env, 4) for _ in range(env.n)]
    set_each(env, env.b, values)
    expected = fn(np.stack(values), axis=0)
    close(synk.reduce(env.b, op=op, in_place=False), expected)
    for r in range(env.n):  # not in place: nothing changed
        close(synk.get_value(r, env.b), values[r])
    assert synk.reduce(env.b, op=op) is None
    close(env.b.get_value(), expected)
    for r in range(env.n):
        if r != synk._session.runtime.current().master_rank:
            close(synk.get_value(r, env.b), values[r])


@pytest.mark.parametrize("op,fn", [("avg", np.mean), ("sum", np.sum), ("max", np.max)])
def test_all_reduce(env, op, fn):
    values = [rand(env, 5, 3) for _ in range(env.n)]
    set_each(env, env.a, values)
    synk.all_reduce([env.a], op=op)
    for r in range(env.n):
        close(synk.get_value(r, env.a), fn(np.stack(values), axis=0))


@pytest.mark.parametrize("op", ["avg", "sum", "max"])
def test_reduce_several_variables(env, op):
    # One call on variables of different shapes and dtypes (on GPUs: one NCCL group).
    fn = {"avg": np.mean, "sum": np.sum, "max": np.max}[op]
    per_var = {env.a: [rand(env, 5, 3) for _ in range(env.n)],
               env.b: [rand(env, 4) for _ in range(env.n)],
               env.i: [env.rng.integers(-50, 50, 3).astype("int32") for _ in range(env.n)]}
    expected = [np.asarray(fn(np.stack(vs), axis=0)).astype(vs[0].dtype) for vs in per_var.values()]
    for var, vs in per_var.items():
        set_each(env, var, vs)
    variables = list(per_var)
    for got, want in zip(synk.reduce(variables, op=op, in_place=False), expected):
        assert got.dtype == want.dtype
        close(got, want)
    synk.all_reduce(variables, op=op)
    for r in range(env.n):
        for var, want in zip(variables, expected):
            close(synk.get_value(r, var), want)


def test_integer_avg_truncates(env):
    # Means of odd sums, negative ones too, cast back to int32 as numpy casts.
    values = [np.array([3, -3, 10], dtype="int32") + (r == 0) * np.array([1, -1, 1], dtype="int32")
              for r in range(env.n)]
    expected = np.mean(np.stack(values), axis=0).astype("int32")
    assert expected.tolist() != np.mean(np.stack(values), axis=0).tolist()  # something truncates
    set_each(env, env.i, values)
    got = synk.reduce(env.i, op="avg", in_place=False)
    assert got.dtype == np.int32 and got.tolist() == expected.tolist()
    synk.all_reduce(env.i, op="avg")
    for r in range(env.n):
        got = synk.get_value(r, env.i)
        assert got.dtype == np.int32 and got.tolist() == expected.tolist()


def test_reduce_mismatched_shapes(env):
    set_each(env, env.a, [rand(env, r + 1, 3) for r in range(env.n)])
    with pytest.raises(ValueError, match="shapes differ"):
        synk.all_reduce(env.a)


def test_set_get_value_each_rank(env):
    for r in range(env.n):
        v = rand(env, 3, 3)
        synk.set_value(r, env.a, v)
        close(synk.get_value(r, env.a), v)
    big = rand(env, 20, 1000)
    synk.set_value(rank=env.n - 1, shared_vars=env.big, values=big, batch=[3, 3, 19])
    close(synk.get_value(env.n - 1, env.big), big[[3, 3, 19]])
    va, vb = synk.get_value(0, [env.a, env.big])
    assert va.shape == (3, 3) and vb.ndim == 2


def test_values_fit_by_the_one_rule(env):
    # Python numbers convert when each keeps its value, floats rounding; arrays and
    # Data of another dtype when numpy casts them safely; anything lossy is refused.
    synk.broadcast(env.b, [1, 2, 3, 4])
    close(synk.get_value(env.n - 1, env.b), [1, 2, 3, 4])
    synk.broadcast(env.b, [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(synk.get_value(env.n - 1, env.b), np.array([0.1, 0.2, 0.3, 0.4], env.fx))
    small = synk.data(np.arange(4, dtype="int16"))
    synk.broadcast(env.b, small)
    np.testing.assert_array_equal(synk.get_value(env.n - 1, env.b), np.arange(4, dtype=env.fx))
    if env.fx == "float32":
        for lossy in (np.ones(4, dtype="float64") / 3, [2**25 + 1] * 4, synk.data(np.ones(4) / 3)):
            with pytest.raises(TypeError, match="does not fit shared variable b"):
                synk.broadcast(env.b, lossy)
        np.testing.assert_array_equal(synk.get_value(0, env.b), np.arange(4, dtype=env.fx))


@pytest.mark.parametrize("rows", [2, 17, 40])  # the converted value under and over the inline bound
@pytest.mark.parametrize("given", ["int16 Data", "int16 array", "list of ints"])
def test_converted_values_cross_the_inline_bound(env, rows, given):
    ints = np.random.default_rng(rows).integers(-30000, 30000, (rows, 1000)).astype("int16")
    value = {"int16 Data": lambda: synk.data(ints), "int16 array": lambda: ints,
             "list of ints": lambda: ints.tolist()}[given]()
    synk.broadcast(env.big, value)
    for r in (0, env.n - 1):
        np.testing.assert_array_equal(synk.get_value(r, env.big), ints.astype(env.fx))
    assert (rows * 1000 * np.dtype(env.fx).itemsize > INLINE_BYTES) == (rows > 16)


def test_unused_shared_rejected(env):
    with pytest.raises(ValueError, match="unused"):
        synk.gather(env.unused)
