"""Which linker CPU ranks run a ``data_parallel`` copy with: JAX, or PyTensor's
own where the ranks measure it faster (``_linker``).  The choice follows the
timings, the chosen function is the one every call runs, and either way the
copy gives the original's numbers (logp, gradient, pointwise log-likelihood);
where it is not to be timed, nothing more is compiled."""

import logging

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

from test_pymc import N_RANKS, assert_same_density, float64_session  # noqa: E402
from test_pymc_workflow import draws, logistic_with_dims  # noqa: E402

from synkhronos.pymc import _linker, _split, data_parallel  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402

N = 1001


@pytest.fixture(scope="module")
def session():
    with float64_session(N_RANKS):
        yield


@pytest.fixture
def trial(monkeypatch):
    """Linkers timed (tests/conftest.py sets JAX), from a few rows per rank."""
    monkeypatch.delenv(_linker.LINKER_ENV, raising=False)
    monkeypatch.setattr(_linker, "TRIAL_ROWS", 100)


@pytest.fixture
def timings(monkeypatch, trial):
    """``_linker._timed`` returning the given times in turn (JAX's, then
    PyTensor's own: ``(one point, four points)`` each, in seconds)."""
    given = []

    def fake(served, point, sizes):
        assert sizes == (1, 4)  # JAX batches the logistic regression on CPU ranks
        return dict(zip(sizes, given.pop(0)))

    monkeypatch.setattr(_linker, "_timed", fake)
    return given


def _served(copy):
    return rows_op_of(copy)[0].evaluator


def _runs_own(copy):
    """Whether the copy's calls run PyTensor's own linker (this process's rank
    compiled as every rank does; the tests' flags make it PyTensor's Python
    one, tests/_flags.py)."""
    linker = type(_served(copy).fn._core.plain.maker.linker).__name__
    assert linker in ("JAXLinker", "PerformLinker", "VMLinker", "NumbaLinker"), linker
    return linker != "JAXLinker"


def _same_loglik(model, copy):
    idata = draws(model, n=3)
    theirs, ours = (pm.compute_log_likelihood(idata, model=m, extend_inferencedata=False, progressbar=False)
                    for m in (model, copy))
    np.testing.assert_allclose(ours["y"].values, theirs["y"].values, rtol=1e-9)


@pytest.mark.parametrize("times, own, says", [
    ([(2.0, 4.0), (1.0, 2.0)], True, "the CPU ranks run PyTensor's own linker, one point a call"),
    # not by MARGIN:
    ([(2.0, 4.0), (1.7, 3.4)], False, "the CPU ranks run JAX (PyTensor's own linker: 1.7e+03 ms"),
    ([(2.0, 4.0), (1.0, 4.5)], False, "the CPU ranks run JAX"),  # one point faster, the sum not
], ids=["own faster", "own not faster enough", "own faster for one point"])
def test_the_choice_follows_the_timings(session, timings, caplog, times, own, says):
    caplog.set_level(logging.INFO, logger="synkhronos")
    timings.extend(times)
    model = logistic_with_dims(n=N)
    copy = data_parallel(model)
    assert not timings  # both linkers timed, once each
    assert says in caplog.text
    assert _runs_own(copy) == own
    assert _served(copy).batched != own  # PyTensor's own evaluates one point a call
    assert_same_density(model, copy, rtol=1e-9)
    if own:
        _same_loglik(model, copy)


def test_the_choice_timed_for_real(session, trial, caplog):
    caplog.set_level(logging.INFO, logger="synkhronos")
    model = logistic_with_dims(n=N)
    copy = data_parallel(model)
    assert "the CPU ranks run" in caplog.text and "PyTensor's own linker: " in caplog.text
    _runs_own(copy)
    assert_same_density(model, copy, rtol=1e-9)


def _never_timed(monkeypatch):
    def fails(*args):
        raise AssertionError("timed")

    monkeypatch.setattr(_linker, "_timed", fails)


