"""The rest of a PyMC user's workflow on a ``data_parallel`` copy, against PyMC
on the original model: ``pm.compute_log_likelihood`` (its rows computed on the
ranks), ``pm.sample_posterior_predictive`` and ``pm.sample_prior_predictive``
(drawn with the original's graph), and the copy's log-density still one call of
the ranks in every compiling mode."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import pytensor  # noqa: E402
from pytensor.compile.mode import Mode  # noqa: E402
from test_pymc import N_RANKS, float64_session  # noqa: E402

from synkhronos.pymc import data_parallel  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402
from synkhronos.pymc._observed import RowsPointwise, SplitObserved  # noqa: E402
from synkhronos.pymc._op import RowsLogp  # noqa: E402

N = 1001  # uneven over 2 ranks


@pytest.fixture(scope="module")
def session():
    with float64_session(N_RANKS):
        yield


def logistic_with_dims(n=N, seed=0):
    """A logistic regression whose rows have a named dimension and coordinates."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ [0.5, -1.0, 0.2] + 0.3)))).astype("int64")
    with pm.Model(coords={"obs": 1000 + np.arange(n)}) as m:
        xd = pm.Data("x", x, dims=("obs", "feature"))
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1, shape=3)
        pm.Bernoulli("y", logit_p=a + xd @ b, observed=y, dims="obs")
    return m


def normal_of_rows_of_three(n=N, seed=1):
    """Three values per row: the observed variable has an axis after the rows."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    y = 0.5 + 2.0 * x[:, None] + rng.standard_normal((n, 3))
    with pm.Model() as m:
        xd = pm.Data("x", x)
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", a + b * xd[:, None], s, observed=y)
    return m


def several_terms(n=N, seed=9):
    """Two observed variables over the same rows, one parameter each and one
    shared, and a likelihood written as a potential over them (split where
    ``observed=`` names it)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    with pm.Model(coords={"obs": np.arange(n)}) as m:
        xd = pm.Data("x", x, dims="obs")
        wd = pm.Data("w", 0.5 * x + rng.standard_normal(n), dims="obs")
        a = pm.Normal("a", 0, 2)
        b = pm.Normal("b", 0, 1)
        s = pm.HalfNormal("s", 1)
        c = pm.Normal("c", 0, 1)
        pm.Normal("y", a + b * xd, s, observed=1.0 + 2.0 * x + rng.standard_normal(n), dims="obs")
        pm.Poisson("z", pm.math.exp(c + b * xd), observed=rng.poisson(np.exp(0.3 + 0.5 * x)), dims="obs")
        pm.Potential("ll", pm.math.sum(pm.logp(pm.Normal.dist(c * xd, 1), wd)))
    return m


SEVERAL = ["y", "z", "ll"]
MODELS = {"logistic, dims": logistic_with_dims, "normal, 3 per row": normal_of_rows_of_three}


def draws(model, n=40, seed=3):
    """A posterior group of 2 chains of ``n`` draws each: the prior's, as
    ``pm.sample`` would lay them out (the functions under test only read them)."""
    import arviz as az

    names = [v.name for v in model.free_RVs]
    prior = pm.sample_prior_predictive(draws=2 * n, model=model, random_seed=seed, var_names=names).prior
    values = {k: prior[k].values.reshape((2, n) + prior[k].shape[2:]) for k in names}
    try:
        return az.from_dict(posterior=values)  # ArviZ 0.x
    except TypeError:
        return az.from_dict({"posterior": values})  # ArviZ 1.x


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_compute_log_likelihood_on_the_copy_is_pymcs_and_runs_on_the_ranks(session, make):
    model = make()
    split = data_parallel(model)
    assert isinstance(split["y"].owner.op, SplitObserved)
    idata = draws(model)
    ours = pm.compute_log_likelihood(idata, model=split, extend_inferencedata=False, progressbar=False)
    theirs = pm.compute_log_likelihood(idata, model=model, extend_inferencedata=False, progressbar=False)
    assert ours["y"].dims == theirs["y"].dims and ours["y"].shape == theirs["y"].shape
    for d in theirs["y"].dims:
        np.testing.assert_array_equal(ours[d].values, theirs[d].values)
    np.testing.assert_allclose(ours["y"].values, theirs["y"].values, rtol=1e-9)
    assert rows_op_of(split)[0].per_row is not None  # the ranks' function per row computed them


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_posterior_predictive_on_the_copy_draws_as_the_original(session, make):
    model = make()
    split = data_parallel(model)
    idata = draws(model)
    ours = pm.sample_posterior_predictive(idata, model=split, random_seed=5, progressbar=False)
    theirs = pm.sample_posterior_predictive(idata, model=model, random_seed=5, progressbar=False)
    again = pm.sample_posterior_predictive(idata, model=split, random_seed=5, progressbar=False)
    y = ours.posterior_predictive["y"]
    assert y.dims == theirs.posterior_predictive["y"].dims
    np.testing.assert_array_equal(y.values, theirs.posterior_predictive["y"].values)
    np.testing.assert_array_equal(y.values, again.posterior_predictive["y"].values)


