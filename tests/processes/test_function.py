"""synk.function calls against plain pytensor.function on the same rows, on 2 and 3
ranks (3 makes uneven splits)."""

import types

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos._common.selections import split_bounds

ROWS = 23  # uneven over 2 and 3 ranks


ATOL = 1e-8  # np.allclose's default (with rtol 1e-5); one-GPU runs widen it (tests/gpu)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=ATOL)


def make_env(n, use_gpu):
    """Fork ``n`` ranks, build every function of this module, distribute."""
    assert synk.fork(n, use_gpu=use_gpu) == n
    fx = pytensor.config.floatX
    rng = np.random.default_rng(n)
    ns = types.SimpleNamespace(n=n, fx=fx)
    x = pt.matrix("x")
    y = pt.matrix("y")
    t = pt.matrix("t")
    xy = x.dot(y)
    # Every reduce mode, with the plain PyTensor function for reference.
    outs = [xy.mean(axis=0), (xy.sum(axis=0), "sum"), (xy.max(axis=0), "max"),
            (xy.min(axis=0), "min"), ((1 + 0.01 * xy).prod(axis=0), "prod"), (xy.sum(axis=1), None)]
    ns.f = synk.function(inputs=[x], bcast_inputs=[y], outputs=outs, name="modes")
    ns.f_ref = pytensor.function([x, y], [o if not isinstance(o, tuple) else o[0] for o in outs])
    # A minibatch target input.
    loss = ((x.dot(y) - t) ** 2).mean()
    ns.g = synk.function(inputs=[x, t], bcast_inputs=[y], outputs=loss)
    ns.g_ref = pytensor.function([x, t, y], loss)
    # Updates: the seed's update, plus an averaged one.
    ns.s = pytensor.shared(np.ones(4, dtype=fx), name="s")
    ns.m = pytensor.shared(np.zeros(4, dtype=fx), name="m")
    ns.u = synk.function([x], updates=[(ns.s, (x * ns.s).sum(axis=0), "sum"),
                                       (ns.m, ns.m + 0.5 * x.mean(axis=0))])
    # Sliceable shared data set.
    ns.sx = pytensor.shared(np.zeros((1, 3), dtype=fx), name="sx")
    ns.sw = pytensor.shared(rng.standard_normal((3, 2)).astype(fx), name="sw")
    sz = ns.sx.dot(ns.sw)
    ns.h = synk.function([], outputs=[sz.mean(axis=0), (sz.sum(axis=0), "sum"), (sz.max(), "max")],
                         sliceable_shareds=[ns.sx])
    xm = pt.matrix("xm")
    ns.hx = synk.function([xm], outputs=(xm * ns.sx).sum(), sliceable_shareds=[ns.sx])
    # No inputs at all: every rank computes the same value.
    ns.k = synk.function([], outputs=ns.sw.sum() * 2)
    synk.distribute()
    ns.x = rng.standard_normal((ROWS, 4)).astype(fx)
    ns.y = rng.standard_normal((4, 3)).astype(fx)
    ns.t = rng.standard_normal((ROWS, 3)).astype(fx)
    ns.dx, ns.dy = ns.f.build_inputs(ns.x, ns.y)
    ns.dt = synk.data(ns.t, minibatch=True)
    ns.data_rows = rng.standard_normal((ROWS, 3)).astype(fx)
    return ns


@pytest.fixture(scope="module", params=[2, 3], ids=["n2", "n3"])
def env(request):
    yield make_env(request.param, use_gpu=False)
    synk.close()


def parts(n_rows, n):
    return [slice(a, b) for a, b in split_bounds(n_rows, n)]


def check_modes(env, result, rows):
    ref = env.f_ref(rows, env.y)
    for r, e in zip(result[:5], ref[:5]):
        close(r, e)
    # None: one entry per rank that had rows, each that rank's rows.
    per_rank = [ref[5][p] for p in parts(len(rows), env.n) if p.stop > p.start]
    assert len(result[5]) == len(per_rank)
    for r, e in zip(result[5], per_rank):
        close(r, e)


