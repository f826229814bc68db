"""The JAX linker that keeps checks (``synkhronos._graph.jax_checks``), in one
process with plain ``pytensor.function``: a failed ``Assert`` or ``CheckAndRaise``
raises its own exception with its own message, as PyTensor's Python linker
does, and a check that passes changes no number; a graph with no check is linked
exactly as PyTensor's JAX linker links it; other functions are unchanged."""

import pickle
import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytensor.raise_op import Assert, CheckAndRaise

pytest.importorskip("jax")

from synkhronos._graph.jax_checks import JAXLinker, checked_mode, checks_kept  # noqa: E402
from synkhronos._graph.jax_shapes import ConcreteCheck, jax_mode  # noqa: E402

FX = "float64"


class RangeError(ValueError):
    """A user's exception type, raised by their ``CheckAndRaise``."""


def _mode():
    return checked_mode(jax_mode("JAX"))


def _both(inputs, outputs, **kwargs):
    """``(JAX with checks kept, PyTensor's Python linker)`` functions of one graph."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a check dropped with a warning fails here
        kept = pytensor.function(inputs, outputs, mode=_mode(), **kwargs)
    return kept, pytensor.function(inputs, outputs, mode="FAST_COMPILE", **kwargs)


def _raised(fn, *args):
    """``(type, message)`` of what ``fn(*args)`` raises, or None.  The message's
    first line: PyTensor 2 appends the node that raised to it."""
    try:
        fn(*args)
    except Exception as exc:
        return type(exc), str(exc).splitlines()[0]
    return None


def _positive(x):
    return Assert("rows must be positive")(x, pt.all(x > 0))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, 5), min_size=0, max_size=12))
def test_an_assert_raises_where_the_python_linker_raises_and_agrees_elsewhere(values):
    x = pt.vector("x", dtype=FX)
    kept, python = _both([x], (_positive(x) * 2).sum())
    data = np.array(values, dtype=FX)
    want = _raised(python, data)
    assert _raised(kept, data) == want
    if want is None:
        assert kept(data) == python(data) == 2 * sum(values)
    else:
        assert want == (AssertionError, "rows must be positive") and min(values) <= 0


def test_check_and_raise_keeps_its_exception_type_and_message():
    x = pt.vector("x", dtype=FX)
    message = "rows out of range: {x} {0}"  # braces stay as they are
    out = CheckAndRaise(RangeError, message)(x, pt.all(x < 10), pt.all(x > -10)) * 3
    kept, python = _both([x], out)
    for bad in ([1.0, 20.0], [-20.0, 1.0]):
        assert _raised(kept, np.array(bad)) == _raised(python, np.array(bad)) == (RangeError, message)
    np.testing.assert_array_equal(kept(np.array([1.0, 2.0])), [3.0, 6.0])


def test_the_first_of_chained_checks_raises_as_with_the_python_linker():
    x = pt.vector("x", dtype=FX)
    low = Assert("not too small")(x, pt.all(x > -10))
    high = Assert("not too large")(low, pt.all(low < 10))
    kept, python = _both([x], high.sum())
    assert len(kept.maker.linker.checks) == 2
    for data, message in (([1.0, -20.0], "not too small"), ([1.0, 20.0], "not too large"),
                          ([-20.0, 20.0], "not too small"), ([1.0, 2.0], None)):
        want = None if message is None else (AssertionError, message)
        assert _raised(kept, np.array(data)) == _raised(python, np.array(data)) == want


def test_a_failed_check_applies_no_update():
    x = pt.vector("x", dtype=FX)
    for mode in (_mode(), "FAST_COMPILE"):
        s = pytensor.shared(np.zeros(1), name="s")
        f = pytensor.function([x], _positive(x).sum(), updates=[(s, s + x.sum())], mode=mode)
        with pytest.raises(AssertionError, match="rows must be positive"):
            f(np.array([1.0, -2.0]))
        assert s.get_value()[0] == 0.0, mode
        f(np.array([1.0, 2.0]))
        assert s.get_value()[0] == 3.0, mode


def test_a_check_inside_scan_is_kept():
    x = pt.vector("x", dtype=FX)

    def step(value, total):
        return total + Assert("each value positive")(value, pt.gt(value, 0))

    start = pt.constant(0.0, dtype=FX)
    total = pytensor.scan(step, sequences=[x], outputs_info=[start], return_updates=False)
    kept, python = _both([x], total[-1])
    assert kept(np.array([1.0, 2.0])) == 3.0
    bad = np.array([1.0, -1.0, 2.0])
    assert _raised(kept, bad) == _raised(python, bad) == (AssertionError, "each value positive")


def test_shapes_given_as_inputs_stay_static_under_the_checks():
    """PyTensor passes a scalar input used only as a shape as a Python int (static
    under ``jax.jit``); the checked function keeps it out of checkify's tracing."""
    x, n = pt.vector("x", dtype=FX), pt.lscalar("n")
    kept, _ = _both([x, n], _positive(x).reshape((n, 2)).sum(axis=1))
    assert kept.maker.linker.scalar_shape_inputs == (1,)
    np.testing.assert_array_equal(kept(np.arange(1.0, 5.0), 2), [3.0, 7.0])
    assert _raised(kept, np.array([1.0, 2.0, -3.0, 4.0]), 2) == (AssertionError, "rows must be positive")


