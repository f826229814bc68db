"""synkhronos.pymc.data_parallel on one GPU rank: the copy's log-density and
gradient equal PyMC's own (its CPU functions on the same model) at random points,
in float64, and PyMC's sampler runs on it."""

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import test_pymc  # noqa: E402
import test_pymc_zoo as zoo  # noqa: E402
from test_pymc import assert_same_density, float64_session, hierarchical, logistic  # noqa: E402

from synkhronos.pymc import data_parallel  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402
from synkhronos.pymc._pallas import BLOCK, WIDE_BLOCK  # noqa: E402

pytestmark = pytest.mark.gpus(1)


@pytest.fixture(scope="module")
def session():
    """One GPU rank in float64, as a PyMC user has it (floatX put back after)."""
    with float64_session(1, use_gpu=True):
        yield


@pytest.mark.parametrize("make, n", [(logistic, 100_003), (hierarchical, 20_000)])
def test_logp_and_gradient_equal_pymcs_on_a_gpu(session, make, n):
    assert test_pymc.RTOL == 1e-9  # the tolerance, in float64
    model = make(n)
    assert_same_density(model, data_parallel(model))


def test_sample_on_a_gpu_rank(session):
    model = data_parallel(logistic(5000))
    with model:
        idata = pm.sample(draws=50, tune=50, chains=2, progressbar=False, random_seed=3,
                          compute_convergence_checks=False)
    b = idata.posterior["b"].values
    assert b.shape == (2, 50, 3) and np.all(np.isfinite(b))
    np.testing.assert_allclose(b.mean(axis=(0, 1)), [0.5, -1.0, 0.2], atol=0.25)


def test_chains_at_once_batched_on_a_gpu_rank(session):
    """GPU ranks evaluate pending points in one batched pass by default: threads
    at once each get PyMC's numbers for their own point."""
    import test_pymc_chains

    test_pymc_chains.test_threads_at_once_get_their_own_logp_and_gradient(
        (test_pymc_chains.logistic(), None), None)


def test_forked_and_threaded_chains_on_a_gpu_rank(session):
    """pm.sample's forked chains (cores=2) and nutpie's threads on one GPU rank:
    every evaluation on the rank, the posterior of the same chains in this process."""
    import test_pymc_chains as chains

    plain = chains.logistic()
    split = data_parallel(plain)
    evaluator = rows_op_of(split)[0].evaluator
    assert evaluator.batched and evaluator.packing is not None, "batched and packed by default on GPU ranks"
    here = chains._pm_sample(split, cores=1)
    before = chains.evaluations(split)
    forked = chains._pm_sample(split, cores=2, mp_ctx="fork")
    assert chains.evaluations(split) - before >= 2 * 2 * chains.DRAWS
    chains.assert_same_posterior(forked, here)
    chains.assert_same_posterior(here, chains._pm_sample(plain, cores=1))
    nutpie = pytest.importorskip("nutpie")
    kw = dict(chains=4, tune=chains.DRAWS, draws=chains.DRAWS, seed=1, progress_bar=False)
    chains.assert_same_posterior(nutpie.sample(nutpie.compile_pymc_model(split), **kw),
                                 nutpie.sample(nutpie.compile_pymc_model(plain), **kw))


@pytest.mark.parametrize("make", ["logistic, dims", "normal, 3 per row"])
def test_log_likelihood_and_posterior_predictive_on_a_gpu_rank(session, make):
    """pm.compute_log_likelihood on the copy (its rows from the GPU rank) and
    pm.sample_posterior_predictive: PyMC's numbers on the original model."""
    import test_pymc_workflow as workflow

    model = workflow.MODELS[make]
    workflow.test_compute_log_likelihood_on_the_copy_is_pymcs_and_runs_on_the_ranks(None, model)
    workflow.test_posterior_predictive_on_the_copy_draws_as_the_original(None, model)


@pytest.mark.parametrize("n", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 100_003])
def test_the_rows_kernel_compiles_on_the_gpu_and_gives_numpys_values(session, n):
    """GPU ranks compile a logistic regression's pass over its rows, a
    Normal's with an intercept per group, and a Normal linear regression's
    (whose log-density counts the rows: a cast), as one Triton kernel (not the
    batched graph it falls back to), with numpy's log-density and gradient for
    1 to 4 points at row counts around the block."""
    import _pymc_glm as unit
    import jax

    from synkhronos.pymc._kernel import Kernel, jax_form

    assert jax.default_backend() == "gpu" and jax.config.jax_enable_x64
    rng = np.random.default_rng(n)
    for family in ("bernoulli", "groups", "normal"):
        params, rows, single = unit.glm(family, 5, "float64")
        kernel = jax_form(unit.kernel_op(params, rows, single))
        assert isinstance(kernel, Kernel) and not kernel.interpret
        values = unit.draw_rows(family, rng, n, 5, "float64")
        for points in (1, 2, 4):
            stacked = [rng.standard_normal((points,) + p.type.shape) * 0.5 for p in params]
            got = jax.jit(kernel)(*stacked, *values)
            for k in range(points):
                want = unit.numpy_glm(family, [s[k] for s in stacked], *values)
                for g, w in zip(got, want):
                    np.testing.assert_allclose(np.asarray(g[k]), w, rtol=1e-10, atol=1e-10 * (n + 1))


