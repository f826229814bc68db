"""Likelihoods as PyMC users write them (in the style of PyMC's example
gallery), split on the ranks and compared with PyMC's own log-density and
gradient at random points; those that cannot be split are refused by name, and
the session goes on.  Runs on both PyMC lines: PyMC 5 (PyTensor 2.38) and
PyMC 6 (PyTensor 3.3)."""

import threading

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import pytensor.tensor as pt  # noqa: E402
from _jax64 import jax_x64  # noqa: E402
from pytensor.graph.basic import Apply  # noqa: E402
from pytensor.graph.op import Op  # noqa: E402
from test_pymc import assert_same_density, float64_session, logistic  # noqa: E402

from synkhronos.pymc import data_parallel  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402

N = 1001  # uneven over 2 ranks


@pytest.fixture(scope="module")
def session():
    with float64_session(2):
        yield


def _rng(seed):
    return np.random.default_rng(seed)


def varying_slopes():
    rng = _rng(1)
    county = rng.integers(0, 6, N)
    floor = rng.integers(0, 2, N).astype(float)
    y = 0.3 * county - 0.5 * floor + rng.standard_normal(N)
    ones = np.ones(N, dtype="int64")  # as bambi writes a group's intercept: times a column of ones
    with pm.Model(coords={"county": np.arange(6), "obs": np.arange(N)}) as m:
        c = pm.Data("county_idx", county, dims="obs")
        f = pm.Data("floor", floor, dims="obs")
        a = pm.Normal("a", 0, 1, dims="county")
        b = pm.Normal("b", 0, 1, dims="county")
        s = pm.Exponential("s", 1)
        pm.Normal("y", a[c] * ones + b[c] * f, s, observed=y, dims="obs")
    return m


def robust():
    rng = _rng(2)
    x = rng.standard_normal(N)
    y = 1 + 2 * x + rng.standard_t(3, N)
    with pm.Model() as m:
        b = pm.Normal("b", 0, 5, shape=2)
        nu = pm.Gamma("nu", 2, 0.1)
        s = pm.HalfNormal("s", 2)
        pm.StudentT("y", nu=nu, mu=b[0] + b[1] * x, sigma=s, observed=y)
    return m


def zero_inflated():
    rng = _rng(3)
    y = np.where(rng.random(N) < 0.3, 0, rng.poisson(2.5, N))
    with pm.Model() as m:
        psi = pm.Beta("psi", 1, 1)
        mu = pm.Gamma("mu", 2, 1)
        pm.ZeroInflatedPoisson("y", psi=psi, mu=mu, observed=y)
    return m


def multinomial_logit():
    rng = _rng(4)
    x = rng.standard_normal((N, 2))
    y = rng.integers(0, 3, N)
    with pm.Model() as m:
        w = pm.Normal("w", 0, 1, shape=(2, 2))
        xd = pm.Data("x", x)  # (zeros of x.shape[0] rows, a constant, would fix the rows: refused)
        eta = pt.concatenate([pt.zeros((xd.shape[0], 1)), xd @ w], axis=1)
        pm.Categorical("y", p=pm.math.softmax(eta, axis=1), observed=y)
    return m


def gamma_glm():
    rng = _rng(5)
    x = rng.standard_normal(N)
    y = rng.gamma(2.0, np.exp(0.3 + 0.2 * x) / 2.0)
    with pm.Model() as m:
        b = pm.Normal("b", 0, 1, shape=2)
        alpha = pm.HalfNormal("alpha", 2)
        pm.Gamma("y", alpha=alpha, beta=alpha / pt.exp(b[0] + b[1] * x), observed=y)
    return m


def binomial_trials():
    rng = _rng(6)
    n = rng.integers(1, 20, N)
    y = rng.binomial(n, 0.3)
    with pm.Model() as m:
        p = pm.Beta("p", 2, 2)
        pm.Binomial("y", n=n, p=p, observed=y)
    return m


def poisson():
    """A count GLM: its log-density takes log(y!) (lgamma) on every row."""
    rng = _rng(17)
    x = rng.standard_normal((N, 2))
    y = rng.poisson(np.exp(0.3 + x @ [0.5, -0.2]))
    with pm.Model() as m:
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0, 1, shape=2)
        a = pm.Normal("a", 0, 1)
        pm.Poisson("y", mu=pm.math.exp(a + xd @ b), observed=y)
    return m


def mvnormal():
    """Rows of 3-dimensional observations, an LKJ Cholesky prior: PyTensor keeps
    Blockwise closures in the compiled graph, which travel by cloudpickle."""
    rng = _rng(7)
    y = rng.standard_normal((N, 3)) @ np.array([[1, 0.3, 0], [0, 1, 0.2], [0, 0, 1]])
    with pm.Model() as m:
        chol, _, _ = pm.LKJCholeskyCov("c", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0), compute_corr=True)
        mu = pm.Normal("mu", 0, 1, shape=3)
        pm.MvNormal("y", mu=mu, chol=chol, observed=y)
    return m


