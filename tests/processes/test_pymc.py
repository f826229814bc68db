"""synkhronos.pymc.data_parallel against PyMC itself: the returned model's
log-density and gradient equal the original's at random points (split at
several row counts, uneven ones included), the original is left as it was,
PyMC's own functions run on it, and terms that cannot be split are refused."""

import contextlib

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
from pytensor.compile.mode import Mode  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos.pymc import data_parallel  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402
from synkhronos.pymc._observed import SplitObserved  # noqa: E402

N_RANKS = 2
RTOL = 1e-9


@contextlib.contextmanager
def float64_session(n, use_gpu=False):
    """A session of ``n`` ranks in float64, PyMC's own precision (PyMC users do not
    set floatX: PyTensor's default is float64, which fork() keeps).  The flag is
    put back afterwards, as another module may run next in this process."""
    was = pytensor.config.floatX
    pytensor.config.floatX = "float64"
    synk.close()
    try:
        synk.fork(n, use_gpu=use_gpu)
        assert pytensor.config.floatX == "float64"
        yield
    finally:
        synk.close()
        pytensor.config.floatX = was


@pytest.fixture(scope="module")
def session():
    with float64_session(N_RANKS):
        yield


def logistic(n, seed=0, features=3):
    """Logistic regression over ``n`` rows of ``pm.Data`` (the issue's model),
    of ``features`` columns (at most 3)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features))
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ [0.5, -1.0, 0.2][:features] + 0.3)))).astype("int64")
    with pm.Model() as m:
        xd = pm.Data("x", x)
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1, shape=features)
        pm.Bernoulli("y", logit_p=a + xd @ b, observed=y)
    return m


def hierarchical(n, groups=5, seed=1):
    """Hierarchical normal regression: group intercepts indexed by row data, a
    noise scale with a log transform, an observed numpy array (a constant)."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    x = rng.standard_normal(n)
    y = 0.5 * g - 0.7 * x + rng.standard_normal(n)
    with pm.Model() as m:
        gd = pm.Data("g", g)
        xd = pm.Data("x", x)
        mu = pm.Normal("mu", 0, 2)
        tau = pm.HalfNormal("tau", 1)
        alpha = pm.Normal("alpha", mu, tau, shape=groups)
        beta = pm.Normal("beta", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Deterministic("beta2", 2 * beta)
        pm.Normal("y", alpha[gd] + beta * xd, sigma, observed=y)
    return m


def points(model, k, seed=2):
    """``k`` random points around the model's initial point."""
    rng = np.random.default_rng(seed)
    start = model.initial_point()
    return [{n: v + 0.5 * rng.standard_normal(v.shape) for n, v in start.items()} for _ in range(k)]


def assert_same_density(orig, split, rtol=RTOL):
    # The same free variables in the same order: the default dlogp lines up.
    assert [v.name for v in split.value_vars] == [v.name for v in orig.value_vars]
    logp0, logp1 = orig.compile_logp(), split.compile_logp()
    d0, d1 = orig.compile_dlogp(), split.compile_dlogp()
    for p in points(orig, 3):
        np.testing.assert_allclose(logp1(p), logp0(p), rtol=rtol)
        np.testing.assert_allclose(d1(p), d0(p), rtol=rtol, atol=1e-9)
    op = rows_op_of(split)[0]
    assert sum(op.evaluator.batcher.sizes.values()) > 0  # computed on the ranks of this session


@pytest.mark.parametrize("make, n", [(logistic, 1001), (hierarchical, 20_000), (logistic, 3)])
def test_logp_and_gradient_equal_pymcs(session, make, n):
    model = make(n)
    assert_same_density(model, data_parallel(model))


def formula_names(n, groups=6, seed=7):
    """A logistic GLMM with varying intercepts and slopes named as bambi names them
    (``1|group_sigma``, ``x1|group_offset``): names that are not identifiers."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    x = rng.standard_normal(n)
    y = (rng.random(n) < 0.5).astype("int64")
    with pm.Model(coords={"group": np.arange(groups)}) as m:
        gd = pm.Data("group_idx", g)
        xd = pm.Data("x1", x)
        a = pm.Normal("Intercept", 0, 1)
        b = pm.Normal("x1_coef", 0, 1)
        a_sd = pm.HalfNormal("1|group_sigma", 1)
        a_off = pm.Normal("1|group_offset", 0, 1, dims="group")
        b_sd = pm.HalfNormal("x1|group_sigma", 1)
        b_off = pm.Normal("x1|group_offset", 0, 1, dims="group")
        eta = a + a_off[gd] * a_sd + (b + b_off[gd] * b_sd) * xd
        pm.Bernoulli("y", logit_p=eta, observed=y)
    return m


def test_parameter_names_that_are_not_identifiers_split_batched(session):
    """bambi's names (``1|group_sigma``) once made the batched graph's inputs fail
    (PyTensor read the name as a dtype string)."""
    model = formula_names(1003)
    split = data_parallel(model, batch=True)
    assert rows_op_of(split)[0].evaluator.batched
    assert_same_density(model, split)


def test_original_model_is_left_as_it_was(session):
    model = hierarchical(501)
    before = model.compile_logp()(model.initial_point())
    x_before = model["x"].get_value().copy()
    split = data_parallel(model)
    assert model.compile_logp()(model.initial_point()) == before
    np.testing.assert_array_equal(model["x"].get_value(), x_before)
    assert [v.name for v in model.observed_RVs] == ["y"]
    # The copy keeps y an observed variable, drawn forward as the original draws it, its
    # log-density the ranks'.
    assert [v.name for v in split.observed_RVs] == ["y"] and split.potentials == []
    assert isinstance(split["y"].owner.op, SplitObserved)


def test_works_after_other_functions_were_distributed(session):
    s = pytensor.shared(np.arange(3.0), name="s")
    v = pt.vector("v")
    f = synk.function([v], v.sum() + s.sum(), )
    synk.distribute()
    model = logistic(257)
    assert_same_density(model, data_parallel(model))  # distributes again, by itself
    np.testing.assert_allclose(f(synk.data(np.ones(4))), 2 + 3)


def test_find_map_agrees(session):
    model = hierarchical(2000)
    kw = dict(progressbar=False, seed=0)
    m0 = pm.find_MAP(model=model, **kw)
    m1 = pm.find_MAP(model=data_parallel(model), **kw)
    for name in ("mu", "alpha", "beta", "sigma"):
        np.testing.assert_allclose(m1[name], m0[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["advi", "fullrank_advi"])
def test_variational_fit_follows_the_same_loss(session, method):
    """``pm.fit`` on the copy: the same loss at every step under one seed."""
    model = hierarchical(3000)
    kw = dict(method=method, random_seed=1, progressbar=False)
    plain = pm.fit(150, model=model, **kw)
    split = pm.fit(150, model=data_parallel(model), **kw)
    np.testing.assert_allclose(split.hist, plain.hist, rtol=1e-9)
    assert len(split.hist) == 150 and np.all(np.isfinite(split.hist))


def test_sample_with_pymcs_default_processes_runs_in_this_process(session, caplog):
    model = data_parallel(logistic(400))
    with model:
        idata = pm.sample(draws=30, tune=30, chains=2, cores=2, progressbar=False, random_seed=3,
                          compute_convergence_checks=False)
    assert idata.posterior["b"].shape == (2, 30, 3)
    assert np.all(np.isfinite(idata.posterior["b"].values))


def test_float64_stays_float64(session):
    split = data_parallel(logistic(100))
    assert split.compile_logp()(split.initial_point()).dtype == np.float64


def test_a_term_that_couples_rows_is_refused(session):
    rng = np.random.default_rng(0)
    with pm.Model() as m:
        xd = pm.Data("x", rng.standard_normal(200))
        s = pm.HalfNormal("s")
        pm.Normal("y", pt.cumsum(xd), s, observed=rng.standard_normal(200))
    with pytest.raises(ValueError, match="'y'.*depends on other rows"):
        data_parallel(m)


def test_a_likelihood_over_all_rows_is_refused(session):
    rng = np.random.default_rng(0)
    with pm.Model() as m:
        rho = pm.Uniform("rho", -0.9, 0.9)
        pm.AR("y", rho=[rho], sigma=1.0, constant=False, init_dist=pm.Normal.dist(), steps=199,
              observed=rng.standard_normal(200))
    with pytest.raises(ValueError, match="'y'.*not one value per row"):
        data_parallel(m)


def test_minibatch_data_are_refused_or_left_here(session):
    """``pm.Minibatch`` draws its rows at every evaluation: refused where it is
    the only observed variable or named, left to this process by default
    beside others (those split)."""
    from synkhronos.pymc._observed import SplitObserved

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((500, 2)), rng.standard_normal(500)
    with pm.Model() as m:
        xb, yb = pm.Minibatch(x, y, batch_size=50)
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Normal("mb", xb @ b, 1.0, observed=yb, total_size=500)
    with pytest.raises(ValueError, match="'mb': its data are drawn at random.*pm.Minibatch"):
        data_parallel(m)
    with m:
        pm.Normal("y", pm.Data("x", x) @ b, 1.0, observed=y)
    with pytest.raises(ValueError, match="'mb': its data are drawn at random"):
        data_parallel(m, observed=["mb", "y"])
    copy = data_parallel(m)
    assert isinstance(copy["y"].owner.op, SplitObserved)
    assert not isinstance(copy["mb"].owner.op, SplitObserved)


def test_a_model_pymc_cannot_copy_is_refused_before_splitting(session):
    """PyMC's copy of a model asserts that every dim is a name; pm.Data allows
    None among them."""
    with pm.Model(coords={"feature": ["a", "b"]}) as m:
        xd = pm.Data("x", np.ones((50, 2)), dims=(None, "feature"))
        b = pm.Normal("b", 0, 1, dims="feature")
        pm.Normal("y", xd @ b, 1.0, observed=np.zeros(50))
    with pytest.raises(ValueError, match=r"cannot copy 'x' with dims=\(None, 'feature'\): name every"):
        data_parallel(m)


def test_bad_arguments_are_named(session):
    with pytest.raises(TypeError, match="model must be a pymc.Model"):
        data_parallel("model")
    model = logistic(50)
    with pytest.raises(ValueError, match="observed: 'b' is not an observed variable"):
        data_parallel(model, observed=["b"])
    with pytest.raises(TypeError, match="observed must be a list"):
        data_parallel(model, observed="y")
    with pytest.raises(ValueError, match="rows must be a positive int, got 0"):
        data_parallel(model, rows=0)


def test_benchmark_runs_at_its_smallest_and_writes_json_and_png(tmp_path):
    """benchmarks/pymc_likelihood.py (it checks logp against PyMC's itself), its
    sampling rows too: pm.sample with 2 forked chains and nutpie, each on the
    plain model and on the copy, and the copy per evaluation against JAX."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "benchmarks", "pymc_likelihood.py")
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, script, "--models", "logistic", "--rows", "3000", "--ranks", "1,2",
                           "--evals", "3", "--sample", "--sample-rows", "500", "--tune", "30",
                           "--draws", "30", "--cores", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["model"], r["ranks"]) for r in result["likelihood"]] == [("logistic", 1), ("logistic", 2)]
    assert all(r["logp_rel_err"] < 1e-9 and r["synk_ms"] > 0 for r in result["likelihood"])
    sampled = {s["sampler"]: s for s in result["sampling"]}
    want = ["pm.sample"] + (["nutpie"] if importlib.util.find_spec("nutpie") else [])
    assert list(sampled) == want
    assert sampled["pm.sample"]["cores"] == 2
    assert sampled["pm.sample"]["mp_ctx"] in ("fork", "forkserver", "spawn")
    for s in sampled.values():
        assert s["plain_s"] > 0 and s["synk_s"] > 0 and s["max_mean_diff_in_sd"] < 0.5, s
        assert s["plain_steps_per_draw"] >= 1 and s["synk_steps_per_draw"] >= 1, s
        evaluated = sum(int(n) * k for n, k in s["batch_sizes"].items())
        assert evaluated >= 2 * 60, "every step of both chains, on the ranks"
    if importlib.util.find_spec("jax"):
        assert [(r["points"], r["copy_path"]) for r in result["jax_per_eval"]] == [
            (1, "logp_dlogp_function"), (4, "4 threads at once"), (4, "one run of the ranks")]
        assert all(r["jax_logp_rel_err"] < 1e-9 and r["jax_ms"] > 0 and r["jax_host_ms"] > 0
                   for r in result["jax_per_eval"])
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    assert "speedup" in proc.stdout and "max |dmean|/sd" in proc.stdout
    assert result["benchmark"] == "pymc_likelihood"  # benchmarks/plot.py redraws it
    (tmp_path / "b.png").unlink()
    redraw = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "plot.py"), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert redraw.returncode == 0 and (tmp_path / "b.png").is_file(), redraw.stderr


