"""Checks in a graph (``Assert``, ``CheckAndRaise``) on the linker users get: JAX
on CPU ranks (see ``synkhronos._graph.jax_checks``).  A check that fails on a
worker rank raises ``WorkerError`` with the rank, the check's exception type and
its message; on the master's rank it raises the check's own exception (as every
exception of the master's share does: docs page "Errors").  A check that passes
changes no number, the rank that failed applies no update, and the session
goes on.

The ranks compile with JAX as users' ranks do (the suite's flags leave PyTensor's
mode at its default: ``_flags``); the tests' references run PyTensor's Python
linker.  The docs' own example of a failed check (``docs/examples/errors.py``)
runs with the other examples, in ``test_docs.py``."""

import warnings
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _check_errors import RowsError
from hypothesis import given, settings
from hypothesis import strategies as st
from pytensor.raise_op import Assert, CheckAndRaise

import synkhronos as synk

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[2]
POSITIVE = "rows must be positive"
RANGE = "rows out of range: {x}"  # braces: the message is not a format string


def _positive(x):
    return Assert(POSITIVE)(x, pt.all(x > 0))


def _chained(x):
    low = Assert("not too small")(x, pt.all(x > -10))
    return Assert("not too large")(low, pt.all(low < 10))


def _graphs(x, s):
    """Each function's ``(outputs, updates)``."""
    ranged = CheckAndRaise(RowsError, RANGE)(x, pt.all(pt.abs(x) < 100))
    return {
        "positive": ((_positive(x).sum(), "sum"), []),
        "custom": (((ranged * 2).sum(), "sum"), []),
        "chained": ((_chained(x).sum(), "sum"), []),
        "updates": ((_positive(x).sum(), "sum"), [(s, s + x.sum())]),
        "plain": (((x * 2).sum(), "sum"), []),
    }


@pytest.fixture(scope="module")
def session():
    assert str(pytensor.config.mode) == "Mode", "the ranks would not compile with JAX"
    try:
        synk.fork(2, use_gpu=False)
        x = pt.vector("x", dtype=pytensor.config.floatX)
        s = pytensor.shared(np.zeros(1, dtype=pytensor.config.floatX), name="s")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fns = {name: synk.function([x], outputs=outs, updates=ups)
                   for name, (outs, ups) in _graphs(x, s).items()}
            synk.distribute()
        yield fns, x, s, [str(w.message) for w in caught]
    finally:
        synk.close()


def _data(values):
    return synk.data(np.array(values, dtype=pytensor.config.floatX))


def _worker_error(fn, values):
    with pytest.raises(synk.WorkerError) as info:
        fn(_data(values))
    return info.value


def test_checked_functions_link_with_jax_and_keep_their_checks(session):
    from synkhronos._graph.jax_checks import JAXLinker

    fns, _, _, caught = session
    counts = {name: len(f._core.plain.maker.linker.checks) for name, f in fns.items()}
    assert all(isinstance(f._core.plain.maker.linker, JAXLinker) for f in fns.values())
    assert counts == {"positive": 1, "custom": 1, "chained": 2, "updates": 1, "plain": 0}
    assert not [m for m in caught if "Skipping" in m], caught  # PyTensor's warning as it drops a check


def test_a_graph_without_checks_runs_pytensors_jitted_function_itself(session):
    fns = session[0]
    jit_fn = fns["plain"]._core.plain.vm.jit_fn
    assert type(jit_fn).__name__ == "PjitFunction" and not hasattr(jit_fn, "checks")
    assert fns["plain"](_data([1, 2, 3, 4])) == 20


def test_an_assert_failing_on_rank_1_raises_worker_error(session):
    exc = _worker_error(session[0]["positive"], [1, 2, 3, -4])  # rank 1 gets [3, -4]
    assert (exc.rank, exc.exc_type) == (1, "AssertionError")
    assert exc.message.splitlines()[0] == POSITIVE
    assert "rank 1" in str(exc)


def test_on_the_masters_rank_the_check_raises_its_own_exception(session):
    with pytest.raises(AssertionError, match=POSITIVE):
        session[0]["positive"](_data([-1, 2, 3, 4]))


def test_check_and_raise_keeps_its_exception_type_and_message(session):
    exc = _worker_error(session[0]["custom"], [1, 2, 3, 400])
    assert (exc.rank, exc.exc_type) == (1, "RowsError")
    assert exc.message.splitlines()[0] == RANGE
    with pytest.raises(RowsError, match="out of range"):
        session[0]["custom"](_data([-400, 2, 3, 4]))


def test_the_first_of_chained_checks_raises_as_pytensor_raises_it(session):
    fns, x, _, _ = session
    python = pytensor.function([x], _chained(x).sum(), mode="FAST_COMPILE")
    for values, message in (([1, 2, 3, -20], "not too small"), ([1, 2, 3, 20], "not too large"),
                            ([1, 2, -20, 20], "not too small")):
        with pytest.raises(AssertionError, match=message):
            python(np.array(values[2:], dtype=x.dtype))  # rank 1's rows
        exc = _worker_error(fns["chained"], values)
        assert exc.rank == 1 and exc.message.splitlines()[0] == message
    assert fns["chained"](_data([1, 2, 3, 4])) == 10


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(-3, 6), min_size=1, max_size=9))
def test_a_check_changes_no_number_and_raises_where_pytensor_raises(session, values):
    fns, x, _, _ = session
    python = pytensor.function([x], _positive(x).sum(), mode="FAST_COMPILE")
    half = (len(values) + 1) // 2  # rank 0's rows; rank 1 gets the rest
    shares = [values[:half], values[half:]]
    fails = [rank for rank, share in enumerate(shares) if share and min(share) <= 0]
    try:
        got = fns["positive"](_data(values))
    except synk.WorkerError as exc:
        assert fails == [1] and exc.rank == 1 and exc.message.splitlines()[0] == POSITIVE
    except AssertionError as exc:
        assert fails[:1] == [0] and str(exc).splitlines()[0] == POSITIVE
    else:
        assert not fails
        assert got == python(np.array(values, dtype=x.dtype)) == sum(values)


def test_a_failed_check_applies_no_update_on_its_rank(session):
    """As PyTensor's linkers: the function raises before it updates, on the rank
    that failed; updates apply locally on each rank, so rank 0 updates."""
    fns, _, s, _ = session
    for rank in (0, 1):
        synk.set_value(rank, s, np.zeros(1, dtype=s.dtype))
    _worker_error(fns["updates"], [1, 2, 3, -4])
    assert [synk.get_value(r, s)[0] for r in (0, 1)] == [3.0, 0.0]
    assert fns["updates"](_data([1, 2, 3, 4])) == 10
    assert [synk.get_value(r, s)[0] for r in (0, 1)] == [6.0, 7.0]


def test_the_session_goes_on_after_a_failed_check(session):
    fns = session[0]
    _worker_error(fns["positive"], [1, 2, 3, -4])
    assert fns["positive"](_data([1, 2, 3, 4])) == 10
    assert fns["plain"](_data([1, 2, 3, -4])) == 4
    synk.set_value(1, session[2], np.full(1, 5.0, dtype=session[2].dtype))  # a collective
    assert synk.get_value(1, session[2])[0] == 5.0
