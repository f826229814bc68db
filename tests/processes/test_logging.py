"""Status lines go through ``logging`` (logger ``synkhronos``): INFO on stderr by
default, silenced by the usual logging calls or ``SYNKHRONOS_LOG_LEVEL``, never
printed twice, and workers follow the master's level.  Warnings that PyTensor's
backends raise about their own generated code are not shown, and a compiling
first call says so."""

import contextlib
import io
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from synkhronos._common import log

STATUS = ("Synkhronos attempting to use 2 of", "Synkhronos: 2 CPU workers initialized",
          "Synkhronos distributing functions...", "...distribution complete (")
PROFILE = "Synkhronos worker rank 1 profile written to"
WORKER_DEBUG = "worker rank 1: loaded 1 functions"

SCRIPT = """
import logging
import numpy as np
import pytensor.tensor as pt
import synkhronos as synk
{prelude}
synk.fork(2, use_gpu=False, profile_workers=True)
x = pt.matrix("x")
f = synk.function([x], x.sum(), name="total")
synk.distribute()
print("result", f(synk.data(np.ones((4, 3), "float32"))))
synk.close()
"""


def run(tmp_path, prelude="", flags="mode=FAST_COMPILE", **env):
    """Run SCRIPT (after ``prelude``) in a fresh interpreter; returns the process."""
    full = dict(os.environ, PYTENSOR_FLAGS=flags, TMPDIR=str(tmp_path))  # TMPDIR: the profile goes there
    full.pop("SYNKHRONOS_LOG_LEVEL", None)
    full.update(env)
    script = SCRIPT.format(prelude=textwrap.dedent(prelude))
    proc = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "result 6.0" in proc.stdout, proc.stdout
    return proc


def test_status_lines_on_stderr_by_default(tmp_path):
    proc = run(tmp_path)
    for line in STATUS + (PROFILE,):
        assert proc.stderr.count(line) == 1, proc.stderr
    assert "Synkhronos" not in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr


def test_set_level_warning_silences_master_and_workers(tmp_path):
    proc = run(tmp_path, 'logging.getLogger("synkhronos").setLevel(logging.WARNING)')
    assert "Synkhronos" not in proc.stdout + proc.stderr, proc.stderr
    assert "distribut" not in proc.stdout + proc.stderr


def test_env_level_silences(tmp_path):
    proc = run(tmp_path, SYNKHRONOS_LOG_LEVEL="WARNING")
    assert "Synkhronos" not in proc.stdout + proc.stderr, proc.stderr


def test_logging_disable_silences(tmp_path):
    proc = run(tmp_path, "logging.disable(logging.INFO)")
    assert "Synkhronos" not in proc.stdout + proc.stderr, proc.stderr


