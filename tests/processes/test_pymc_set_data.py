"""``pm.set_data`` on a ``data_parallel`` copy: the next evaluation uses the new
rows on the ranks (their values, their number), against PyMC on the original
model given the same data; where the terms can no longer be the ones split,
every evaluation says so instead of using the old rows.  Also: observed values
given as ``pm.Data`` of another dtype (which PyMC casts) are split."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

from test_pymc import N_RANKS, RTOL, float64_session, points  # noqa: E402
from test_pymc_loo import assert_same_loo, logistic_idata  # noqa: E402
from test_pymc_placement import _point_of  # noqa: E402
from test_pymc_workflow import SEVERAL, several_terms  # noqa: E402

from synkhronos.pymc import _placement, data_parallel, loo  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402

N = 1001  # uneven over 2 ranks


@pytest.fixture(scope="module")
def session():
    with float64_session(N_RANKS):
        yield


def logistic(n=N, seed=0):
    """Rows and outcomes both ``pm.Data``; the outcomes' integers cast by PyMC."""
    rng = np.random.default_rng(seed)
    x, y = _logistic_rows(rng, n)
    with pm.Model(coords={"feature": ["a", "b", "c"]}) as m:
        xd = pm.Data("x", x)
        yd = pm.Data("y_obs", y)
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1, dims="feature")
        pm.Bernoulli("y", logit_p=a + xd @ b, observed=yd)
    return m


def _logistic_rows(rng, n, k=3):
    x = rng.standard_normal((n, k))
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ np.linspace(-1, 1, k) + 0.3)))).astype("int32")
    return x, y


