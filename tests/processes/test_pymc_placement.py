"""Where a ``data_parallel`` copy keeps its rows: on every rank, or on this
process's rank alone (``ranks=1``) where that is faster.  Either way the copy
gives the original's numbers in every PyMC call the workflow tests make; the
choice (``ranks=None``) follows the timings as ``_placement`` says, and keeps
the rows where it says."""

import logging
import os

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

from test_pymc import N_RANKS, float64_session  # noqa: E402
from test_pymc_workflow import SEVERAL, draws, logistic_with_dims, several_terms  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos.pymc import _placement, data_parallel, loo  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402

RTOL = 1e-9


@pytest.fixture(scope="module")
def session():
    with float64_session(N_RANKS):
        yield


@pytest.fixture
def timed(monkeypatch):
    """``data_parallel`` without ``$SYNKHRONOS_PYMC_RANKS`` (tests/conftest.py
    sets it), so that ``ranks=None`` times the placements."""
    monkeypatch.delenv(_placement.RANKS_ENV, raising=False)


def _logp_and_grad(model, point, names=None):
    vars_ = None if names is None else [model[n] for n in names]
    logp = model.compile_logp(vars=vars_)(point)
    grad = model.compile_dlogp(vars=vars_)(point) if names is None else None
    return logp, grad


def _same(a, b):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL)


def _served(copy):
    """The copy's ``Evaluator``."""
    return rows_op_of(copy)[0].evaluator


def _rows_per_rank(variables):
    """How many rows each rank holds of the first of ``variables``, the
    workers asked through ``synk.get_lengths``."""
    (lengths,) = synk.get_lengths([variables[0]])
    return list(lengths)


@pytest.mark.parametrize("build", [several_terms, logistic_with_dims], ids=["several terms", "logistic"])
def test_one_rank_alone_gives_the_originals_numbers(session, build):
    model = build()
    copy = data_parallel(model, observed=SEVERAL if build is several_terms else None, ranks=1)
    served = _served(copy)
    assert served.alone_fn is served.fn and served.alone_up_to == float("inf")
    assert _rows_per_rank(served.rows)[1:] == [0] * (N_RANKS - 1)
    point = model.initial_point()
    for names in [None] + ([[n] for n in SEVERAL] if build is several_terms else []):
        theirs, ours = _logp_and_grad(model, point, names), _logp_and_grad(copy, point, names)
        _same(ours[0], theirs[0])
        if names is None:
            _same(ours[1], theirs[1])
    idata = draws(model)
    ll_theirs = pm.compute_log_likelihood(idata, model=model, extend_inferencedata=False, progressbar=False)
    ll_ours = pm.compute_log_likelihood(idata, model=copy, extend_inferencedata=False, progressbar=False)
    assert set(ll_ours.data_vars) == set(ll_theirs.data_vars)
    for name in ll_theirs.data_vars:
        _same(ll_ours[name].values, ll_theirs[name].values)
    pp_theirs = pm.sample_posterior_predictive(idata, model=model, random_seed=5, progressbar=False)
    pp_ours = pm.sample_posterior_predictive(idata, model=copy, random_seed=5, progressbar=False)
    for name in pp_theirs.posterior_predictive.data_vars:
        _same(pp_ours.posterior_predictive[name].values, pp_theirs.posterior_predictive[name].values)
    if build is logistic_with_dims:
        import test_pymc_loo

        test_pymc_loo.assert_same_loo(loo(idata, copy), loo(idata, data_parallel(model, ranks=N_RANKS)))


def test_chains_in_processes_of_their_own_reach_the_rank_alone(session):
    model = logistic_with_dims(n=300)
    copy = data_parallel(model, ranks=1)
    idata = pm.sample(draws=20, tune=20, chains=2, cores=2, model=copy, random_seed=4, progressbar=False,
                      compute_convergence_checks=False)
    assert np.isfinite(idata.sample_stats["lp"].values).all()
    assert int(idata.sample_stats["diverging"].sum()) < 40


@pytest.fixture
def timings(monkeypatch, timed):
    """Make ``_placement._timed`` return the given times in turn: ``(one
    point, four points)`` each, in seconds."""
    given = []

    def fake(served, point, sizes):
        assert sizes == (1, 4)  # CPU ranks batch by default
        return dict(zip(sizes, given.pop(0)))

    monkeypatch.setattr(_placement, "_timed", fake)
    return given