BATCHES = [
    None,
    7,
    slice(3, 20),
    [5, 1, 1, 22, 0, 9, 9, 3],
    np.array([20, 2, 11, 11, 4], dtype=np.int32),
]


@pytest.mark.parametrize("batch", BATCHES, ids=["none", "int", "slice", "list", "array"])
@pytest.mark.parametrize("num_slices", [1, 3])
def test_batch_forms_all_modes(env, batch, num_slices):
    rows = env.x if batch is None else env.x[np.arange(ROWS)[slice(0, batch) if isinstance(batch, int)
                                                               else batch]]
    result = env.f(env.dx, env.dy, batch=batch, num_slices=num_slices)
    check_modes(env, result, rows)


def test_more_slices_than_rows(env):
    check_modes(env, env.f(env.dx, env.dy, batch=slice(0, 4), num_slices=6), env.x[:4])


def test_fewer_rows_than_ranks_weighted_avg(env):
    # batch of one row: only rank 0 computes; avg and None see just that rank.
    result = env.f(env.dx, env.dy, batch=[6])
    check_modes(env, result, env.x[[6]])
    assert len(result[5]) == 1


def test_avg_is_weighted_by_part_size(env):
    # The seed averaged ranks with equal weights; uneven parts must still give the
    # exact mean over all rows.
    rows = env.x[:ROWS]
    close(env.f(env.dx, env.dy, output_subset=[0])[0], rows.dot(env.y).mean(axis=0))


def test_output_subset(env):
    ref = env.f_ref(env.x, env.y)
    got = env.f(env.dx, env.dy, output_subset=[2, 0])
    assert len(got) == 2
    close(got[0], ref[2])
    close(got[1], ref[0])


def test_keyword_inputs_and_single_output(env):
    got = env.g(x=env.dx, t=env.dt, y=env.dy)
    assert np.ndim(got) == 0
    close(got, env.g_ref(env.x, env.t, env.y))


@pytest.mark.parametrize("batch", [9, slice(4, 15), [12, 0, 3, 3, 21, 7, 8]], ids=["int", "slice", "list"])
@pytest.mark.parametrize("num_slices", [1, 2])
def test_minibatch_indexed_by_position(env, batch, num_slices):
    sel = np.arange(ROWS)[slice(0, batch) if isinstance(batch, int) else batch]
    expected = env.g_ref(env.x[sel], env.t[:len(sel)], env.y)
    close(env.g(env.dx, env.dt, env.dy, batch=batch, num_slices=num_slices), expected)


def test_minibatch_too_short(env):
    short = synk.data(env.t[:3], minibatch=True)
    with pytest.raises(ValueError, match="minibatch"):
        env.g(env.dx, short, env.dy, batch=5)


def test_as_theano_and_properties(env):
    close(env.f.as_theano(env.x, env.y)[0], env.f_ref(env.x, env.y)[0])
    close(env.g.as_theano(env.dx, env.dt, env.dy), env.g_ref(env.x, env.t, env.y))
    assert env.f.name == "modes"
    assert env.f.output_modes == ["avg", "sum", "max", "min", "prod", None]
    assert env.u.update_modes == ["sum", "avg"]
    assert env.f.as_pytensor is not None


def _expected_updates(env, rows):
    s0 = np.ones(4, dtype=env.fx)
    return (rows * s0).sum(axis=0), 0.5 * rows.mean(axis=0)


@pytest.mark.parametrize("num_slices", [1, 4])
def test_updates_local_per_rank_and_sliced(env, num_slices):
    synk.broadcast([env.s, env.m], [np.ones(4, dtype=env.fx), np.zeros(4, dtype=env.fx)])
    env.u(env.dx, num_slices=num_slices)
    s_all = synk.gather(env.s)
    m_all = synk.gather(env.m)
    for rank, p in enumerate(parts(ROWS, env.n)):
        es, em = _expected_updates(env, env.x[p])
        close(s_all[rank], es)
        close(m_all[rank], em)
    close(env.s.get_value(), s_all[0])  # the master's own variable is rank 0's copy