@pytest.mark.parametrize("several", [False, True], ids=["one term", "several terms"])
def test_prior_predictive_on_the_copy_draws_as_the_original(session, several):
    model = several_terms() if several else logistic_with_dims()
    split = data_parallel(model, observed=SEVERAL if several else None)
    ours = pm.sample_prior_predictive(draws=50, model=split, random_seed=7)
    theirs = pm.sample_prior_predictive(draws=50, model=model, random_seed=7)
    for v in split.observed_RVs:
        y = ours.prior_predictive[v.name]
        assert y.dims == theirs.prior_predictive[v.name].dims and y.shape == (1, 50, N)
        np.testing.assert_array_equal(y.values, theirs.prior_predictive[v.name].values)
    for v in split.free_RVs:
        np.testing.assert_array_equal(ours.prior[v.name].values, theirs.prior[v.name].values)


@pytest.mark.parametrize("several", [False, True], ids=["one term", "several terms"])
@pytest.mark.parametrize("mode", ["default", "FAST_COMPILE", "NUMBA"])
def test_the_copys_log_density_is_one_call_of_the_ranks_in_every_mode(session, mode, several):
    if mode == "NUMBA":
        pytest.importorskip("numba")
    model = several_terms() if several else logistic_with_dims()
    split = data_parallel(model, observed=SEVERAL if several else None)
    logp = split.logp()
    outputs = [logp] + pytensor.grad(logp, split.value_vars)
    fn = pytensor.function(split.value_vars, outputs, mode=None if mode == "default" else Mode(linker={
        "FAST_COMPILE": "py", "NUMBA": "numba"}[mode], optimizer={"FAST_COMPILE": "fast_compile",
                                                                   "NUMBA": "fast_run"}[mode]))
    ops = [type(node.op) for node in fn.maker.fgraph.toposort()]
    assert ops.count(RowsLogp) == 1 and RowsPointwise not in ops, ops
    point = {k: v + 0.1 for k, v in model.initial_point().items()}
    got = fn(*[point[v.name] for v in split.value_vars])
    expected = [model.compile_logp()(point)] + list(model.compile_dlogp()(point))
    np.testing.assert_allclose(np.concatenate([np.ravel(g) for g in got]), expected, rtol=1e-9)


def test_rows_weighted_one_by_one_have_no_gradient_and_say_so(session):
    split = data_parallel(logistic_with_dims())
    (per_row,) = split.logp(vars=[split["y"]], sum=False)
    weights = pytensor.shared(np.linspace(0, 1, N))
    with pytest.raises(Exception, match="weighted row by row"):
        pytensor.grad((weights * per_row).sum(), split.value_vars)


def test_several_split_terms_are_each_the_originals_variable(session):
    """Each split observed variable stays one, each split potential a potential,
    and each term's log-density and its gradient alone are the original's."""
    model = several_terms()
    split = data_parallel(model, observed=SEVERAL)
    assert [v.name for v in split.observed_RVs] == ["y", "z"] and [p.name for p in split.potentials] == ["ll"]
    point = {k: v + 0.1 for k, v in model.initial_point().items()}
    for names in (["y"], ["z"], ["ll"], ["z", "ll"], None):
        ours = split.logp(vars=None if names is None else [split[v] for v in names])
        theirs = model.logp(vars=None if names is None else [model[v] for v in names])
        got, expected = [pytensor.function(m.value_vars, [lp] + pytensor.grad(lp, m.value_vars,
                                                                              disconnected_inputs="ignore"))
                         for m, lp in ((split, ours), (model, theirs))]
        np.testing.assert_allclose(np.hstack(got(**{v.name: point[v.name] for v in split.value_vars})),
                                   np.hstack(expected(**{v.name: point[v.name] for v in model.value_vars})),
                                   rtol=1e-9, err_msg=str(names))