class _Paths:
    """Which way each call of a copy went: ``"alone"`` or ``"every"``."""

    def __init__(self, monkeypatch):
        from synkhronos._function import Function

        self.taken = []
        every, alone = Function.__call__, Function._call_master_alone

        def every_rank(fn, *args, **kwargs):
            self.taken.append("every")
            return every(fn, *args, **kwargs)

        def this_rank(fn, *args):
            self.taken.append("alone")
            return alone(fn, *args)

        monkeypatch.setattr(Function, "__call__", every_rank)
        monkeypatch.setattr(Function, "_call_master_alone", this_rank)

    def of(self, served, point, k):
        del self.taken[:]
        served.run([point] * k)
        return self.taken


SHARED, ALL_HERE, NONE = [501, 500], [1001, 0], [0, 0]


@pytest.mark.parametrize("times, up_to, alone_rows, says", [
    # the round trip costs next to nothing
    ([(1.0, 2.0), (0.95, 1.9)], 0, None, "share alone: 950 ms for 1 point, 1.9e+03 ms for 4"),
    ([(2.0, 4.0), (0.5, 1.0), (1.0, 2.0)], float("inf"), ALL_HERE,
     "evaluated on this process's rank alone (data_parallel(..., ranks=2)"),
    ([(2.0, 4.0), (0.5, 1.0), (1.0, 4.0)], 1, ALL_HERE,
     "evaluated on this process's rank alone up to 1 point a call, on 2 ranks for more"),
    ([(2.0, 4.0), (0.5, 1.0), (1.9, 2.0)], 0, NONE, "ranks: evaluated on 2 ranks"),  # 1 point: not by MARGIN
], ids=["share close", "alone faster", "alone faster for 1 point", "alone not faster enough"])
def test_the_choice_follows_the_timings(session, timings, caplog, monkeypatch, times, up_to, alone_rows,
                                        says):
    caplog.set_level(logging.INFO, logger="synkhronos")
    model = several_terms()
    timings.extend(times)
    copy = data_parallel(model, observed=SEVERAL)
    assert not timings  # every time asked for, and no more
    served = _served(copy)
    assert served.alone_up_to == up_to
    assert _rows_per_rank(served.rows) == SHARED  # pm.compute_log_likelihood and loo read them there
    if alone_rows is not None:
        assert _rows_per_rank(served.alone_rows) == alone_rows
    assert says in caplog.text
    point = model.initial_point()
    theirs = _logp_and_grad(model, point)
    paths = _Paths(monkeypatch)
    ours = _logp_and_grad(copy, point)
    _same(ours[0], theirs[0])
    _same(ours[1], theirs[1])
    assert paths.taken and set(paths.taken) == {"alone" if up_to >= 1 else "every"}
    at = _point_of(copy, point)
    assert paths.of(served, at, 4) == ["alone" if up_to >= 4 else "every"]
    (one,) = served.run([at])
    for four in served.run([at] * 4):  # the split terms' sums, each point's the one point's
        for a, b in zip(four, one):
            _same(a, b)


def _point_of(copy, point):
    """The Op's inputs at ``point`` (a point of the model's value variables)."""
    op, inputs = rows_op_of(copy)
    fn = copy.compile_fn(copy.replace_rvs_by_values(inputs), inputs=copy.value_vars, mode="FAST_COMPILE",
                         on_unused_input="ignore")
    return [np.asarray(x) for x in fn(point)]


def test_rows_over_the_trial_size_stay_shared(session, timings, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="synkhronos")
    monkeypatch.setattr(_placement, "TRIAL_BYTES", 1000)
    timings.extend([(2.0, 4.0), (0.5, 1.0)])  # one rank alone would be timed, were the rows small
    copy = data_parallel(logistic_with_dims())
    assert _served(copy).alone_up_to == 0 and _served(copy).alone_fn is None
    assert "GB of rows, over the" in caplog.text


def test_the_choice_timed_for_real(session, timed, caplog):
    caplog.set_level(logging.INFO, logger="synkhronos")
    model = logistic_with_dims()
    copy = data_parallel(model)
    served = _served(copy)
    assert _rows_per_rank(served.rows) == SHARED
    if served.alone_up_to:
        assert _rows_per_rank(served.alone_rows) == ALL_HERE
    assert "evaluated on" in caplog.text
    point = model.initial_point()
    _same(_logp_and_grad(copy, point)[0], _logp_and_grad(model, point)[0])


@pytest.mark.parametrize("ranks", [0, 3, -1, True, 1.0, "all", [1]])
def test_ranks_must_be_one_or_every_rank(session, ranks):
    with pytest.raises(ValueError, match=r"ranks must be None .* or 2 \(every rank\), got %s"
                       % __import__("re").escape(repr(ranks))):
        data_parallel(logistic_with_dims(n=20), ranks=ranks)


