"""CPU workers forked by a template process (``synkhronos._session.template``).

A forked worker must be what a spawned one would be: the master's environment,
working directory, cores and standard streams of the moment, random numbers of
its own, its exit status known to the master.  The template outlives the
session and serves the next ``fork()``; another environment gets another
template; a dead template costs nothing but the speed (workers are spawned);
``SYNKHRONOS_WORKER_START=spawn`` spawns.  Each check compares against what
the master process itself sees, or against a spawned worker's answer."""

import os
import signal
import tempfile

import numpy as np
import pytensor.tensor as pt
import pytest
from _procs import Leftovers, proc_parent
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

import synkhronos as synk
from synkhronos._session import runtime, template
from synkhronos._session.launch import START_ENV
from synkhronos._session.template import ForkedWorker

N = 3  # master and two workers: the two must differ where they should


class Probe(Op):
    """Each rank's answer to ``what``, as a one-element float64 vector (a
    Python ``perform``, so that it runs in the rank's own process)."""

    __props__ = ("what",)

    def __init__(self, what):
        self.what = what

    def make_node(self, x):
        return Apply(self, [pt.as_tensor_variable(x)], [pt.dvector()])

    def perform(self, node, inputs, outputs):
        kind, _, arg = self.what.partition(":")
        if kind == "env":
            value = float(os.environ.get(arg, "-1"))
        elif kind == "cwd":
            value = float(os.path.samefile(os.getcwd(), arg))
        elif kind == "cores":
            value = float(len(os.sched_getaffinity(0)))
        elif kind == "random":
            value = np.random.random_sample()
        elif kind == "tmp":
            value = float(tempfile.gettempdir() == arg)
        elif kind == "print":
            os.write(1, b"%s rank-pid %d\n" % (arg.encode(), os.getpid()))  # one write: lines stay whole
            value = 0.0
        else:
            raise ValueError(self.what)
        outputs[0][0] = np.array([value])


def _ask(what):
    """Every rank's answer to ``what``, master first."""
    x = pt.dvector("x")
    f = synk.function([x], (Probe(what)(x), None))
    synk.distribute()
    return [float(v) for v in np.ravel(f(synk.data(np.zeros(N))))]


def _forked_workers():
    return {r: w.process for r, w in runtime.current().workers.items()}


def _parents():
    """The parent processes of this session's workers."""
    return {proc_parent(p.pid) for p in _forked_workers().values()}


@pytest.fixture
def fresh(monkeypatch):
    synk.close()
    monkeypatch.delenv(START_ENV, raising=False)
    yield
    synk.close()


def test_workers_are_forked_by_a_template_that_outlives_the_session(fresh):
    synk.fork(N, use_gpu=False)
    procs = _forked_workers()
    assert all(isinstance(p, ForkedWorker) for p in procs.values())
    parents = _parents()
    assert len(parents) == 1 and parents <= set(template.pids()), (parents, template.pids())
    left = Leftovers(runtime.current())
    synk.close()
    left.assert_gone()
    assert all(p.returncode == 0 for p in procs.values())  # their exit status, through the template
    synk.fork(N, use_gpu=False)
    assert _parents() == parents  # the same template serves the next session
    assert _ask("env:SYNK_TEST_UNSET") == [-1.0] * N
    assert _ask("tmp:%s" % runtime.current().tmpdir)[1:] == [1.0] * (N - 1)  # this session's TMPDIR


def test_a_forked_worker_takes_the_masters_environment_cwd_and_cores_now(fresh, monkeypatch, tmp_path):
    # threads=1: the ranks' thread counts, which are in the environment, do not
    # follow the cores the master may use.
    synk.fork(N, use_gpu=False, threads=1)
    before = _parents()
    synk.close()
    # A variable a library may read as it is imported: another template.
    monkeypatch.setenv("SYNK_TEST_VALUE", "17")
    synk.fork(N, use_gpu=False, threads=1)
    kept = _parents()
    assert kept != before and len(template.pids()) <= template.KEPT
    assert _ask("env:SYNK_TEST_VALUE") == [17.0] * N
    synk.close()
    # The same environment, but another directory and fewer cores: the same
    # template, and workers in the master's directory on its cores.
    monkeypatch.chdir(tmp_path)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[:1])
    try:
        synk.fork(N, use_gpu=False, threads=1)
        assert _parents() == kept
        assert _ask("cwd:%s" % tmp_path) == [1.0] * N
        assert _ask("cores") == [1.0] * N
    finally:
        synk.close()
        os.sched_setaffinity(0, cores)
    # A variable read only after start-up (LATE_VARS): the same template, the new value.
    monkeypatch.setenv("SYNKHRONOS_FAULT", "")
    synk.fork(N, use_gpu=False, threads=1)
    assert _parents() == kept
    assert _ask("env:SYNK_TEST_VALUE") == [17.0] * N
    assert _ask("tmp:%s" % runtime.current().tmpdir)[1:] == [1.0] * (N - 1)  # the session's own


def test_forked_workers_draw_their_own_random_numbers(fresh):
    synk.fork(N, use_gpu=False)
    first = _ask("random")
    synk.close()
    synk.fork(N, use_gpu=False)
    second = _ask("random")
    workers = first[1:] + second[1:]
    assert len(set(workers)) == len(workers), (first, second)


def test_a_forked_worker_writes_to_the_masters_streams_of_the_moment(fresh, capfd):
    synk.fork(N, use_gpu=False)
    synk.close()
    capfd.readouterr()
    synk.fork(N, use_gpu=False)  # from the template started under another capture
    pids = {p.pid for p in _forked_workers().values()}
    _ask("print:hello-from-the-worker")
    out = capfd.readouterr().out
    assert {"hello-from-the-worker rank-pid %d" % pid for pid in pids} <= set(out.splitlines()), out


def test_a_killed_worker_reports_its_signal(fresh):
    synk.fork(N, use_gpu=False)
    proc = _forked_workers()[1]
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    with pytest.raises(synk.WorkerError, match="exit code -9"):
        _ask("env:X")


def test_a_dead_template_leaves_fork_working(fresh):
    synk.fork(N, use_gpu=False)
    synk.close()
    for pid in template.pids():
        os.kill(pid, signal.SIGKILL)
    synk.fork(N, use_gpu=False)  # the dead template is dropped; this one is spawned
    assert _ask("env:SYNK_TEST_UNSET") == [-1.0] * N
    synk.close()
    synk.fork(N, use_gpu=False)  # and the next one forked by a new template
    assert all(isinstance(p, ForkedWorker) for p in _forked_workers().values())
    assert _ask("env:SYNK_TEST_UNSET") == [-1.0] * N


def test_spawn_when_asked(fresh, monkeypatch):
    monkeypatch.setenv(START_ENV, "spawn")
    monkeypatch.setenv("SYNK_TEST_VALUE", "5")
    synk.fork(N, use_gpu=False)
    assert not any(isinstance(p, ForkedWorker) for p in _forked_workers().values())
    assert _ask("env:SYNK_TEST_VALUE") == [5.0] * N


def test_an_unknown_start_method_is_refused(fresh, monkeypatch):
    monkeypatch.setenv(START_ENV, "forkserver")
    with pytest.raises(ValueError, match="SYNKHRONOS_WORKER_START='forkserver'"):
        synk.fork(N, use_gpu=False)
    monkeypatch.delenv(START_ENV)
    synk.fork(N, use_gpu=False)
    assert _ask("env:SYNK_TEST_UNSET") == [-1.0] * N