def censored():
    rng = _rng(8)
    x = rng.standard_normal(N)
    y = np.clip(1 + 2 * x + rng.standard_normal(N), -1.0, 3.0)
    with pm.Model() as m:
        b = pm.Normal("b")
        s = pm.HalfNormal("s")
        pm.Censored("y", pm.Normal.dist(b * x, s), lower=-1.0, upper=3.0, observed=y)
    return m


def potential():
    """The likelihood as a potential: a sum over rows of data, as older
    tutorials and custom likelihoods write it."""
    rng = _rng(9)
    x = rng.standard_normal(N)
    y = 0.5 * x + rng.standard_normal(N)
    with pm.Model() as m:
        b = pm.Normal("b")
        s = pm.HalfNormal("s")
        xd, yd = pm.Data("x", x), pm.Data("yd", y)
        pm.Potential("ll", pm.math.sum(pm.logp(pm.Normal.dist(b * xd, s), yd)))
    return m


def normal():
    """The first model of every tutorial: scalar mean and sigma, numpy rows."""
    with pm.Model() as m:
        mu = pm.Normal("mu")
        s = pm.HalfNormal("s")
        pm.Normal("y", mu, s, observed=_rng(16).standard_normal(N))
    return m


def two_likelihoods():
    """Two observed variables with rows of their own: the longer one splits,
    the other is computed in this process."""
    rng = _rng(17)
    with pm.Model() as m:
        mu = pm.Normal("mu")
        s = pm.HalfNormal("s")
        pm.Normal("long", mu, s, observed=rng.standard_normal(N))
        pm.Normal("short", 2 * mu, s, observed=rng.standard_normal(N // 3) + 1)
    return m


def rows_of_three():
    """Observations of three columns per row, a mean and a sigma per column."""
    with pm.Model() as m:
        mu = pm.Normal("mu", shape=3)
        s = pm.HalfNormal("s", shape=3)
        pm.Normal("y", mu, s, observed=_rng(18).standard_normal((N, 3)) + [1, 2, 3])
    return m


def normal_mixture():
    """Two Normal components: the log-density joins the components' along an
    axis and takes their log-sum-exp, as a zero-inflated count's does.
    PyTensor 2.38 (PyMC 5's) vectorizes the graph PyMC derives for the model
    (``conditional_logp``), not the one ``pm.logp`` gives."""
    rng = _rng(20)
    y = np.where(rng.random(N) < 0.3, rng.normal(-2, 1, N), rng.normal(2, 1, N))
    with pm.Model() as m:
        w = pm.Dirichlet("w", np.ones(2))
        mu = pm.Normal("mu", 0, 5, shape=2)
        s = pm.HalfNormal("s", 2, shape=2)
        pm.NormalMixture("y", w=w, mu=mu, sigma=s, observed=y)
    return m


def _pytensor_3():
    """PyTensor 3 (PyMC 6's): converts a multinomial logit's one-point graph to
    JAX as it is (2.38's JAX backend refuses an ``arange`` of a shape not yet
    constant, so by default the copy runs it one point a call there)."""
    import pytensor

    return int(pytensor.__version__.split(".")[0]) >= 3


def deterministics():
    """Deterministics of the parameters in the likelihood, as pymc-marketing's
    BetaGeo model has them (PyMC leaves each a ViewOp in the log-density)."""
    rng = _rng(19)
    x = rng.standard_normal(N)
    y = 1 + 2 * x + 0.5 * rng.standard_normal(N)
    with pm.Model() as m:
        b = pm.Normal("b", 0, 5, shape=2)
        s = pm.HalfNormal("s", 2)
        slope = pm.Deterministic("slope", b[1] * 1.0)
        scale = pm.Deterministic("scale", s * 2.0)
        pm.Normal("y", b[0] + slope * pm.Data("x", x), scale, observed=y)
    return m


def ordered_logistic():
    """Ordinal outcomes: cutpoints under the ordered transform."""
    rng = _rng(21)
    x = rng.standard_normal(N)
    y = np.digitize(0.8 * x + rng.logistic(size=N), [-1.0, 0.0, 1.2])
    with pm.Model() as m:
        b = pm.Normal("b", 0, 1)
        cut = pm.Normal("cut", mu=[-1, 0, 1], sigma=2, shape=3, transform=pm.distributions.transforms.ordered)
        pm.OrderedLogistic("y", eta=b * pm.Data("x", x), cutpoints=cut, observed=y)
    return m


def negative_binomial():
    """An overdispersed count GLM."""
    rng = _rng(22)
    x = rng.standard_normal((N, 2))
    y = rng.negative_binomial(3, 3 / (3 + np.exp(0.5 + x @ [0.3, -0.2])))
    with pm.Model() as m:
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0, 1, shape=2)
        a = pm.Normal("a", 0, 1)
        alpha = pm.Exponential("alpha", 1)
        pm.NegativeBinomial("y", mu=pm.math.exp(a + xd @ b), alpha=alpha, observed=y)
    return m


def weibull_censored():
    """Survival times censored at a limit (a log-survival term past it)."""
    rng = _rng(23)
    x = rng.standard_normal(N)
    t = rng.weibull(1.5, N) * np.exp(0.2 * x)
    limit = np.full(N, 2.0)
    with pm.Model() as m:
        k = pm.Gamma("k", 2, 1)
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Censored("t", pm.Weibull.dist(alpha=k, beta=pm.math.exp(b[0] + b[1] * x)), lower=None,
                    upper=limit, observed=np.minimum(t, limit))
    return m


def zero_sum_groups():
    """Group effects under a zero-sum Normal prior, as bambi and PyMC's gallery write them."""
    rng = _rng(24)
    g = rng.integers(0, 5, N)
    y = 0.4 * (g - 2) + rng.standard_normal(N)
    with pm.Model(coords={"group": np.arange(5)}) as m:
        gd = pm.Data("g", g)
        mu = pm.Normal("mu", 0, 1)
        s_g = pm.HalfNormal("s_g", 1)
        eff = pm.ZeroSumNormal("eff", sigma=s_g, dims="group")
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", mu + eff[gd], s, observed=y)
    return m


def truncated_normal():
    """A Normal truncated below: its normalizing constant on every row, as the
    model derives it (``pm.logp``'s form differs in the last bits)."""
    rng = _rng(25)
    y = np.abs(rng.normal(0.5, 1.0, N))
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 1)
        s = pm.HalfNormal("s", 1)
        pm.Truncated("y", pm.Normal.dist(mu, s), lower=0, observed=y)
    return m