def test_the_default_from_the_environment(session, monkeypatch):
    monkeypatch.setenv(_placement.RANKS_ENV, "1")
    assert _served(data_parallel(logistic_with_dims(n=20))).alone_up_to == float("inf")
    monkeypatch.setenv(_placement.RANKS_ENV, "ALL")
    assert _served(data_parallel(logistic_with_dims(n=20))).alone_up_to == 0
    monkeypatch.setenv(_placement.RANKS_ENV, "2")
    with pytest.raises(ValueError, match="SYNKHRONOS_PYMC_RANKS must be 'all' .* got '2'"):
        data_parallel(logistic_with_dims(n=20))


def test_a_rank_alone_sends_nothing_to_the_others(session, monkeypatch):
    from synkhronos._function import Function

    model = logistic_with_dims(n=50)
    copy = data_parallel(model, ranks=1)

    def refused(self, *args, **kwargs):
        raise AssertionError("a call of every rank")

    monkeypatch.setattr(Function, "__call__", refused)
    point = model.initial_point()
    _same(_logp_and_grad(copy, point)[0], _logp_and_grad(model, point)[0])


def test_threads_at_once_each_get_their_own_numbers_by_either_path(session, timings, monkeypatch):
    """Chains in threads (nutpie's) while one point goes to this rank alone
    and several to every rank: each thread gets PyMC's numbers for its own
    points, and both paths ran."""
    import test_pymc_chains as chains

    timings.extend([(2.0, 4.0), (0.5, 1.0), (1.0, 4.0)])  # calls of one point alone, more on every rank
    paths = _Paths(monkeypatch)
    chains.test_threads_at_once_get_their_own_logp_and_gradient((chains.logistic(), None), True)
    assert {"alone", "every"} <= set(paths.taken)


_MASTER_POOL = """
import json, os
import jax._src.xla_bridge as xla_bridge
import numpy as np, pymc as pm
import synkhronos as synk
from synkhronos._session import runtime
from synkhronos.pymc import data_parallel

started = []  # the cores this process may use when JAX's backend starts: XLA sizes its pool by them
backends = xla_bridge.backends

def spied(*args, **kwargs):
    if not started and not xla_bridge.backends_are_initialized():
        started.append(sorted(os.sched_getaffinity(0)))
    return backends(*args, **kwargs)

xla_bridge.backends = spied
synk.fork(2, use_gpu=False)
x = np.random.default_rng(0).standard_normal((300, 2))
with pm.Model() as model:
    b = pm.Normal("b", 0, 1, shape=2)
    pm.Normal("y", x @ b, 1, observed=x[:, 0])
copy = data_parallel(model)
copy.compile_logp()(model.initial_point())
print(json.dumps([started, list(runtime.current().device.jax_cores)]))
synk.close()
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="reads the process's cores (Linux)")
def test_data_parallel_starts_this_processs_jax_on_its_rank_cores():
    """``data_parallel`` converts the ranks' graph with JAX in this process to
    see whether it batches, which starts JAX's backend there: on this rank's
    cores, as its first function would, not on every core, where its pool
    would crowd the workers' cores at every call."""
    import json
    import subprocess
    import sys

    from synkhronos._devices.cpu import THREAD_VARS

    # PyTensor's own defaults, as a user has them (a mode in PYTENSOR_FLAGS: no JAX on the ranks, and
    # none here); thread counts in the environment are the user's choice (no pool of the rank's cores)
    drop = {_placement.RANKS_ENV, "PYTENSOR_FLAGS", *THREAD_VARS}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    proc = subprocess.run([sys.executable, "-c", _MASTER_POOL], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    started, share = json.loads(proc.stdout.strip().splitlines()[-1])
    assert started == [share], "JAX started on cores %s, this rank's are %s" % (started, share)


def test_a_timing_that_fails_leaves_every_call_on_every_rank(session, timed, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="synkhronos")

    def fails(served, point, sizes):
        raise RuntimeError("the ranks' graph raised at the initial point")

    monkeypatch.setattr(_placement, "_timed", fails)
    model = logistic_with_dims()
    copy = data_parallel(model)
    assert _served(copy).alone_up_to == 0
    assert "not timed (RuntimeError: the ranks' graph raised at the initial point); every call on 2 ranks" \
        in caplog.text
    point = model.initial_point()
    _same(_logp_and_grad(copy, point)[0], _logp_and_grad(model, point)[0])