def test_a_graph_without_checks_is_linked_as_pytensor_links_it():
    x = pt.vector("x", dtype=FX)
    ours = pytensor.function([x], (x * 2).sum(), mode=_mode())
    theirs = pytensor.function([x], (x * 2).sum(), mode=jax_mode("JAX"))
    assert isinstance(ours.maker.linker, JAXLinker) and ours.maker.linker.checks == ()
    assert type(ours.vm.jit_fn) is type(theirs.vm.jit_fn)  # the jitted function itself: no wrapper
    assert not hasattr(ours.vm.jit_fn, "checks")
    checked = pytensor.function([x], _positive(x).sum(), mode=_mode())
    assert checked.vm.jit_fn.checks == checked.maker.linker.checks != ()


def test_checks_of_checked_shapes_are_checked_as_jax_traces():
    """A shape that a check passed on is a shape still: a check on it is checked
    while JAX traces (``ConcreteCheck``, nothing per call), not on the checked
    path.  (A batched PyMC graph checks that broadcast shapes agree so.)"""
    x, y, z = pt.vector("x", dtype=FX), pt.vector("y", dtype=FX), pt.vector("z", dtype=FX)
    ny = Assert("y and z differ")(y.shape[0], pt.eq(y.shape[0], z.shape[0]))
    nx = Assert("x and y differ")(x.shape[0], pt.eq(x.shape[0], ny))
    kept, python = _both([x, y, z], x.sum() * nx + y.sum() + z.sum())
    assert kept.maker.linker.checks == ()
    assert sum(isinstance(n.op, ConcreteCheck) for n in kept.maker.fgraph.toposort()) == 2
    for sizes in ((3, 3, 2), (2, 3, 3), (3, 3, 3)):
        args = [np.ones(n) for n in sizes]
        assert _raised(kept, *args) == _raised(python, *args)
    assert kept(np.ones(3), np.ones(3), np.ones(3)) == 15.0


def test_a_graph_converted_only_to_try_keeps_its_checks_without_warning():
    from pytensor.graph.fg import FunctionGraph
    from pytensor.link.jax.dispatch import jax_funcify

    x = pt.vector("x", dtype=FX)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with checks_kept() as checks:
            jax_funcify(FunctionGraph([x], [_positive(x).sum()], clone=True))
    assert [c.msg for c in checks] == ["rows must be positive"]


def test_other_pytensor_functions_are_unchanged():
    """A user's own ``mode="JAX"`` function keeps PyTensor's behaviour: the check
    dropped (with PyTensor's warning, unless a library such as PyMC registered a
    silent form of its own in this process)."""
    x = pt.vector("x", dtype=FX)
    _mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = pytensor.function([x], _positive(x).sum(), mode="JAX")
    assert plain(np.array([1.0, -2.0])) == -1.0
    assert not caught or any("Skipping" in str(w.message) for w in caught)


def test_a_pickled_function_keeps_its_checks():
    """Functions reach the ranks pickled, and are linked again there."""
    x = pt.vector("x", dtype=FX)
    f = pytensor.function([x], _positive(x).sum(), mode=_mode())
    g = pickle.loads(pickle.dumps(f))
    assert isinstance(g.maker.linker, JAXLinker) and len(g.maker.linker.checks) == 1
    assert _raised(g, np.array([-1.0])) == (AssertionError, "rows must be positive")


def test_synkhronos_jax_functions_link_with_it():
    from synkhronos._graph.function_core import is_jax_mode
    from synkhronos._graph.linking import device_kwargs

    class Device:
        precision = "highest"

        def function_kwargs(self, kwargs):
            return dict(kwargs, mode="JAX")

    mode = device_kwargs(Device(), {})["mode"]
    assert isinstance(mode.linker, JAXLinker) and is_jax_mode(mode)
    assert checked_mode(mode) is mode


def test_a_check_form_a_library_registers_later_does_not_drop_the_check():
    """PyMC's ``pymc.sampling.jax`` registers a pass-through conversion for
    ``Assert`` when imported, which would win over the one for ``CheckAndRaise``:
    the linker's checks are kept whatever was registered since, and other
    functions get the library's form."""
    from pytensor.link.jax.dispatch import jax_funcify

    before = jax_funcify.registry.get(Assert)

    @jax_funcify.register(Assert)
    def _passes(op, **kwargs):  # as PyMC's
        return lambda value, *conditions: value

    try:
        x = pt.vector("x", dtype=FX)
        kept, _ = _both([x], _positive(x).sum())
        assert _raised(kept, np.array([1.0, -2.0])) == (AssertionError, "rows must be positive")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = pytensor.function([x], _positive(x).sum(), mode="JAX")
        assert plain(np.array([1.0, -2.0])) == -1.0  # the library's form: no check
    finally:  # (singledispatch cannot unregister: Assert gets back what it resolved to)
        jax_funcify.register(Assert)(before or jax_funcify.dispatch(CheckAndRaise))
