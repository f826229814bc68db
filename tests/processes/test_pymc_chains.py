"""Chains of a ``synkhronos.pymc.data_parallel`` model on the ranks, however the
sampler runs them: as processes PyMC forks (its default on Linux), spawns or
starts from a fork server, as threads (nutpie), and several chains' points in
one pass over the rows.  Each against the plain model, sampled with the same
seeds in the same way: the posterior means agree within 0.15 posterior SD, and
every evaluation of every chain was counted by the session's process.  JAX
samplers are refused with the way forward.  Then the batcher that evaluates
every pending point in one run, against a plain model, with threads."""

import threading
import time

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_pymc import float64_session  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos._session import runtime  # noqa: E402
from synkhronos.pymc import data_parallel  # noqa: E402
from synkhronos.pymc._batch import Batcher  # noqa: E402
from synkhronos.pymc._loo import rows_op_of  # noqa: E402

ROWS, FEATURES = 1000, 4
DRAWS = 100


@pytest.fixture(scope="module")
def session():
    with float64_session(2):
        yield


def logistic(n=ROWS, p=FEATURES, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, p))
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ np.full(p, 0.3))))).astype("int64")
    with pm.Model() as m:
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0, 1, shape=p)
        pm.Bernoulli("y", logit_p=xd @ b, observed=y)
    return m


@pytest.fixture(scope="module")
def models(session):
    plain = logistic()
    return plain, data_parallel(plain)


def evaluations(split):
    """How many points the session's process evaluated for ``split`` so far."""
    sizes = rows_op_of(split)[0].evaluator.batcher.sizes
    return sum(n * k for n, k in sizes.items())


def assert_same_posterior(got, want):
    g, w = got.posterior["b"], want.posterior["b"]
    sd = w.std(("chain", "draw")).values
    off = np.abs(g.mean(("chain", "draw")).values - w.mean(("chain", "draw")).values) / sd
    assert np.all(off < 0.15), "posterior means %s SDs apart" % off


def _pm_sample(model, **kw):
    with model:
        return pm.sample(draws=DRAWS, tune=DRAWS, chains=2, progressbar=False, random_seed=5,
                         compute_convergence_checks=False, **kw)


@pytest.fixture(scope="module")
def in_process(models):
    """The copy's chains one after the other in this process (``cores=1``), and
    how many points that evaluated."""
    _, split = models
    before = evaluations(split)
    idata = _pm_sample(split, cores=1)
    return idata, evaluations(split) - before


def test_chains_in_this_process_sample_pymcs_posterior(models, in_process):
    plain, split = models
    idata, evaluated = in_process
    assert evaluated >= 2 * 2 * DRAWS, "every step of both chains, on the ranks"
    assert_same_posterior(idata, _pm_sample(plain, cores=1))


@pytest.mark.parametrize("mp_ctx", ["fork", "spawn", "forkserver"])
def test_chains_in_processes_run_on_the_ranks(models, in_process, mp_ctx):
    """cores=2: PyMC runs each chain in a process of its own, forked (its default
    on Linux up to Python 3.13) or started with a pickled copy of the model.
    Every evaluation is computed by the ranks, so the draws are those of the
    same chains run in this process: to the last bits only, since JAX ranks
    evaluate two chains' points in one run, which sums the rows in another
    order than a run of one point (a flipped decision of the sampler would
    need two values within about 1e-12 of each other)."""
    _, split = models
    want, evaluated = in_process
    before = evaluations(split)
    got = _pm_sample(split, cores=2, mp_ctx=mp_ctx)
    assert evaluations(split) - before == evaluated, "every chain's every step, on the ranks"
    np.testing.assert_allclose(got.posterior["b"].values, want.posterior["b"].values, rtol=1e-6, atol=0)


def test_nutpie_chains_in_threads(models):
    """nutpie runs every chain as a thread of this process (PyMC 6's default
    sampler when nutpie is installed): the posterior is plain nutpie's."""
    nutpie = pytest.importorskip("nutpie")
    plain, split = models
    kw = dict(chains=4, tune=DRAWS, draws=DRAWS, seed=1, progress_bar=False)
    before = evaluations(split)
    got = nutpie.sample(nutpie.compile_pymc_model(split), **kw)
    assert evaluations(split) - before >= 4 * 2 * DRAWS
    assert_same_posterior(got, nutpie.sample(nutpie.compile_pymc_model(plain), **kw))
    with split:  # PyMC's way to the same sampler
        via_pymc = pm.sample(nuts_sampler="nutpie", draws=50, tune=50, chains=2, progressbar=False,
                             random_seed=1)
    assert np.all(np.isfinite(via_pymc.posterior["b"].values))