def beta_binomial():
    """Overdispersed successes of a varying number of trials."""
    rng = _rng(26)
    n = rng.integers(1, 30, N)
    y = rng.binomial(n, rng.beta(2, 5, N))
    with pm.Model() as m:
        a = pm.Gamma("a", 2, 0.5)
        b = pm.Gamma("b", 2, 0.5)
        pm.BetaBinomial("y", alpha=a, beta=b, n=n, observed=y)
    return m


def beta_regression():
    """Proportions with a logit-linear mean."""
    rng = _rng(27)
    x = rng.standard_normal(N)
    mu = 1 / (1 + np.exp(-(0.2 + 0.5 * x)))
    y = np.clip(rng.beta(mu * 10, (1 - mu) * 10), 1e-6, 1 - 1e-6)
    with pm.Model() as m:
        b = pm.Normal("b", 0, 1, shape=2)
        kappa = pm.Gamma("kappa", 2, 0.2)
        p = pm.math.invlogit(b[0] + b[1] * x)
        pm.Beta("y", alpha=p * kappa, beta=(1 - p) * kappa, observed=y)
    return m


def hurdle_gamma():
    """Zeros, or a positive amount: a hurdle over a Gamma."""
    rng = _rng(29)
    y = np.where(rng.random(N) < 0.2, 0.0, rng.gamma(2.0, 1.5, N))
    with pm.Model() as m:
        psi = pm.Beta("psi", 2, 2)
        a = pm.Gamma("a", 2, 1)
        b = pm.Gamma("b", 2, 1)
        pm.HurdleGamma("y", psi=psi, alpha=a, beta=b, observed=y)
    return m


MODELS = [varying_slopes, robust, zero_inflated, multinomial_logit, gamma_glm, binomial_trials, mvnormal,
          censored, potential, normal, two_likelihoods, rows_of_three, deterministics, poisson,
          ordered_logistic, negative_binomial, weibull_censored, zero_sum_groups, truncated_normal,
          beta_binomial, beta_regression, hurdle_gamma]


# Graphs with an Op that PyTensor cannot give a leading axis of points: one point at a time.
# (The multinomial logit's shapes taken once per point are one: ``_unlooped.shared_shapes``.)
UNBATCHED = (mvnormal,)
# Graphs the GPU ranks' rows kernel takes (lgamma and digamma by _special's
# series; coefficients sized by the model's dims, at their length when split;
# not the censored Normal's erfc).
KERNEL_MODELS = (normal, two_likelihoods, rows_of_three, potential, deterministics, robust, gamma_glm,
                 binomial_trials, poisson, varying_slopes)
# ... of which these take it with what the rows do not enter computed before it
# (``HoistedKernel``): lgamma and digamma of a parameter.
HOISTED_MODELS = (robust, gamma_glm)