def groups(n=N, n_groups=300, top=299, seed=1):
    """Varying intercepts indexed by a ``pm.Data`` group index, which the ranks
    hold in the fewest bits its values allow."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, top + 1, n)
    with pm.Model() as m:
        gd = pm.Data("g", g)
        xd = pm.Data("x", rng.standard_normal(n))
        a = pm.Normal("a", 0, 1, shape=n_groups)
        b = pm.Normal("b", 0, 1)
        pm.Normal("y", a[gd] + b * xd, 1.0, observed=rng.standard_normal(n), shape=gd.shape)
    return m


def _same(orig, copy, k=2):
    logp0, logp1 = orig.compile_logp(), copy.compile_logp()
    d0, d1 = orig.compile_dlogp(), copy.compile_dlogp()
    for p in points(orig, k):
        np.testing.assert_allclose(logp1(p), logp0(p), rtol=RTOL)
        np.testing.assert_allclose(d1(p), d0(p), rtol=RTOL, atol=1e-9)


def _set(models, **data):
    for m in models:
        pm.set_data(data, model=m)


@pytest.mark.parametrize("ranks", [1, N_RANKS], ids=["this rank", "every rank"])
def test_set_data_reaches_the_ranks(session, ranks):
    """New values, fewer rows and more rows (uneven over the ranks), through the
    functions compiled before and after."""
    model = logistic()
    copy = data_parallel(model, ranks=ranks)
    compiled = copy.compile_logp(), model.compile_logp()
    _same(model, copy)
    rng = np.random.default_rng(5)
    for n in (N, 777, 1500):
        x, y = _logistic_rows(rng, n)
        _set((model, copy), x=x, y_obs=y)
        _same(model, copy)
        p = model.initial_point()
        np.testing.assert_allclose(compiled[0](p), compiled[1](p), rtol=RTOL)


def test_set_data_with_new_coordinates(session):
    """Rows with a named dimension: ``pm.set_data`` of fewer rows with their
    coordinates (the dimension's length changes with them)."""
    rng = np.random.default_rng(13)
    x, y = _logistic_rows(rng, N)
    with pm.Model(coords={"obs": np.arange(N), "feature": list("abc")}) as model:
        xd = pm.Data("x", x, dims=("obs", "feature"))
        yd = pm.Data("y_obs", y, dims="obs")
        b = pm.Normal("b", 0, 1, dims="feature")
        pm.Bernoulli("y", logit_p=xd @ b, observed=yd, dims="obs")
    copy = data_parallel(model)
    x, y = _logistic_rows(rng, 640)
    for m in (model, copy):
        pm.set_data({"x": x, "y_obs": y}, model=m, coords={"obs": np.arange(640)})
    _same(model, copy)


def test_set_data_reaches_several_terms_and_a_potential(session):
    model = several_terms()
    copy = data_parallel(model, observed=SEVERAL)
    rng = np.random.default_rng(11)
    _set((model, copy), x=rng.standard_normal(N), w=rng.standard_normal(N))
    _same(model, copy)


def test_set_data_reaches_this_ranks_own_rows_and_every_ranks(session, monkeypatch):
    """Placed alone for one point and on every rank for four (``_placement``):
    both copies of the rows take the new data."""
    times = [(2.0, 4.0), (0.5, 1.0), (1.0, 4.0)]  # every rank, this rank's share, this rank alone
    monkeypatch.delenv(_placement.RANKS_ENV, raising=False)
    monkeypatch.setattr(_placement, "_timed", lambda served, point, sizes: dict(zip(sizes, times.pop(0))))
    model = logistic()
    copy = data_parallel(model)
    served = rows_op_of(copy)[0].evaluator
    assert served.alone_up_to == 1 and served.alone_rows is not served.rows
    x, y = _logistic_rows(np.random.default_rng(5), 777)
    _set((model, copy), x=x, y_obs=y)
    _same(model, copy, k=1)  # one point: this rank's own rows
    at = _point_of(copy, model.initial_point())
    (one,) = served.run([at])
    for four in served.run([at] * 4):  # every rank's rows
        for a, b in zip(four, one):
            np.testing.assert_allclose(a, b, rtol=RTOL)


@pytest.mark.parametrize("first", ["log-likelihood", "loo"])
def test_set_data_reaches_the_rows_log_likelihood_and_loo(session, first):
    """``pm.compute_log_likelihood`` and ``loo`` read the ranks' rows too,
    whichever comes first after ``pm.set_data``."""
    import arviz as az

    model = logistic()
    copy = data_parallel(model)
    x, y = _logistic_rows(np.random.default_rng(6), 640)
    _set((model, copy), x=x, y_obs=y)
    idata = logistic_idata()
    pm.compute_log_likelihood(idata, model=model, progressbar=False)
    if first == "loo":
        assert_same_loo(loo(idata, copy, pointwise=True), az.loo(idata, pointwise=True))
    ours = pm.compute_log_likelihood(idata, model=copy, extend_inferencedata=False, progressbar=False)
    theirs = idata["log_likelihood"]["y"]
    assert ours["y"].shape == theirs.shape and ours["y"].shape[-1] == 640
    np.testing.assert_allclose(ours["y"].values, theirs.values, rtol=1e-9)
    assert_same_loo(loo(idata, copy, pointwise=True), az.loo(idata, pointwise=True))


def test_set_data_then_threads_at_once(session, monkeypatch):
    """Threads evaluating at once after ``pm.set_data`` (nutpie's chains): the
    rows are replaced once, and every thread gets PyMC's numbers for its point."""
    import threading
    import time

    from synkhronos._session import runtime
    from synkhronos.pymc import _refresh

    placed = []
    place_rows = _refresh.place_rows
    monkeypatch.setattr(_refresh, "place_rows", lambda *a: placed.append(1) or place_rows(*a))
    model = logistic()
    copy = data_parallel(model)
    ps = points(model, 4)
    fns = [copy.compile_logp() for _ in ps]  # a PyTensor function is not reentrant: one per chain
    theirs = model.compile_logp()
    x, y = _logistic_rows(np.random.default_rng(16), 777)
    _set((model, copy), x=x, y_obs=y)
    got = [None] * len(ps)

    def chain(k):
        got[k] = fns[k](ps[k])

    threads = [threading.Thread(target=chain, args=(k,)) for k in range(len(ps))]
    with runtime.require().lock:  # every chain asks before the rows are replaced
        for t in threads:
            t.start()
        time.sleep(0.3)
    for t in threads:
        t.join(60)
    assert placed == [1]
    for p, value in zip(ps, got):
        np.testing.assert_allclose(value, theirs(p), rtol=RTOL)


def _logp_in_child(fn, point, conn):
    try:
        conn.send(float(fn(point)))
    except Exception as exc:  # what the child saw, for the parent to check
        conn.send("%s: %s" % (type(exc).__name__, exc))


def test_set_data_reaches_chains_in_forked_processes(session):
    """A chain that PyMC forks evaluates through this process's service: the
    rows it is given are the copy's data at the time."""
    import multiprocessing as mp

    model = logistic()
    copy = data_parallel(model)
    fn = copy.compile_logp()
    fn(model.initial_point())
    x, y = _logistic_rows(np.random.default_rng(10), 777)
    _set((model, copy), x=x, y_obs=y)
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_logp_in_child, args=(fn, model.initial_point(), child))
    proc.start()
    assert parent.poll(60), "the forked process neither answered nor failed"
    said = parent.recv()
    proc.join(10)
    np.testing.assert_allclose(said, model.compile_logp()(model.initial_point()), rtol=RTOL)


def test_observed_pm_data_of_another_dtype_is_split(session):
    """``observed=pm.Data(...)`` of integers: PyMC casts it to the variable's
    dtype, and the cast rows are split like any other."""
    model = logistic()
    assert model.rvs_to_values[model["y"]].owner is not None  # PyMC's cast
    copy = data_parallel(model)
    assert rows_op_of(copy) is not None
    _same(model, copy)


def test_an_index_held_in_fewer_bits_takes_new_values(session):
    """An index held in 16 bits takes values that 8 would hold (kept in 16), and
    values over 16 bits are refused, never read wrapped; values that fit again
    are taken again."""
    model = groups(top=299)
    copy = data_parallel(model, ranks=N_RANKS)
    rng = np.random.default_rng(7)
    _set((model, copy), g=rng.integers(0, 50, N))
    _same(model, copy)
    small = groups(top=9)  # held in 8 bits
    small_copy = data_parallel(small, ranks=N_RANKS)
    _set((small, small_copy), g=rng.integers(0, 300, N))
    logp = small_copy.compile_logp()
    for _ in range(2):  # refused at every evaluation, not once
        with pytest.raises(ValueError, match="'g' .*g: values held in uint16, split in uint8.*data_parallel"):
            logp(small.initial_point())
    _set((small, small_copy), g=rng.integers(0, 10, N))
    _same(small, small_copy)