@pytest.mark.parametrize("sampler", ["numpyro", "blackjax", "nutpie's jax backend"])
def test_jax_samplers_are_refused_with_the_way_forward(models, sampler):
    _, split = models
    way_forward = r"RowsLogp.*synkhronos\.pymc.*pm\.sample\(\).*nuts_sampler='nutpie'"
    if sampler.startswith("nutpie"):
        nutpie = pytest.importorskip("nutpie")
        with pytest.raises(NotImplementedError, match=way_forward):
            nutpie.compile_pymc_model(split, backend="jax")
        return
    with split, pytest.raises(NotImplementedError, match=way_forward):
        pm.sample(nuts_sampler=sampler, draws=10, tune=10, chains=1, progressbar=False)


def _points(model, k, seed=4):
    rng = np.random.default_rng(seed)
    start = model.initial_point()
    return [{n: v + 0.3 * rng.standard_normal(v.shape) for n, v in start.items()} for _ in range(k)]


@pytest.mark.parametrize("batch", [False, True])
def test_threads_at_once_get_their_own_logp_and_gradient(models, batch):
    """Threads evaluating at once (some while the session is busy, so that their
    points are pending together): each gets PyMC's numbers for its own point;
    with ``batch`` several points were computed in one pass (None: the device's
    default, batched on GPU ranks)."""
    plain, _ = models
    split = data_parallel(plain, batch=batch)
    gpu = runtime.current().device.name == "gpu"
    assert rows_op_of(split)[0].evaluator.batched == (gpu if batch is None else batch)
    logp0, dlogp0 = plain.compile_logp(), plain.compile_dlogp()
    points = _points(plain, 6)
    # A PyTensor function is not reentrant: each chain compiles its own, as samplers do.
    compiled = [(split.compile_logp(), split.compile_dlogp()) for _ in points]
    results = {}
    rt = runtime.current()

    def chain(k):
        logp1, dlogp1 = compiled[k]
        results[k] = [(float(logp1(p)), dlogp1(p)) for p in points[k:] + points[:k]]

    threads = [threading.Thread(target=chain, args=(k,)) for k in range(len(points))]
    with rt.lock:  # the first caller waits for the session; the others queue behind it
        for t in threads:
            t.start()
        time.sleep(0.5)
    for t in threads:
        t.join(120)
    for k, got in results.items():
        for p, (lp, dlp) in zip(points[k:] + points[:k], got):
            np.testing.assert_allclose(lp, logp0(p), rtol=1e-9)
            np.testing.assert_allclose(dlp, dlogp0(p), rtol=1e-9, atol=1e-9)
    assert len(results) == len(points)
    sizes = rows_op_of(split)[0].evaluator.batcher.sizes
    assert max(sizes) > 1, "points pending together ran together: %s" % dict(sizes)


def test_a_closed_session_is_named_at_the_next_evaluation():
    """(Its own session: it closes it.)"""
    synk.close()
    synk.fork(2, use_gpu=False)
    split = data_parallel(logistic(200))
    logp = split.compile_logp()
    point = split.initial_point()
    assert np.isfinite(logp(point))
    synk.close()
    with pytest.raises(RuntimeError, match="session .* was closed: call synkhronos.pymc.data_parallel"):
        logp(point)
# ------------------------------------------------------------------ batcher
@settings(max_examples=30, deadline=None)
@given(threads=st.integers(1, 8), calls=st.integers(1, 12), failing=st.sets(st.integers(0, 95), max_size=4),
       pause=st.sampled_from((0.0, 0.0005, 0.002)), linger=st.sampled_from((0.0, 0.5, 3.0)),
       many=st.sets(st.integers(0, 7)))