def test_update_seed_semantics_sliced_equals_unsliced(env):
    # Each slice computes from the original value; the update is applied once.
    synk.broadcast(env.s, np.ones(4, dtype=env.fx))
    env.u(env.dx, batch=slice(2, 19))
    once = synk.gather(env.s)
    synk.broadcast(env.s, np.ones(4, dtype=env.fx))
    env.u(env.dx, batch=slice(2, 19), num_slices=3)
    close(synk.gather(env.s), once)


def scatter_rows(env):
    synk.scatter(env.sx, env.data_rows)
    return [env.data_rows[p] for p in parts(ROWS, env.n)]


def h_ref(env, rows):
    z = rows.dot(env.sw.get_value())
    return [z.mean(axis=0), z.sum(axis=0), z.max()]


def check_h(env, got, rows):
    for g, e in zip(got, h_ref(env, rows)):
        close(g, e)


@pytest.mark.parametrize("num_slices", [1, 3])
def test_sliceable_shared_whole(env, num_slices):
    scatter_rows(env)
    check_h(env, env.h(num_slices=num_slices), env.data_rows)


BATCH_S = {
    "slice": lambda n: slice(1, 6),
    "list": lambda n: [0, 4, 4, 2],
    "array": lambda n: np.array([6, 1, 3]),
    "slices": lambda n: [slice(r, r + 4) for r in range(n)],
    "arrays": lambda n: [np.array([r, 0, 5 - r]) for r in range(n)],
}


@pytest.mark.parametrize("form", list(BATCH_S))
@pytest.mark.parametrize("num_slices", [1, 2])
def test_batch_s_forms(env, form, num_slices):
    local = scatter_rows(env)
    batch_s = BATCH_S[form](env.n)
    per_rank = batch_s if isinstance(batch_s, list) and not isinstance(batch_s[0], int) else [batch_s] * env.n
    rows = np.concatenate([local[r][np.arange(len(local[r]))[sel]] for r, sel in enumerate(per_rank)])
    check_h(env, env.h(batch_s=batch_s, num_slices=num_slices), rows)


def test_batch_s_with_scattered_input(env):
    local = scatter_rows(env)
    xm = synk.data(np.ones((4 * env.n, 3), dtype=env.fx))
    got = env.hx(xm, batch_s=slice(2, 6))
    expected = sum(local[r][2:6].sum() for r in range(env.n))
    close(got, expected / env.n)  # avg over ranks with equal row counts
    with pytest.raises(ValueError, match="lengths must match"):
        env.hx(xm, batch_s=slice(0, 3))


def test_batch_s_out_of_range_on_master(env):
    scatter_rows(env)
    with pytest.raises(ValueError, match="rows"):
        env.h(batch_s=slice(0, 50))


def test_no_inputs_every_rank_same(env):
    close(env.k(), 2 * env.sw.get_value().sum())


def test_data_dtype_upcast(env):
    # float16 Data into a float32/float64 variable converts safely on each rank.
    x16 = synk.data(env.x.astype(np.float16))
    got = env.f(x16, env.dy, output_subset=[1])[0]
    close(got, env.x.astype(np.float16).astype(env.fx).dot(env.y).sum(axis=0))


def test_data_written_in_place_is_seen_by_workers(env):
    d = synk.data(env.x.copy())
    d[:] = 2 * env.x
    close(env.f(d, env.dy, output_subset=[1])[0], (2 * env.x).dot(env.y).sum(axis=0))
    d.set_value(np.concatenate([env.x, env.x]), oversize=1.5)  # reallocates
    close(env.f(d, env.dy, output_subset=[1])[0], 2 * env.x.dot(env.y).sum(axis=0))