def test_several_split_terms_log_likelihood_and_posterior_predictive(session):
    model = several_terms()
    split = data_parallel(model, observed=SEVERAL)
    idata = draws(model, n=5)
    ours = pm.compute_log_likelihood(idata, model=split, extend_inferencedata=False, progressbar=False)
    theirs = pm.compute_log_likelihood(idata, model=model, extend_inferencedata=False, progressbar=False)
    assert sorted(ours.data_vars) == sorted(theirs.data_vars) == ["y", "z"]
    for v in ("y", "z"):
        assert ours[v].dims == theirs[v].dims
        np.testing.assert_allclose(ours[v].values, theirs[v].values, rtol=1e-9)
    ours = pm.sample_posterior_predictive(idata, model=split, random_seed=5, progressbar=False)
    theirs = pm.sample_posterior_predictive(idata, model=model, random_seed=5, progressbar=False)
    for v in ("y", "z"):
        np.testing.assert_array_equal(ours.posterior_predictive[v], theirs.posterior_predictive[v])


# Each rank's rows come back inline up to 64 KiB (8,192 float64 values) and through shared memory
# above: row counts on both sides of it at 2 ranks (16,384 rows: 8,192 each; 16,385: one rank
# 8 bytes over), and 1 row (a rank with none).
@pytest.mark.parametrize("n", [1, 16_384, 16_385, 40_001])
def test_log_likelihood_per_row_across_the_inline_size(session, n):
    model = logistic_with_dims(n)
    split = data_parallel(model)
    idata = draws(model, n=3)
    ours = pm.compute_log_likelihood(idata, model=split, extend_inferencedata=False, progressbar=False)
    theirs = pm.compute_log_likelihood(idata, model=model, extend_inferencedata=False, progressbar=False)
    assert ours["y"].shape == (2, 3, n)
    np.testing.assert_allclose(ours["y"].values, theirs["y"].values, rtol=1e-9)


def test_log_likelihood_per_row_from_threads_at_once(session):
    """Threads (a notebook's, a server's) asking for rows at once: each gets its own point's."""
    from concurrent.futures import ThreadPoolExecutor

    model = logistic_with_dims()
    split = data_parallel(model)
    (per_row,) = split.logp(vars=[split["y"]], sum=False)
    theirs = model.compile_fn(model.logp(vars=[model["y"]], sum=False)[0], inputs=model.value_vars)
    start = model.initial_point()
    points = [{k: v + 0.05 * i for k, v in start.items()} for i in range(4)]
    # Each thread its own compiled function, as each chain has, compiled here first: compiling
    # in one thread while another makes the ranks' function per row is not safe yet (the note
    # of issue 59 says what was seen).
    fns = [split.compile_fn(per_row, inputs=split.value_vars) for _ in points]

    def thread(i):
        return [fns[i](points[i]) for _ in range(5)]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(thread, range(len(points))))
    for p, g in zip(points, got):
        for values in g:
            np.testing.assert_allclose(values, theirs(p), rtol=1e-9)


def _per_row_in_child(fn, point, conn):
    try:
        fn(point)
        conn.send("no error")
    except Exception as exc:  # what the child saw, for the parent to check
        conn.send("%s: %s" % (type(exc).__name__, exc))


def test_log_likelihood_per_row_in_a_forked_process_says_where_it_runs(session):
    """A process forked from the session's (as PyMC forks its chains) samples the
    copy through this one, but asks for no rows: a clear error, not a hang."""
    import multiprocessing as mp

    model = logistic_with_dims()
    split = data_parallel(model)
    fn = split.compile_fn(split.logp(vars=[split["y"]], sum=False)[0], inputs=split.value_vars)
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_per_row_in_child, args=(fn, model.initial_point(), child))
    proc.start()
    assert parent.poll(60), "the forked process neither answered nor failed"
    said = parent.recv()
    proc.join(10)
    assert said.startswith("RuntimeError"), said
    assert "computed in the process that called data_parallel" in said, said