@pytest.mark.parametrize("n", [WIDE_BLOCK - 1, WIDE_BLOCK + 1, 100_003])
def test_a_kernel_of_many_partial_sums_compiles_with_wider_blocks(session, n):
    """An intercept per group among 20 (21 partial sums a point): Triton
    compiles programs of ``WIDE_BLOCK`` rows, numpy's values."""
    import _pymc_glm as unit

    unit.check_many_sums(n, interpret=False)


@pytest.mark.parametrize("make", zoo.MODELS, ids=lambda f: f.__name__)
def test_the_zoos_models_give_pymcs_values_on_a_gpu_rank(session, make):
    """Every likelihood of the zoo (``test_pymc_zoo.MODELS``), split onto a GPU
    rank as built (the rows kernel, the batched graph through XLA, or one point
    a call, whichever the copy chose): PyMC's logp and gradient."""
    model = make()
    assert_same_density(model, data_parallel(model))


@pytest.mark.parametrize("name", ["normal", "two_likelihoods", "rows_of_three", "potential",
                                  "deterministics", "robust", "gamma_glm", "binomial_trials", "poisson",
                                  "varying_slopes"])
def test_models_of_the_zoo_run_as_one_kernel_on_the_gpu(session, name):
    """The first model of every tutorial (a Normal with mean and sigma: its
    log-density counts the rows, a cast), two likelihoods, rows of three, a
    potential, deterministics, a Student-t and a Gamma GLM (lgamma and digamma
    of a parameter), a binomial with each row's trials, a Poisson GLM
    (lgamma of each row) and varying slopes (coefficients sized by the
    model's dims): Triton compiles each rank's pass over its rows as one
    kernel, with the batched graph's values (on the host)."""

    model = getattr(zoo, name)()
    want, _ = zoo._batched_graph_values(model, on_gpu=False)
    got, kernel = zoo._rows_kernel_values(model, interpret=False)
    assert kernel, "the batched graph, not the kernel"
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    copy = data_parallel(model)
    assert _ranks_take_the_kernel(copy), "data_parallel gave the ranks the batched graph"
    assert_same_density(model, copy)


def _ranks_take_the_kernel(copy):
    """Whether the ranks' graph of ``copy`` holds the rows kernel (which
    ``data_parallel`` puts there only where it compiled on the GPU)."""
    from pytensor.graph.traversal import apply_ancestors

    from synkhronos.pymc._kernel import RowsKernel

    outputs = rows_op_of(copy)[0].evaluator.fn._core.outputs
    return any(isinstance(node.op, RowsKernel) for node in apply_ancestors(outputs))


@pytest.mark.parametrize("name", ["robust", "gamma_glm"])
def test_a_kernel_with_what_the_rows_do_not_enter_computed_before_it(session, name):
    """``HoistedKernel`` (what a kernel that does not compile is tried as next):
    Triton compiles it, and XLA's values of the parameters' functions before
    it give the batched graph's values."""
    import jax

    from synkhronos.pymc._kernel import HoistedKernel, _rewritten

    model = getattr(zoo, name)()
    want, _ = zoo._batched_graph_values(model, on_gpu=False)
    g = zoo._RanksGraphs(model)
    op = zoo._kernel_op(g)
    kernel = HoistedKernel(_rewritten(op.single, "JAX"), op.n_params, op.n_data, interpret=False)
    kernel.trial()
    got = jax.jit(kernel)(*g.points, *g.data_values, *g.terms.row_values)
    for a, w in zip(got if isinstance(got, (tuple, list)) else [got], want):
        np.testing.assert_allclose(np.asarray(a), w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["zero_inflated", "normal_mixture"])
def test_a_mixture_runs_batched_on_a_gpu_rank(session, name):
    """A mixture's components joined and log-sum-exped along an axis take a
    leading axis of points on GPU ranks too: PyMC's logp and gradient."""

    model = getattr(zoo, name)()
    copy = data_parallel(model)
    assert rows_op_of(copy)[0].evaluator.batched
    assert_same_density(model, copy)


def test_set_data_reaches_a_gpu_rank(session):
    """``pm.set_data`` on the copy: new values and another row count on the
    GPU rank (through the rows kernel where it compiled), PyMC's numbers."""
    import test_pymc_set_data as set_data

    model = set_data.logistic(100_003)
    copy = data_parallel(model)
    rng = np.random.default_rng(4)
    for n in (100_003, 77_777):
        x, y = set_data._logistic_rows(rng, n)
        set_data._set((model, copy), x=x, y_obs=y)
        set_data._same(model, copy)