MPI_SCRIPT = """
import numpy as np, pymc as pm, pytensor, synkhronos as synk
from synkhronos.pymc import data_parallel
from synkhronos.pymc._loo import rows_op_of

n = synk.fork()  # every MPI rank runs this; rank 0 returns as the master
rng = np.random.default_rng(0)
x = rng.standard_normal((1001, 3))
y = (rng.random(1001) < 0.4).astype("int64")
with pm.Model() as m:
    xd = pm.Data("x", x)
    a = pm.Normal("a", 0, 1)
    b = pm.Normal("b", 0, 1, shape=3)
    pm.Bernoulli("y", logit_p=a + xd @ b, observed=y)
split = data_parallel(m)
logp0, logp1 = m.compile_logp(), split.compile_logp()
d0, d1 = m.compile_dlogp(), split.compile_dlogp()
for k in range(3):
    p = {name: v + 0.5 * rng.standard_normal(v.shape) for name, v in m.initial_point().items()}
    np.testing.assert_allclose(logp1(p), logp0(p), rtol=1e-9)
    np.testing.assert_allclose(d1(p), d0(p), rtol=1e-9, atol=1e-9)
assert sum(rows_op_of(split)[0].evaluator.batcher.sizes.values()) > 0
print("equal on", n, "MPI ranks,", pytensor.config.floatX)
synk.close()
"""