@pytest.mark.parametrize("batch", [False, True], ids=["one_point", "batched"])
@pytest.mark.parametrize("make", MODELS, ids=lambda f: f.__name__)
def test_logp_and_gradient_equal_pymcs(session, make, batch):
    """Each point alone (PyTensor's linkers' default) and in the batched graph
    that JAX ranks run by default (here a batch of one point)."""
    model = make()
    split = data_parallel(model, batch=batch)
    assert rows_op_of(split)[0].evaluator.batched == (batch and make not in UNBATCHED)
    assert_same_density(model, split)


@pytest.mark.parametrize("make", MODELS, ids=lambda f: f.__name__)
def test_the_other_fits_give_the_originals_results(session, make):
    """Prior predictive draws (the same numbers under one seed), ADVI and
    full-rank ADVI (the same loss at every step, or diverging where PyMC's
    does) and the MAP, on the copy."""
    model = make()
    split = data_parallel(model)
    ours = pm.sample_prior_predictive(draws=10, model=split, random_seed=7)
    theirs = pm.sample_prior_predictive(draws=10, model=model, random_seed=7)
    for group in ("prior", "prior_predictive"):
        assert sorted(ours.get(group, {})) == sorted(theirs.get(group, {}))
        for name in theirs.get(group, {}):
            np.testing.assert_array_equal(ours[group][name].values, theirs[group][name].values)
    for method in ("advi", "fullrank_advi"):
        kw = dict(method=method, random_seed=1, progressbar=False)
        try:
            theirs = pm.fit(10, model=model, **kw).hist
        except FloatingPointError:  # (it diverged: an ordinal or a Weibull model, say) so must the copy
            with pytest.raises(FloatingPointError):
                pm.fit(10, model=split, **kw)
            continue
        np.testing.assert_allclose(pm.fit(10, model=split, **kw).hist, theirs, rtol=1e-9, err_msg=method)
    kw = dict(progressbar=False, seed=0, maxeval=50)
    ours, theirs = pm.find_MAP(model=split, **kw), pm.find_MAP(model=model, **kw)
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-6, atol=1e-9, err_msg=name)


class _RanksGraphs:
    """The ranks' graphs of ``model`` as ``data_parallel`` builds them: the
    terms, the graph of one point (``single``, checks compiled), the batched one
    (``stacked`` params -> ``outputs``), and ``points``: the initial point
    shifted by each of ``shifts``, stacked."""

    def __init__(self, model, shifts=(0.0, 0.1, -0.05)):
        from synkhronos.pymc._gradient import parameter_checks
        from synkhronos.pymc._ranks import worker_graph
        from synkhronos.pymc._split import initial_inputs
        from synkhronos.pymc._terms import find_terms
        from synkhronos.pymc._variables import _observed, row_count, rows_of
        from synkhronos.pymc._vectorized import _batched

        chosen = _observed(model, None)
        n = row_count(model, chosen)
        self.terms = find_terms(model, [rv for rv in chosen if rows_of(model, rv) == n], n)
        self.params, self.data, self.shareds, totals, grads = worker_graph(self.terms)
        self.single = parameter_checks(totals + grads, True)
        self.stacked, self.outputs = _batched(self.params, self.single, totals, True)
        start = initial_inputs(model, self.terms)[:len(self.terms.params)]
        self.points = [np.stack([p + s if p.dtype.kind == "f" else p for s in shifts]) for p in start]
        self.data_values = [d.get_value() for d in self.terms.data]


def _batched_graph_values(model, on_gpu, points=None):
    """The ranks' batched graph of ``model`` (for GPU ranks or CPU ranks) at
    ``_RanksGraphs``' points (or ``points``); and its graph.  (Run in the suite's
    mode, PyTensor's Python linker after the fast_compile rewrites: PyTensor's
    JAX mode alone, without the ranks' static shapes, fails on some of these
    graphs at random, and with fast_run's rewrites the Python linker gave the
    multinomial logit's batched gradient to 3e-8 only, where JAX, C and the
    exact gradient agree to 1e-14.)"""
    import pytensor

    from synkhronos._graph.editing import rewritten_in_turn
    from synkhronos.pymc._gpu import GPU_FORMS

    g = _RanksGraphs(model)
    for shared, value in zip(g.shareds, g.terms.row_values):
        shared.set_value(value)
    outputs = rewritten_in_turn(g.outputs, *GPU_FORMS) if on_gpu else g.outputs
    fn = pytensor.function(g.stacked + g.data, outputs)
    return [np.asarray(o) for o in fn(*(g.points if points is None else points), *g.data_values)], outputs