def test_batcher_against_a_plain_model(threads, calls, failing, pause, linger, many):
    """Threads asking for points (alone, or several at once with
    ``evaluate_many``, as the session's service does for its children): every
    point in exactly one run, each caller its own results, a failing run's error
    raised to every caller of a point in it, a caller's points in one run."""
    runs = []
    pending = set()
    lock = threading.Lock()

    def run(points):
        with lock:
            runs.append(list(points))
            assert set(points) <= pending, "a run holds only points that were asked for"
            pending.difference_update(points)
        time.sleep(pause)
        if any(p in failing for p in points):
            raise ValueError("run of %s" % (points,))
        return [p * 10 for p in points]

    b = Batcher(run, linger=linger)
    errors = []

    def chain(t):
        step = 3 if t in many else 1  # points asked for at once
        for i in range(0, calls, step):
            points = [t * 12 + j for j in range(i, min(i + step, calls))]
            with lock:
                pending.update(points)
            try:
                got = b.evaluate_many(points) if t in many else [b.evaluate(points[0])]
            except ValueError as exc:
                errors.extend((p, str(exc)) for p in points)
                continue
            assert got == [p * 10 for p in points], (points, got)
            assert any(set(points) <= set(r) for r in runs), "a caller's points in one run"

    workers = [threading.Thread(target=chain, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not any(w.is_alive() for w in workers), "a caller hangs"
    every = [p for r in runs for p in r]
    assert sorted(every) == sorted(t * 12 + i for t in range(threads) for i in range(calls)), "each once"
    failed_runs = [r for r in runs if any(p in failing for p in r)]
    assert sorted(p for p, _ in errors) == sorted(p for r in failed_runs for p in r)
    assert sum(n * k for n, k in b.sizes.items()) == len(every)


@pytest.mark.parametrize("linger", [0.0, 0.5])
def test_a_point_asked_alone_runs_at_once(linger):
    def run(points):
        time.sleep(0.01)
        return [p + 1 for p in points]

    b = Batcher(run, linger=linger)
    t0 = time.monotonic()
    assert [b.evaluate(i) for i in range(50)] == list(range(1, 51))
    assert time.monotonic() - t0 < 0.5 + 50 * 0.01, "no run waited for a chain"
    assert b.waits == 0, "a lone caller is never waited for"
    assert b.sizes == {1: 50}


def _chains(b, n_chains, calls, think_s=0.0, stop_after=None):
    def chain(t):
        for i in range((stop_after or {}).get(t, calls)):
            time.sleep(think_s)
            b.evaluate(t * 1000 + i)

    workers = [threading.Thread(target=chain, args=(t,)) for t in range(n_chains)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    return time.monotonic() - t0


def _slow_run(points):
    time.sleep(0.004)
    return list(points)


def test_lingering_merges_chains_that_take_turns():
    """Four chains that ask again at once: without lingering they settle into
    groups that take turns; with it most runs hold all four points."""
    b = Batcher(_slow_run, linger=0.5)
    _chains(b, 4, 150)
    in_runs_of_four = 4 * b.sizes[4] / sum(n * k for n, k in b.sizes.items())
    assert in_runs_of_four > 0.7, dict(b.sizes)


def test_lingering_waits_not_for_slow_thinkers_nor_stopped_chains():
    """A chain that thinks longer than the linger (half a run, 2 ms) is not
    waited for after its first time; a chain that stopped costs one wait.
    Counted in runs that waited, not in seconds: a thread that loses the GIL
    in a run's few lines adds a switch interval (5 ms) to the seconds."""
    b = Batcher(_slow_run, linger=0.5)
    fast = threading.Thread(target=lambda: [b.evaluate(i) for i in range(100)])
    fast.start()
    _chains(b, 1, 25, think_s=0.015)
    fast.join(60)
    # (a run the slow chain leads may rightly wait for the fast one)
    assert b.waits <= 5, "%d runs waited for the slow chain (25 calls)" % b.waits
    b = Batcher(_slow_run, linger=0.5)
    _chains(b, 3, 100, stop_after={1: 5, 2: 5})
    assert b.waits <= 2 + 2 * 5, "%d runs waited for chains that stopped after 5 calls" % b.waits
    assert b.lingered_s < 0.05, "waited %.3f s for chains that stopped" % b.lingered_s


_DEFAULT_LINKER = """
import threading
import time
import numpy as np
import pymc as pm
import synkhronos as synk
from synkhronos.pymc import data_parallel
from synkhronos.pymc._loo import rows_op_of
import test_pymc_chains as chains

synk.fork(2, use_gpu=False)
plain = chains.logistic()
split = data_parallel(plain)
ev = rows_op_of(split)[0].evaluator
logp0, dlogp0 = plain.compile_logp(), plain.compile_dlogp()
points = chains._points(plain, 4)
compiled = [(split.compile_logp(), split.compile_dlogp()) for _ in points]
got = {}
with synk._session.runtime.current().lock:
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, (compiled[k][0](points[k]),
               compiled[k][1](points[k])))) for k in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120  # one evaluation holds the batch, waiting for the lock:
    while len(ev.batcher._pending) < 3 and time.monotonic() < deadline:  # the others queue
        time.sleep(0.01)
for t in threads:
    t.join()
for k, (lp, dlp) in got.items():
    np.testing.assert_allclose(lp, logp0(points[k]), rtol=1e-9)
    np.testing.assert_allclose(dlp, dlogp0(points[k]), rtol=1e-9, atol=1e-9)
linker = type(ev.fn._core.plain.maker.linker).__name__
print("linker", linker, "batched", ev.batched, "sizes", max(ev.batcher.sizes))
synk.close()
"""


def test_by_default_cpu_ranks_compile_with_jax_and_batch(tmp_path):
    """With no PYTENSOR_FLAGS at all (not even the suite's reference flags): the
    terms compile with JAX on CPU ranks and pending points share one pass, with
    PyMC's numbers."""
    import os
    import subprocess
    import sys

    pytest.importorskip("jax")
    env = {k: v for k, v in os.environ.items() if k != "PYTENSOR_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _DEFAULT_LINKER], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("linker ")]
    assert line and line[0].startswith("linker JAXLinker batched True sizes "), proc.stdout
    assert int(line[0].split()[-1]) >= 3, "the points pending together ran in one pass: %s" % line[0]