def test_logp_and_gradient_equal_pymcs_under_mpi(tmp_path):
    """Four MPI ranks over loopback, every rank its own host (the cross-host paths)."""
    import subprocess
    import sys

    from _mpirun import MPIRUN, mpi_env

    if MPIRUN is None:
        pytest.skip("needs mpi4py and mpirun (synkhronos[mpi])")
    script = tmp_path / "mpi_pymc.py"
    script.write_text(MPI_SCRIPT)
    proc = subprocess.run([MPIRUN, "-n", "4", "--oversubscribe", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300,
                          env=mpi_env(SYNKHRONOS_HOST_PER_RANK="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "equal on 4 MPI ranks, float64" in proc.stdout


def _kinds_data(n=1001, seed=4):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    return x, np.clip(1.0 + 2.0 * x + rng.standard_normal(n), -1.0, 3.0)


def normal_mixture():
    _, y = _kinds_data()
    with pm.Model() as m:
        w = pm.Dirichlet("w", np.ones(2))
        mu = pm.Normal("mu", [-1.0, 1.0], 1.0, shape=2)
        pm.NormalMixture("y", w=w, mu=mu, sigma=1.0, observed=y)
    return m


def mixture():
    _, y = _kinds_data()
    with pm.Model() as m:
        w = pm.Dirichlet("w", np.ones(2))
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Mixture("y", w=w, comp_dists=[pm.Normal.dist(mu, 1.0), pm.StudentT.dist(nu=4, mu=mu, sigma=1.0)],
                   observed=y)
    return m


def custom_logp():
    x, y = _kinds_data()

    def logp(value, mu, sigma):
        return -0.5 * ((value - mu) / sigma) ** 2 - pt.log(sigma)

    with pm.Model() as m:
        b = pm.Normal("b")
        s = pm.HalfNormal("s")
        pm.CustomDist("y", b * x, s, logp=logp, observed=y)
    return m


@pytest.mark.parametrize("make", [normal_mixture, mixture, custom_logp], ids=lambda f: f.__name__)
def test_mixtures_and_custom_logps_split(session, make):
    """Likelihoods that are PyMC symbolic variables (mixtures) or user log-densities."""
    model = make()
    assert_same_density(model, data_parallel(model))


def test_a_parameter_out_of_its_domain_gives_minus_infinity_as_in_pymc(session):
    """PyMC compiles its parameter checks as -inf (not an error): so do the ranks."""
    rng = np.random.default_rng(7)
    with pm.Model() as model:
        s = pm.Normal("s", 1, 1)  # a scale with no transform: negative values are out of its domain
        pm.Normal("y", 0, s, observed=rng.standard_normal(301))
    split = data_parallel(model)
    logp0, logp1 = model.compile_logp(), split.compile_logp()
    for value in (0.7, -0.5):
        np.testing.assert_allclose(logp1({"s": value}), logp0({"s": value}), rtol=RTOL)
    assert logp1({"s": -0.5}) == -np.inf


@pytest.mark.parametrize("batch", [False, True], ids=["one_point", "batched"])
def test_nan_and_infinite_parameters_give_what_pymc_gives(session, batch):
    """The ranks' parameter checks (the Bernoulli's ``0 <= sigmoid(eta) <= 1``)
    give the same log-density as PyMC's at NaN, infinite and saturating
    parameters too, one point at a time and in the batched graph, and the
    gradient PyMC 6 gives: ``x^T (y - sigmoid(eta)) - b``, NaN only at NaN.
    (PyMC 5's is NaN at the last two points: PyTensor 2.38 differentiates
    ``log1p(-sigmoid(eta))`` as ``-s(1-s)/(1-s)``; see ``synkhronos.pymc._gradient``.)"""
    from scipy.special import expit

    rng = np.random.default_rng(8)
    x = rng.standard_normal((401, 2))
    y = (rng.random(401) < 0.5).astype("int64")
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Bernoulli("y", logit_p=pt.as_tensor(x) @ b, observed=y)
    split = data_parallel(model, batch=batch)
    assert rows_op_of(split)[0].evaluator.batched == batch
    # PyMC's as a user compiles it: its FAST_RUN rewrites make log(1 - sigmoid) a softplus,
    # finite where sigmoid saturates (the suite's fast_compile references give -inf there).
    users = dict(mode=Mode(linker="py", optimizer="fast_run"))
    logp0, logp1 = model.compile_logp(**users), split.compile_logp()
    dlogp0, dlogp1 = model.compile_dlogp(**users), split.compile_dlogp()
    for value in ([0.3, -0.2], [np.nan, 0.1], [np.inf, 0.0], [40.0, -40.0]):
        point = {"b": np.array(value)}
        np.testing.assert_allclose(logp1(point), logp0(point), rtol=RTOL)
        with np.errstate(invalid="ignore"):
            want = x.T @ (y - expit(x @ np.array(value))) - np.array(value)
        np.testing.assert_allclose(dlogp1(point), want, rtol=1e-9)
        if np.isfinite(value).all() and np.abs(value).max() < 1:
            np.testing.assert_allclose(dlogp1(point), dlogp0(point), rtol=RTOL)