@pytest.mark.parametrize("make", [m for m in MODELS if m not in UNBATCHED], ids=lambda f: f.__name__)
def test_several_points_in_one_pass_give_each_points_values(make):
    """The batched graph at three points at once against the graph of one
    point (what the one-point zoo test checks against PyMC) at each, both in
    the suite's mode (see ``_batched_graph_values``)."""
    import pytensor

    g = _RanksGraphs(make())
    for shared, value in zip(g.shareds, g.terms.row_values):
        shared.set_value(value)
    together = pytensor.function(g.stacked + g.data, g.outputs)(*g.points, *g.data_values)
    one = pytensor.function(g.params + g.data, g.single)
    for k in range(len(g.points[0])):
        alone = one(*[p[k] for p in g.points], *g.data_values)
        assert len(alone) == len(together)
        for t, a in zip(together, alone):
            np.testing.assert_allclose(t[k], a, rtol=1e-10, atol=1e-12, err_msg="point %d" % k)


@pytest.mark.parametrize("make", [m for m in MODELS if m not in UNBATCHED] + [lambda: logistic(N)],
                         ids=lambda f: getattr(f, "__name__", "logistic").replace("<lambda>", "logistic"))
def test_the_gpu_ranks_batched_graph_gives_the_same_values(make):
    """GPU ranks' batched graph writes products with a few features out
    and softplus with one exponential (``synkhronos.pymc._gpu``): the CPU
    ranks' values at three points."""
    from pytensor.graph.traversal import apply_ancestors
    from pytensor.scalar.math import Softplus
    from pytensor.tensor.math import Dot

    from synkhronos.pymc._gpu import OneExpSoftplus

    model = make()
    want, _ = _batched_graph_values(model, on_gpu=False)
    got, outputs = _batched_graph_values(model, on_gpu=True)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    if make.__name__ == "<lambda>":  # the logistic regression's design matrix, its Bernoulli
        nodes = list(apply_ancestors(outputs))
        assert not [n for n in nodes if isinstance(n.op, Dot)], "products written out"
        scalar_ops = [getattr(n.op, "scalar_op", None) for n in nodes]
        softplus = {type(op) for op in scalar_ops if isinstance(op, Softplus)}
        assert softplus == {OneExpSoftplus}, softplus


def _triton_rules():
    """The primitives Pallas lowers to Triton (JAX's own table, private), or
    None where this JAX keeps it elsewhere."""
    lowering = pytest.importorskip("jax._src.pallas.triton.lowering")
    rules = getattr(lowering, "triton_lowering_rules", None)
    return None if rules is None else {p.name for p in rules}


def _rows_kernel_values(model, interpret=True):
    """``_RanksGraphs``' points through the GPU ranks' ``RowsKernel`` (Pallas's
    interpreter on the CPU, or Triton on a GPU; JAX in 64 bits); and whether
    the kernel took the graph (else the batched graph's JAX function)."""
    from synkhronos.pymc._kernel import Kernel, jax_form

    g = _RanksGraphs(model)
    op = _kernel_op(g)
    with jax_x64():
        fn = jax_form(op, interpret=interpret)
        got = fn(*g.points, *g.data_values, *g.terms.row_values)
    got = got if isinstance(got, (tuple, list)) else [got]
    return [np.asarray(g) for g in got], isinstance(fn, Kernel)


# (The censored and truncated Normals' graphs hold erfcx, which PyTensor 2.38's JAX
# backend computes only with tensorflow-probability installed.)
@pytest.mark.parametrize("make", [m for m in MODELS if m not in UNBATCHED + (censored, truncated_normal)]
                         + [lambda: logistic(N)],
                         ids=lambda f: getattr(f, "__name__", "logistic").replace("<lambda>", "logistic"))
def test_the_rows_kernel_gives_the_batched_graphs_values(make):
    """GPU ranks run the batched graph as one kernel over blocks of rows where
    it takes the graph (the logistic regression's, at least), else the batched
    graph: the CPU ranks' values at three points either way."""
    model = make()
    want, _ = _batched_graph_values(model, on_gpu=False)
    got, kernel = _rows_kernel_values(model)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    if make.__name__ == "<lambda>" or make in KERNEL_MODELS:
        assert kernel


@pytest.mark.parametrize("make", KERNEL_MODELS + (lambda: logistic(N),),
                         ids=lambda f: getattr(f, "__name__", "logistic").replace("<lambda>", "logistic"))
def test_the_rows_kernel_holds_only_what_triton_compiles(make):
    """On a GPU, Pallas lowers the kernel to Triton, which has no rule for some
    of JAX's primitives (``copy``, which PyTensor's JAX form of a cast made,
    kept the first model of every tutorial off the kernel) and takes no
    captured constants.  Checked here on its traced body, without a GPU."""
    import jax

    from synkhronos.pymc._kernel import Kernel, jax_form

    lowered = _triton_rules()
    if lowered is None:  # (nothing to check against)
        pytest.skip("this JAX keeps Pallas's Triton lowering rules elsewhere")
    g = _RanksGraphs(make())
    op = _kernel_op(g)
    with jax_x64():
        fn = jax_form(op, interpret=True)
        assert isinstance(fn, Kernel)
        traced = jax.make_jaxpr(fn)(*g.points, *g.data_values, *g.terms.row_values)
    (call,) = [e for e in traced.jaxpr.eqns if e.primitive.name == "pallas_call"]
    body = call.params["jaxpr"]
    assert not body.constvars, "captured constants"
    assert _primitives(body) <= lowered, _primitives(body) - lowered