@pytest.mark.parametrize("how", ["rows below TRIAL_ROWS", "batch given", "SYNKHRONOS_PYMC_LINKER=jax"])
def test_not_timed_where_it_is_not_to_be(session, trial, monkeypatch, how):
    _never_timed(monkeypatch)
    kwargs = {}
    if how == "rows below TRIAL_ROWS":
        monkeypatch.setattr(_linker, "TRIAL_ROWS", N // N_RANKS + 2)
    elif how == "batch given":
        kwargs["batch"] = False
    else:
        monkeypatch.setenv(_linker.LINKER_ENV, " JAX")
    built, jittered = [], []
    monkeypatch.setattr(_linker, "distributed", lambda *a: built.append(a))
    monkeypatch.setattr(_split, "_jittered", lambda model: jittered.append(model))
    copy = data_parallel(logistic_with_dims(n=N), **kwargs)
    assert not built  # no function of PyTensor's own linker compiled
    assert not jittered  # nor PyMC's of the trial's point
    assert not _runs_own(copy)


@pytest.mark.parametrize("where, error", [
    ("_timed", FloatingPointError("at the initial point\nmore")),
    ("distributed", ValueError("observed 'y': its log-density graph cannot be sent to the ranks")),
], ids=["timing", "sending"])
def test_a_trial_that_raises_keeps_jax(session, trial, monkeypatch, caplog, where, error):
    def fails(*args):
        raise error

    monkeypatch.setattr(_linker, where, fails)
    model = logistic_with_dims(n=N)
    with caplog.at_level(logging.WARNING, logger="synkhronos"):
        copy = data_parallel(model)
    said = "%s: %s" % (type(error).__name__, str(error).splitlines()[0])
    assert "linkers not timed (%s); the ranks run JAX" % said in caplog.text
    assert not _runs_own(copy)
    assert_same_density(model, copy, rtol=1e-9)


def test_a_bad_environment_value_is_refused(session, monkeypatch):
    monkeypatch.setenv(_linker.LINKER_ENV, "numba")
    with pytest.raises(ValueError, match="SYNKHRONOS_PYMC_LINKER must be 'jax' .* got 'numba'"):
        data_parallel(logistic_with_dims(n=20))


def test_threads_at_once_and_forked_chains_run_pytensors_own(session, timings):
    """The copy on PyTensor's own linker, one point a call: chains in threads
    (nutpie's) each get PyMC's numbers for their own points, and chains that
    PyMC forks sample through this process."""
    import test_pymc_chains as chains

    timings.extend([(2.0, 4.0), (1.0, 2.0)] * 2)
    chains.test_threads_at_once_get_their_own_logp_and_gradient((chains.logistic(), None), None)
    copy = data_parallel(logistic_with_dims(n=N))
    assert not timings and _runs_own(copy)
    idata = pm.sample(draws=20, tune=20, chains=2, cores=2, model=copy, random_seed=4, progressbar=False,
                      compute_convergence_checks=False)
    assert np.isfinite(idata.sample_stats["lp"].values).all()
    assert sum(_served(copy).batcher.sizes.values()) > 80  # the children's evaluations ran here


def test_timed_where_a_chain_would_start(session, trial, monkeypatch):
    """The trial's point is the model's initial point jittered as ``pm.sample``
    starts its chains (a graph's time may depend on its values), the same in
    every run."""
    from synkhronos.pymc._split import initial_inputs
    from synkhronos.pymc._terms import find_terms

    seen = []

    def fake(served, point, sizes):
        seen.append([np.array(p) for p in point])
        return dict.fromkeys(sizes, 1.0)

    monkeypatch.setattr(_linker, "_timed", fake)
    model = logistic_with_dims(n=N)
    data_parallel(model)
    data_parallel(model)
    first, second = seen[0], seen[2]  # (JAX's and PyTensor's own, each run)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    terms = find_terms(model, list(model.observed_RVs), N)
    plain = initial_inputs(model, terms)
    assert any(not np.array_equal(a, p) for a, p in zip(first, plain)), "jittered"
    for a, p in zip(first, plain):
        assert a.shape == p.shape and np.all(np.isfinite(a))