def test_invalid_env_level_raises_clearly(tmp_path):
    env = dict(os.environ, SYNKHRONOS_LOG_LEVEL="loud")
    proc = subprocess.run([sys.executable, "-c", "import synkhronos"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "ValueError: SYNKHRONOS_LOG_LEVEL='loud' is not a logging level" in proc.stderr, proc.stderr


def test_basic_config_prints_each_line_once(tmp_path):
    proc = run(tmp_path, 'logging.basicConfig(format="ROOT|%(name)s|%(message)s")')
    for line in STATUS:
        assert proc.stderr.count(line) == 1, proc.stderr
    assert proc.stderr.count("ROOT|synkhronos._api|Synkhronos distributing functions...") == 1
    # The worker has no configuration of the application's: its own handler prints.
    assert proc.stderr.count(PROFILE) == 1, proc.stderr


def test_workers_follow_the_masters_level_not_the_environment(tmp_path):
    # The environment says DEBUG, but the master is at WARNING when it forks: quiet workers.
    proc = run(tmp_path, 'logging.getLogger("synkhronos").setLevel(logging.WARNING)',
               SYNKHRONOS_LOG_LEVEL="DEBUG")
    assert WORKER_DEBUG not in proc.stderr and PROFILE not in proc.stderr, proc.stderr
    # And the other way round: a master set to DEBUG gets the workers' debug lines.
    proc = run(tmp_path, 'logging.getLogger("synkhronos").setLevel(logging.DEBUG)')
    assert proc.stderr.count(WORKER_DEBUG) == 1 and proc.stderr.count(PROFILE) == 1, proc.stderr
    assert "worker rank 1 ready after" in proc.stderr  # the master's


def test_no_numba_warning_and_compiling_said(tmp_path):
    """A dense layer's gradient makes Numba warn, falsely, about PyTensor's
    transposes, which PyTensor hides with a filter it installs when its Numba
    backend is imported (checked here: the warning shows without that filter).
    Through Synkhronos, on a cold cache, the first call compiles on both ranks
    without the warning (Synkhronos once dropped PyTensor's filter), and says
    that it compiles."""
    graph = """
        import warnings
        import numpy as np, pytensor, pytensor.tensor as pt
        pytensor.config.floatX = "float32"
        x = pt.matrix("x")
        w = pytensor.shared(np.ones((3, 5), "float32"), name="w")
        v = pytensor.shared(np.ones((5, 2), "float32"), name="v")
        g = pytensor.grad(x.dot(w).dot(v).sum(), w)
    """
    control = textwrap.dedent(graph) + textwrap.dedent("""
        import pytensor.link.numba.dispatch
        warnings.resetwarnings()  # PyTensor's filters gone
        pytensor.function([x], g)(np.ones((4, 3), "float32"))
    """)
    env = dict(os.environ, PYTENSOR_FLAGS="base_compiledir=%s" % (tmp_path / "control"))
    proc = subprocess.run([sys.executable, "-c", control], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "NumbaPerformanceWarning" not in proc.stderr:
        pytest.skip("Numba no longer warns about PyTensor's transposes: nothing to check")
    script = textwrap.dedent(graph) + textwrap.dedent("""
        import synkhronos as synk
        synk.fork(2, use_gpu=False)
        f = synk.function([x], (g, "sum"), name="grad")
        synk.distribute()
        print("result", f(synk.data(np.ones((4, 3), "float32"))).sum())
        synk.close()
    """)
    env = dict(os.environ, PYTENSOR_FLAGS="base_compiledir=%s,mode=NUMBA" % (tmp_path / "synk"),
               SYNKHRONOS_COMPILE_NOTICE_S="0")
    env.pop("SYNKHRONOS_LOG_LEVEL", None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "result 120.0" in proc.stdout, proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr
    assert proc.stderr.count("Synkhronos: compiling 1 function for distribute(), on 2 ranks "
                             "(Numba: can take a minute on a cold cache; later runs reuse PyTensor's "
                             "cache in %s)..." % (tmp_path / "synk")) == 1, proc.stderr
    assert proc.stderr.count("...1 function compiled in ") == 1, proc.stderr


# ----------------------------------------------------------------- in process
@contextlib.contextmanager
def bare_root():
    """The root logger without handlers (pytest gives it its own during a test)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []
    try:
        yield root
    finally:
        root.handlers = saved


def _default_handler():
    (handler,) = [h for h in logging.getLogger("synkhronos").handlers if isinstance(h, log._StderrHandler)]
    return handler


def test_default_handler_steps_aside_for_the_applications(capsys):
    logger = logging.getLogger("synkhronos._api")
    stream = io.StringIO()
    mine = logging.StreamHandler(stream)
    with bare_root() as root:
        logger.info("alone")
        assert capsys.readouterr().err == "alone\n"
        for where in (root, logging.getLogger("synkhronos"), logger):
            where.addHandler(mine)
            try:
                logger.info("once")
            finally:
                where.removeHandler(mine)
            assert capsys.readouterr().err == ""
            assert stream.getvalue() == "once\n"
            stream.truncate(0)
            stream.seek(0)


def test_tqdm_redirect_keeps_one_copy(capsys):
    from tqdm.contrib.logging import logging_redirect_tqdm

    top = logging.getLogger("synkhronos")
    ours = _default_handler()
    with bare_root(), logging_redirect_tqdm(loggers=[top]):
        assert ours not in top.handlers  # replaced by tqdm's copy, which carries its filter
        logging.getLogger("synkhronos._api").info("through tqdm")
    assert capsys.readouterr().err == "through tqdm\n"
    assert ours in top.handlers


def test_parse_level():
    assert log.parse_level("warning") == logging.WARNING
    assert log.parse_level(" DEBUG ") == logging.DEBUG
    assert log.parse_level("15") == 15
    with pytest.raises(ValueError, match="SYNKHRONOS_LOG_LEVEL='verbose' is not a logging level"):
        log.parse_level("verbose")


def test_worker_level_respects_disable():
    top = logging.getLogger("synkhronos")
    level = top.level
    try:
        top.setLevel(logging.INFO)
        assert log.worker_level() == logging.INFO
        logging.disable(logging.WARNING)
        assert log.worker_level() == logging.WARNING + 1
    finally:
        logging.disable(logging.NOTSET)
        top.setLevel(level)


def test_compile_notice_only_when_slow(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="synkhronos")
    monkeypatch.setenv(log.NOTICE_ENV, "30")
    log.CompileNotice("function 'f'", lambda: "Numba", 2).close()
    assert caplog.messages == []  # finished before the delay: a warm cache says nothing
    monkeypatch.setenv(log.NOTICE_ENV, "0")
    log.CompileNotice("function 'f'", lambda: "Numba", 2).close()
    log.CompileNotice("function 'g'", lambda: "Numba", 1).close(failed=True)
    assert caplog.messages[0] == "Synkhronos: compiling function 'f' on its first call, on 2 ranks (Numba)..."
    assert caplog.messages[1].startswith("...function 'f' compiled in ")
    assert caplog.messages[2] == "Synkhronos: compiling function 'g' on its first call, on 1 rank (Numba)..."
    assert caplog.messages[3].startswith("...function 'g' failed after ")


@pytest.mark.parametrize("bad", ["soon", "-1", "inf"])
def test_bad_compile_notice_variable_is_named(monkeypatch, caplog, bad):
    caplog.set_level(logging.INFO, logger="synkhronos")
    monkeypatch.setenv(log.NOTICE_ENV, bad)
    with pytest.raises(ValueError, match="SYNKHRONOS_COMPILE_NOTICE_S must be a non-negative number of "
                                         "seconds, got %r" % bad):
        log.CompileNotice("function 'f'", lambda: "Numba", 2)