@pytest.mark.parametrize("make", HOISTED_MODELS, ids=lambda f: f.__name__)
def test_what_the_rows_do_not_enter_is_computed_before_the_kernel(make):
    """A Student-t's and a Gamma's normalizing constants and their gradients
    (lgamma and digamma of a parameter, which in every program made the
    kernel slower than XLA) are computed by XLA before the kernel, once per
    point; the kernel then holds only what Triton compiles, and gives the
    batched graph's values."""
    import jax

    from synkhronos.pymc._kernel import HoistedKernel, _rewritten

    rules = _triton_rules()
    model = make()
    want, _ = _batched_graph_values(model, on_gpu=False)
    g = _RanksGraphs(model)
    op = _kernel_op(g)
    with jax_x64():
        kernel = HoistedKernel(_rewritten(op.single, "JAX"), op.n_params, op.n_data, interpret=True)
        args = (*g.points, *g.data_values, *g.terms.row_values)
        got, traced = kernel(*args), jax.make_jaxpr(kernel)(*args)
    for a, w in zip(got if isinstance(got, (tuple, list)) else [got], want):
        np.testing.assert_allclose(np.asarray(a), w, rtol=1e-10, atol=1e-10)
    (call,) = [e for e in traced.jaxpr.eqns if e.primitive.name == "pallas_call"]
    # (which of the two PyTensor leaves to the parameters alone depends on its version)
    assert {"lgamma", "digamma"} & (_primitives(traced.jaxpr) - _primitives(call.params["jaxpr"]))
    if rules is not None:
        assert _primitives(call.params["jaxpr"]) <= rules


@pytest.mark.parametrize("make, hoisted", [(robust, True), (gamma_glm, True), (poisson, False),
                                           (normal, False)], ids=["robust", "gamma_glm", "poisson", "normal"])
def test_lgamma_of_the_parameters_alone_is_taken_out_of_the_kernel(make, hoisted):
    """Where the parameters alone take lgamma or digamma (a Student-t's and a
    Gamma's normalizing constants), the kernel is ``HoistedKernel`` (computed
    in every program, they made it slower than XLA on an H200); where only the
    rows do (a Poisson's log(y!)), or neither, the kernel as it is."""
    from synkhronos.pymc._kernel import HoistedKernel, Kernel, jax_form

    op = _kernel_op(_RanksGraphs(make()))
    with jax_x64():
        fn = jax_form(op, interpret=True)
    assert isinstance(fn, Kernel) and isinstance(fn, HoistedKernel) == hoisted


def _kernel_op(g):
    from synkhronos._graph.editing import rewritten_in_turn
    from synkhronos.pymc._gpu import GPU_FORMS, ONE_EXP_SOFTPLUS
    from synkhronos.pymc._kernel import rows_kernel

    single, batched = rewritten_in_turn(g.single, *ONE_EXP_SOFTPLUS), rewritten_in_turn(g.outputs, *GPU_FORMS)
    shapes = [p.shape[1:] for p in g.points] + [np.shape(d) for d in g.data_values]  # (as data_parallel's)
    return rows_kernel(g.params, g.data, g.shareds, single, g.stacked, batched, shapes)[0].owner.op


def _primitives(jaxpr):
    """The names of the primitives of ``jaxpr`` and of the jaxprs inside it."""
    found = set()
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for param in eqn.params.values():
            for inner in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    found |= _primitives(inner)
    return found


def test_coefficients_sized_by_the_models_dims_take_the_kernel_at_any_count_of_groups():
    """Varying slopes: a coefficient per county, sized by the model's dims, so
    its type's length is open.  The kernel is tried at its length when split
    (6), and traced again at another (8); past what the kernel's walk picks
    among (``MAX_GROUPS``) the batched graph computes the call instead.  The
    batched graph's values each time."""
    from synkhronos.pymc._blocks import MAX_GROUPS
    from synkhronos.pymc._kernel import Kernel, jax_form

    model = varying_slopes()
    g = _RanksGraphs(model)
    with jax_x64():
        fn = jax_form(_kernel_op(g), interpret=True)
        assert isinstance(fn, Kernel)
        batched, instead = fn.instead(), []
        fn.instead = lambda: instead.append(True) or batched
        for groups, falls_back in ((8, False), (MAX_GROUPS + 1, True)):
            points = [np.pad(p, ((0, 0), (0, groups - p.shape[1])), constant_values=0.2) if p.ndim == 2 else p
                      for p in g.points]
            got = fn(*points, *g.data_values, *g.terms.row_values)
            want, _ = _batched_graph_values(model, on_gpu=False, points=points)
            for a, w in zip(got, want):
                np.testing.assert_allclose(np.asarray(a), w, rtol=1e-10, atol=1e-10)
            assert instead == [True] * falls_back, groups


