"""``synkhronos.pymc._checks``: the two rewrites of PyMC's parameter checks in the
ranks' batched graphs keep every value, NaN and infinities included, and leave
every other graph as it was."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.rewriting.basic import in2out
from pytensor.graph.traversal import apply_ancestors
from pytensor.scalar.basic import Exp, Switch
from pytensor.scalar.math import Sigmoid
from pytensor.tensor.elemwise import CAReduce

pytest.importorskip("pymc")  # synkhronos.pymc needs it

from synkhronos.pymc._checks import bounded_checks, summed_checks  # noqa: E402

VALUES = [-np.inf, -800.0, -40.0, -1.0, -0.0, 0.0, 1e-300, 2.0, 40.0, 800.0, np.inf, np.nan]
PLAIN = pytensor.compile.mode.Mode(optimizer=None)


def _rewritten(rule, out, inputs=None):
    """The rewritten copy of ``out``, and its copies of ``inputs``."""
    fgraph = FunctionGraph(inputs=inputs, outputs=[out], clone=True)
    in2out(rule).rewrite(fgraph)
    return fgraph.outputs[0], fgraph.inputs


def _nodes(out, kind):
    return [n for n in apply_ancestors([out]) if isinstance(getattr(n.op, "scalar_op", None), kind)]


def _summed_switches(out):
    return [n for n in apply_ancestors([out]) if isinstance(n.op, CAReduce) and n.inputs[0].owner is not None
            and isinstance(getattr(n.inputs[0].owner.op, "scalar_op", None), Switch)]


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
def _check_sum(fill, axis=1):
    """sum over ``axis`` of switch(ok, x, fill), ``ok`` one per point (K, 1)."""
    ok, x = pt.matrix("ok", dtype="bool", shape=(None, 1)), pt.matrix("x")
    return ok, x, pt.sum(pt.switch(ok, x, fill), axis=axis)


@pytest.mark.parametrize("fill", [-np.inf, 0.0])
@pytest.mark.parametrize("rows", [0, 1, 5])
def test_a_sum_of_a_checked_term_checks_its_sum_with_the_same_values(fill, rows):
    ok, x, out = _check_sum(fill)
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

    from synkhronos.pymc._checks import parameter_checks
    from synkhronos.pymc._model import _batched

    def compared_sigmoids(out):
        return [n for n in _nodes(out, (pytensor.scalar.basic.GE, pytensor.scalar.basic.LE))
                if any(_nodes(v, Sigmoid) for v in n.inputs)]

    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Bernoulli("y", logit_p=pt.as_tensor(np.ones((5, 2))) @ b, observed=np.ones(5, dtype="int64"))
    b_value = model.rvs_to_values[b]
    logp = parameter_checks([model.logp(vars=model.observed_RVs)], check_bounds=True)[0]
    assert compared_sigmoids(logp)
    params, (batched,) = _batched([b_value], [logp])
    assert params[0] is not b_value, "the graph was batched"
    assert not compared_sigmoids(batched) and not _summed_switches(batched)
