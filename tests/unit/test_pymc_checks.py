"""``synkhronos.pymc._vectorized``: the two rewrites of PyMC's parameter checks in the
ranks' batched graphs keep every value, NaN and infinities included, and leave
every other graph as it was."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.basic import in2out
from pytensor.graph.traversal import apply_ancestors
from pytensor.scalar.basic import Exp, Switch
from pytensor.scalar.math import Sigmoid
from pytensor.tensor.basic import Alloc
from pytensor.tensor.elemwise import CAReduce

pytest.importorskip("pymc")  # synkhronos.pymc needs it

from synkhronos.pymc._vectorized import bounded_checks, summed_checks  # noqa: E402

VALUES = [-np.inf, -800.0, -40.0, -1.0, -0.0, 0.0, 1e-300, 2.0, 40.0, 800.0, np.inf, np.nan]
PLAIN = pytensor.compile.mode.Mode(optimizer=None)


def _rewritten(rule, out, inputs=None):
    """The rewritten copy of ``out``, and its copies of ``inputs``."""
    fgraph = FunctionGraph(inputs=inputs, outputs=[out], clone=True)
    in2out(rule).rewrite(fgraph)
    return fgraph.outputs[0], fgraph.inputs


def _nodes(out, kind):
    return [n for n in apply_ancestors([out]) if isinstance(getattr(n.op, "scalar_op", None), kind)]


def _switch_under(var):
    """The switch that ``var`` is, or that an Alloc broadcasts (as vectorized graphs have it)."""
    node = var.owner
    if node is not None and isinstance(node.op, Alloc):
        node = node.inputs[0].owner
    return node if node is not None and isinstance(getattr(node.op, "scalar_op", None), Switch) else None


def _summed_switches(out, same_for_every_row=False):
    """The sums of a switch; with ``same_for_every_row``, only those whose
    condition is the same along the summed axes (what ``summed_checks`` takes)."""
    found = []
    for n in apply_ancestors([out]):
        switch = _switch_under(n.inputs[0]) if isinstance(n.op, CAReduce) else None
        if switch is None:
            continue
        axes = range(n.inputs[0].ndim) if n.op.axis is None else n.op.axis
        if not same_for_every_row or all(switch.inputs[0].type.broadcastable[a] for a in axes):
            found.append(n)
    return found


# --------------------------------------------------------------- bounded_checks
RANGE_CHECKS = {
    "0 <= sigmoid": lambda x: pt.le(0, pt.sigmoid(x)),
    "sigmoid >= 0": lambda x: pt.ge(pt.sigmoid(x), 0),
    "sigmoid <= 1": lambda x: pt.le(pt.sigmoid(x), 1),
    "1 >= sigmoid": lambda x: pt.ge(1.0, pt.sigmoid(x)),
    "sigmoid >= -2": lambda x: pt.ge(pt.sigmoid(x), -2),
    "both": lambda x: pt.and_(pt.ge(pt.sigmoid(x), 0), pt.le(pt.sigmoid(x), 1)),
    "exp >= 0": lambda x: pt.ge(pt.exp(x), 0),
    "inf >= exp": lambda x: pt.ge(np.inf, pt.exp(x)),
}


@pytest.mark.parametrize("name", list(RANGE_CHECKS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_range_check_becomes_a_nan_test_with_the_same_values(name, dtype):
    x = pt.matrix("x", dtype=dtype)
    out = RANGE_CHECKS[name](x)
    new, (new_x,) = _rewritten(bounded_checks, out, [x])
    assert _nodes(new, (Sigmoid, Exp)) == [], "the link function is gone from the check"
    value = np.array([VALUES, VALUES[::-1]], dtype=dtype)
    got = pytensor.function([new_x], new, mode=PLAIN)(value)
    np.testing.assert_array_equal(got, pytensor.function([x], out, mode=PLAIN)(value))
    np.testing.assert_array_equal(got, ~np.isnan(value))


OTHER_CHECKS = {
    "sigmoid > 0": lambda x: pt.gt(pt.sigmoid(x), 0),  # sigmoid(-inf) == 0
    "sigmoid >= 0.5": lambda x: pt.ge(pt.sigmoid(x), 0.5),
    "sigmoid <= 0.9": lambda x: pt.le(pt.sigmoid(x), 0.9),
    "exp <= 1e300": lambda x: pt.le(pt.exp(x), 1e300),
    "exp >= a variable": lambda x: pt.ge(pt.exp(x), pt.scalar("z")),
    "tanh >= -1": lambda x: pt.ge(pt.tanh(x), -1),
    "a bound that broadcasts the check": lambda x: pt.ge(pt.sigmoid(x), np.zeros((3, 1))),
}


@pytest.mark.parametrize("name", list(OTHER_CHECKS))
def test_other_comparisons_are_left_as_they_were(name):
    out = OTHER_CHECKS[name](pt.vector("x"))
    new = _rewritten(bounded_checks, out)[0]
    links = (Sigmoid, Exp)
    assert new.owner.op == out.owner.op and len(_nodes(new, links)) == len(_nodes(out, links))


# ---------------------------------------------------------------- summed_checks
def _check_sum(fill, axis=1, alloc=False):
    """sum over ``axis`` of switch(ok, x, fill), ``ok`` one per point (K, 1);
    with ``alloc`` the switch broadcast to x's shape first, as PyTensor's
    vectorized graphs have it."""
    ok, x = pt.matrix("ok", dtype="bool", shape=(None, 1)), pt.matrix("x")
    checked = pt.switch(ok, x, fill)
    return ok, x, pt.sum(pt.alloc(checked, *x.shape) if alloc else checked, axis=axis)


@pytest.mark.parametrize("fill", [-np.inf, 0.0])
@pytest.mark.parametrize("rows", [0, 1, 5])
@pytest.mark.parametrize("alloc", [False, True])
def test_a_sum_of_a_checked_term_checks_its_sum_with_the_same_values(fill, rows, alloc):
    ok, x, out = _check_sum(fill, alloc=alloc)
    new, inputs = _rewritten(summed_checks, out, [ok, x])
    assert _summed_switches(new) == [], "the switch is outside the sum"
    rng = np.random.default_rng(rows)
    xv = rng.standard_normal((4, rows))
    if rows:
        xv[2, 0], xv[3, -1] = np.nan, -np.inf
    okv = np.array([[True], [False], [True], [False]])
    got = pytensor.function(inputs, new, mode=PLAIN)(okv, xv)
    np.testing.assert_array_equal(got, pytensor.function([ok, x], out, mode=PLAIN)(okv, xv))


OTHER_SUMS = {
    "a check that differs by row": lambda ok, x: pt.sum(pt.switch(pt.lt(x, 0), x, -np.inf), axis=1),
    "a fill other than 0 and -inf": lambda ok, x: pt.sum(pt.switch(ok, x, 1.0), axis=1),
    "a fill of -0.0 (their sum is -0.0)": lambda ok, x: pt.sum(pt.switch(ok, x, -0.0), axis=1),
    "a sum over the points' axis": lambda ok, x: pt.sum(pt.switch(ok, x, -np.inf), axis=0),
    "a product": lambda ok, x: pt.prod(pt.switch(ok, x, 0.0), axis=1),
    "a term that broadcasts": lambda ok, x: pt.sum(pt.switch(ok, x[0], -np.inf), axis=1),
}


@pytest.mark.parametrize("name", list(OTHER_SUMS))
def test_other_sums_are_left_as_they_were(name):
    ok, x = pt.matrix("ok", dtype="bool", shape=(None, 1)), pt.matrix("x")
    out = OTHER_SUMS[name](ok, x)
    assert len(_summed_switches(_rewritten(summed_checks, out)[0])) == len(_summed_switches(out)) == 1


# --------------------------------------------------------- on PyMC's own graph
def test_the_bernoullis_batched_graph_gets_both_rewrites():
    """``_batched``, which builds the ranks' batched graph, rewrites PyMC's own
    Bernoulli log-density: no comparison of a sigmoid, no switch inside a sum."""
    import pymc as pm

    from synkhronos.pymc._gradient import parameter_checks
    from synkhronos.pymc._vectorized import _batched

    def compared_sigmoids(out):
        return [n for n in _nodes(out, (pytensor.scalar.basic.GE, pytensor.scalar.basic.LE))
                if any(_nodes(v, Sigmoid) for v in n.inputs)]

    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Bernoulli("y", logit_p=pt.as_tensor(np.ones((5, 2))) @ b, observed=np.ones(5, dtype="int64"))
    b_value = model.rvs_to_values[b]
    total = model.logp(vars=model.observed_RVs)
    logp = parameter_checks([total], check_bounds=True)[0]
    assert compared_sigmoids(logp)
    params, (batched,) = _batched([b_value], [logp], [total], True)
    assert params[0] is not b_value, "the graph was batched"
    assert not compared_sigmoids(batched) and not _summed_switches(batched, same_for_every_row=True)
    assert _summed_switches(batched), "the check of the observed values differs by row: left as it was"


# ----------------------------------------------------------- property tests
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)
# Whole numbers add up exactly in any order, so two graphs that sum in different
# orders must agree to the bit; NaN and infinities still propagate.
EXACT = st.one_of(st.integers(-2**40, 2**40).map(float), st.sampled_from([np.nan, np.inf, -np.inf]))


@st.composite
def checked_sums(draw):
    """A check constant along some axes of a 1- to 3-d term, summed over some of
    those axes, with its values (any sizes, 0 included)."""
    ndim = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim))
    along = draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim))  # ok does not vary along
    summed = [i for i in range(ndim) if along[i] and draw(st.booleans())]
    ok_shape = [1 if a else n for a, n in zip(along, shape)]
    ok = draw(hnp.arrays(bool, ok_shape))
    x = draw(hnp.arrays(np.float64, shape, elements=EXACT))
    fill = draw(st.sampled_from([-np.inf, 0.0]))
    # Broadcast by an Alloc (a vectorized graph's) to a shape larger along x's 1s, or not.
    grown = draw(st.none() | st.tuples(*[st.integers(1, 3) if n == 1 else st.just(n) for n in shape]))
    return ok, x, fill, summed or None, grown


@settings(max_examples=80, deadline=None)
@given(checked_sums())
def test_summed_checks_keep_every_value(case):
    """Against the graph as written, on every shape, axes and values drawn."""
    okv, xv, fill, axis, grown = case
    static = tuple(1 if a != b else None for a, b in zip(okv.shape, xv.shape))  # ok broadcasts there
    if grown is not None:  # an Alloc broadcasts only what is known to have length 1
        static = tuple(1 if n == 1 else None for n in okv.shape)
    ok = pt.tensor("ok", dtype="bool", shape=static)
    x = pt.tensor("x", dtype="float64", shape=tuple(1 if grown and n == 1 else None for n in xv.shape))
    checked = pt.switch(ok, x, fill)
    out = pt.sum(checked if grown is None else pt.alloc(checked, *grown), axis=axis)
    new, inputs = _rewritten(summed_checks, out, [ok, x])
    want = pytensor.function([ok, x], out, mode=PLAIN)(okv, xv)
    np.testing.assert_array_equal(pytensor.function(inputs, new, mode=PLAIN)(okv, xv), want)


@settings(max_examples=120, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, min_side=0, max_side=5), elements=FLOATS),
       st.sampled_from([pt.sigmoid, pt.exp]), st.sampled_from([pt.ge, pt.le]), st.booleans(),
       st.sampled_from([-np.inf, -2.0, -0.0, 0.0, 1e-300, 0.5, 1.0, 2.0, np.inf]))
def test_comparisons_of_a_link_keep_every_value(xv, link, compare, link_first, bound):
    """Any bound, either side: rewritten or not, the same truth values."""
    x = pt.tensor("x", dtype="float64", shape=(None,) * xv.ndim)
    out = compare(link(x), bound) if link_first else compare(bound, link(x))
    new, (new_x,) = _rewritten(bounded_checks, out, [x])
    np.testing.assert_array_equal(pytensor.function([new_x], new, mode=PLAIN)(xv),
                                  pytensor.function([x], out, mode=PLAIN)(xv))