def test_the_rows_kernel_takes_a_column_of_ones_as_a_constant():
    """bambi's ``1|group`` term multiplies its coefficients by a column of ones,
    which the ranks hold as a constant repeated over the rows (``_rowdata``):
    the kernel takes that graph, with the batched graph's values."""
    rng = _rng(14)
    g, x = rng.integers(0, 3, N), rng.standard_normal(N)
    with pm.Model() as model:
        u = pm.Normal("u", 0, 1, shape=3)
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=u[g] * np.ones(N, dtype="int64") + b * x, observed=rng.integers(0, 2, N))
    want, _ = _batched_graph_values(model, on_gpu=False)
    got, kernel = _rows_kernel_values(model)
    assert kernel
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_missing_values_split_the_observed_rows_and_keep_the_imputed_ones(session):
    """PyMC imputes missing observed values: the observed rows split, the
    imputed ones stay free variables of the copy, and the whole variable (a
    deterministic of both) is the same."""
    rng = _rng(10)
    x = rng.standard_normal(N)
    y = 0.5 * x + rng.standard_normal(N)
    y[::7] = np.nan
    with pytest.warns(pm.ImputationWarning), pm.Model() as model:
        b = pm.Normal("b")
        s = pm.HalfNormal("s")
        pm.Normal("y", b * x, s, observed=y)
    split = data_parallel(model)
    assert [v.name for v in split.free_RVs] == ["b", "s", "y_unobserved"]
    assert_same_density(model, split)
    point = {k: v + 0.3 for k, v in model.initial_point().items()}
    whole0, whole1 = (_at(m, m["y"], point) for m in (model, split))
    assert np.isnan(y).any() and not np.isnan(whole0).any()
    np.testing.assert_array_equal(whole1, whole0)


def _groups_with_missing():
    """The mean indexes group parameters by each row's group (a constant) and
    reads a covariate as pm.Data."""
    rng = _rng(14)
    g = rng.integers(0, 4, N)
    x = rng.standard_normal(N)
    y = 0.3 * g + 0.5 * x + rng.standard_normal(N)
    y[rng.random(N) < 0.1] = np.nan
    with pytest.warns(pm.ImputationWarning), pm.Model() as model:
        a = pm.Normal("a", 0, 1, shape=4)
        b = pm.Normal("b")
        s = pm.HalfNormal("s")
        pm.Normal("y", a[g] + b * pm.Data("x", x), s, observed=y)
    return model


def _design_matrix_with_missing():
    """The mean is a design matrix (pm.Data) times coefficients, written with @."""
    rng = _rng(15)
    x = rng.standard_normal((N, 3))
    y = x @ [0.3, -0.2, 0.5] + rng.standard_normal(N)
    y[::9] = np.nan
    with pytest.warns(pm.ImputationWarning), pm.Model() as model:
        w = pm.Normal("w", 0, 1, shape=3)
        s = pm.HalfNormal("s")
        pm.Normal("y", pm.Data("x", x) @ w, s, observed=y)
    return model


@pytest.mark.parametrize("make", [_groups_with_missing, _design_matrix_with_missing],
                         ids=["groups", "matrix"])
def test_missing_values_with_covariates_split(session, make):
    """The mask's selection is taken through the group index and the matrix
    product, down to the data."""
    model = make()
    assert_same_density(model, data_parallel(model))


def _at(model, var, point):
    (var,) = model.replace_rvs_by_values([var])
    fn = model.compile_fn(var, inputs=model.value_vars, on_unused_input="ignore", point_fn=False)
    return fn(*[point[v.name] for v in model.value_vars])


def custom_dist():
    rng = _rng(11)

    def dist(mu, sigma, size):
        return mu + sigma * pm.Normal.dist(size=size)

    with pm.Model() as m:
        mu = pm.Normal("mu")
        s = pm.HalfNormal("s")
        pm.CustomDist("y", mu, s, dist=dist, observed=rng.standard_normal(N))
    return m


def a_potential_not_over_rows():
    with pm.Model() as m:
        b = pm.Normal("b")
        pm.Potential("ll", -(b ** 2))
    return m