def treatment(t):
    """A treatment indicator as a row of data beside a covariate."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal(N)
    with pm.Model() as m:
        td = pm.Data("t", t)
        xd = pm.Data("x", x)
        a = pm.Normal("a", 0, 1, shape=2)
        pm.Normal("y", a[0] * xd + a[1] * td, 1.0, observed=x + 0.5 * t + rng.standard_normal(N))
    return m


def test_rows_that_become_all_the_same_are_taken(session):
    """Rows all the same are held as one constant row where they are at the
    split (``_rowdata``); where they become so later (a fold of one group), the
    ranks take them as the rows they were split as."""
    t = (np.arange(N) % 2).astype(float)
    model = treatment(t)
    copy = data_parallel(model)
    _set((model, copy), t=np.zeros(N))
    _same(model, copy)
    _set((model, copy), t=t[::-1].copy())
    _same(model, copy)


def test_rows_held_as_one_constant_row_refuse_others(session):
    model = treatment(np.ones(N))
    copy = data_parallel(model)
    _set((model, copy), t=np.ones(N))  # the same again: taken
    _same(model, copy, k=1)
    _set((model, copy), t=(np.arange(N) % 2).astype(float))
    with pytest.raises(ValueError, match="'t'.*3 arrays of rows, where 2 were split.*data_parallel"):
        copy.compile_logp()(model.initial_point())


def test_a_copy_split_again_is_its_original_with_its_data(session):
    """``model = data_parallel(model)`` run twice, and a copy whose session was
    closed: its original is split again, with the copy's data."""
    import synkhronos as synk

    model = logistic()
    copy = data_parallel(model)
    x, y = _logistic_rows(np.random.default_rng(14), 640)
    _set((model, copy), x=x, y_obs=y)
    logp = copy.compile_logp()
    again = data_parallel(copy)
    assert rows_op_of(again)[0] is not rows_op_of(copy)[0]
    _same(model, again)
    rows = rows_op_of(copy)[0].evaluator.rows
    assert [list(n) for n in synk.get_lengths(rows)] == [[0, 0]] * len(rows)  # the first copy's rows freed
    with pytest.raises(RuntimeError, match="released when data_parallel was called on it again"):
        logp(model.initial_point())
    synk.close()
    with pytest.raises(RuntimeError, match="was closed: call synkhronos.pymc.data_parallel"):
        again.compile_logp()(model.initial_point())
    synk.fork(N_RANKS, use_gpu=False)
    _same(model, data_parallel(again))


def test_new_columns_are_refused_not_computed_on_the_old_rows(session):
    model = logistic()
    copy = data_parallel(model)
    x, y = _logistic_rows(np.random.default_rng(8), N, k=4)
    for m in (model, copy):
        pm.set_data({"x": x, "y_obs": y}, model=m, coords={"feature": list("abcd")})
    point = {"a": 0.1, "b": np.linspace(-1, 1, 4)}
    assert np.isfinite(model.compile_logp()(point))
    with pytest.raises(ValueError, match=r"'x'.*rows of shape \(4,\), split as \(3,\).*data_parallel"):
        copy.compile_logp()(point)


def test_the_copy_holds_the_originals_arrays_until_set_data(session):
    """No second copy of the data in this process (PyMC's clone makes one)."""
    model = logistic()
    copy = data_parallel(model)
    for name in ("x", "y_obs"):
        assert copy[name].get_value(borrow=True) is model[name].get_value(borrow=True)
    before = model["x"].get_value()
    pm.set_data({"x": before + 1.0}, model=copy)
    np.testing.assert_array_equal(model["x"].get_value(borrow=True), before)


def test_rows_leave_no_buffer_as_large_as_them_here(session):
    """The rows reach the other rank through shared memory freed at once, in
    the split and after ``pm.set_data``, not through the session's exchange
    buffer, which would keep their size for the session."""
    from synkhronos._session import runtime

    rows_bytes = 200_000 * 4 * 8
    model = logistic(200_000)
    copy = data_parallel(model, ranks=N_RANKS)
    exchange = runtime.require().exchange
    assert exchange._seg is None or exchange._seg.nbytes < rows_bytes / 4
    x, y = _logistic_rows(np.random.default_rng(15), 200_000)
    _set((model, copy), x=x, y_obs=y)
    _same(model, copy, k=1)
    assert exchange._seg is None or exchange._seg.nbytes < rows_bytes / 4


def test_set_data_on_the_original_leaves_the_copy(session):
    model = logistic()
    copy = data_parallel(model)
    before = copy.compile_logp()(model.initial_point())
    x, y = _logistic_rows(np.random.default_rng(9), N)
    pm.set_data({"x": x, "y_obs": y}, model=model)
    assert copy.compile_logp()(model.initial_point()) == before