class _Locked(Op):
    """An elementwise identity holding a lock: neither pickle nor cloudpickle copies it."""

    def __init__(self):
        self.lock = threading.Lock()

    def make_node(self, x):
        x = pt.as_tensor(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = inputs[0].copy()

    def pullback(self, inputs, outputs, grads):
        return grads

    L_op = pullback


def unsendable():
    rng = _rng(12)

    def logp(value, mu):
        return -0.5 * (_Locked()(value) - mu) ** 2

    with pm.Model() as m:
        mu = pm.Normal("mu")
        pm.CustomDist("y", mu, logp=logp, observed=rng.standard_normal(N))
    return m


def a_draw_in_the_likelihood():
    """A parameter that is a random variable but not a free one of the model:
    PyMC would evaluate it as a fresh draw."""
    with pm.Model() as m:
        pm.Normal("y", mu=pm.Normal.dist(), sigma=1.0, observed=_rng(13).standard_normal(N))
    return m


@pytest.mark.parametrize("batch", [False, True], ids=["one_point", "batched"])
def test_a_shape_pinned_without_a_row_count_splits(session, batch):
    """A logistic regression on one column of ``pm.Data`` (an n x 1 matrix), as
    the docs' LOO example compares: PyMC's route pins a shape there whose
    leading length is None, not the row count."""
    model = logistic(N, features=1)
    assert_same_density(model, data_parallel(model, batch=batch))


def test_a_mixture_is_batched_and_gives_pymcs_logp_and_gradient(session):
    """A Normal mixture's components, joined and log-sum-exped, take a leading
    axis of points (``_unlooped.unlooped_axes``), on PyTensor 2.38 too: PyMC's
    values."""
    model = normal_mixture()
    split = data_parallel(model, batch=True)
    assert rows_op_of(split)[0].evaluator.batched
    assert_same_density(model, split)


@pytest.mark.parametrize("make, match", [
    (custom_dist, "'y': the log-density cannot be computed on part of the rows.*fixes the number of rows"),
    (a_potential_not_over_rows, "no observed variables, nor a potential that sums over rows"),
    (unsendable, "'y': its log-density graph cannot be sent to the ranks.*lock"),
    (a_draw_in_the_likelihood, "'y': its log-density depends on random variable .*not a free variable"),
], ids=["custom_dist", "potential", "unsendable", "draw"])
def test_what_cannot_be_split_is_named_and_the_session_goes_on(session, make, match):
    with pytest.raises(ValueError, match=match):
        data_parallel(make())
    model = logistic(101)  # nothing of the refused model was left registered
    assert_same_density(model, data_parallel(model))


_ON_JAX_RANKS = """
import sys
import numpy as np
import synkhronos as synk
from synkhronos.pymc import data_parallel
from synkhronos.pymc._loo import rows_op_of
import test_pymc_zoo as zoo
from test_pymc import assert_same_density

synk.fork(2, use_gpu=False)
for name in sys.argv[1:]:
    model = getattr(zoo, name)()
    split = data_parallel(model)
    ev = rows_op_of(split)[0].evaluator
    assert type(ev.fn._core.plain.maker.linker).__name__ == "JAXLinker" and ev.batched, name
    assert ev.packing is not None, name  # one matrix of points in, one of results out
    seen, evaluate = {}, ev.evaluate  # (each point PyMC asks for, for one pass of them all below)
    ev.evaluate = lambda xs: seen.setdefault(tuple(np.asarray(x).tobytes() for x in xs),
                                             [np.asarray(x) for x in xs]) and evaluate(xs)
    # (XLA's digamma, in the Gamma's gradient, is PyMC's to 1.3e-9)
    assert_same_density(model, split, rtol=1e-8 if name == "gamma_glm" else 1e-9)
    together, points = ev.run(list(seen.values())), list(seen.values())
    assert len(points) == 3, name
    for p, t in zip(points, together):
        for a, b in zip(ev.run([p])[0], t):
            np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12, err_msg=name)
    print("ok", name, flush=True)
synk.close()
"""


def test_batched_graphs_on_jax_ranks_as_users_get_them(tmp_path):
    """With PyTensor's own defaults, not the suite's flags (CPU ranks
    compile with JAX, points batched): the models whose batched graph asserted
    one row per rank (a Normal with a scalar sigma, alone, beside a shorter
    likelihood, or over rows of three columns), took minutes to build (a
    Gamma GLM) or was not batched (a zero-inflated count, a Normal mixture, a
    multinomial logit) give PyMC's logp and gradient, and the points PyMC asked
    for, in one pass, each point's own."""
    import os
    import subprocess
    import sys

    pytest.importorskip("jax")
    names = ["normal", "two_likelihoods", "rows_of_three", "gamma_glm", "zero_inflated", "normal_mixture"]
    names += ["multinomial_logit"] * _pytensor_3()
    env = {k: v for k, v in os.environ.items() if k != "PYTENSOR_FLAGS"}
    here = os.path.dirname(os.path.abspath(__file__))  # (and tests/, as pytest's pythonpath has them)
    env["PYTHONPATH"] = os.pathsep.join([here, os.path.dirname(here), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _ON_JAX_RANKS, *names], capture_output=True, text=True,
                          timeout=480, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.split() == [w for n in names for w in ("ok", n)]
