"""``synkhronos.pymc._gradient``: ``log1p(-1 * sigmoid(x))`` as ``-softplus(x)``,
the same values to rounding and a gradient that stays finite where sigmoid
rounds to 1 (as PyTensor 3.3's stabilize gives it; PyTensor 2.38's does not)."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pytensor.scalar.math import Sigmoid, Softplus

pytest.importorskip("pymc")  # synkhronos.pymc needs it

from synkhronos.pymc._gradient import stabilized  # noqa: E402

PLAIN = pytensor.compile.mode.Mode(optimizer=None)


def _ops(var, kind):
    return [n for n in pytensor.graph.traversal.apply_ancestors([var])
            if isinstance(getattr(n.op, "scalar_op", None), kind)]


def _minus_one_times(s, form):
    return {"mul(-1, s)": pt.mul(np.array(-1.0), s), "mul(s, [-1])": pt.mul(s, np.array([-1.0])),
            "neg(s)": -s}[form]


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 6),
                  elements=st.floats(-800, 800) | st.sampled_from([np.nan, 37.5])),
       st.sampled_from(["mul(-1, s)", "mul(s, [-1])"]))
def test_the_values_stay_and_the_gradient_is_finite(xv, form):
    x = pt.vector("x")
    out = pt.log1p(_minus_one_times(pt.sigmoid(x), form))
    new = stabilized(pytensor.graph.replace.clone_replace(out))
    assert _ops(new, Softplus) and not _ops(new, Sigmoid)
    got, want = (pytensor.function([x], v, mode=PLAIN)(xv) for v in (new, out))
    np.testing.assert_allclose(got, -np.logaddexp(0.0, xv), rtol=1e-14)  # -softplus(x), exactly
    # The graph as written loses digits as sigmoid nears 1, and gives -inf once it rounds to 1.
    close = xv < 30
    np.testing.assert_allclose(got[close], want[close], rtol=1e-3, atol=1e-300)
    grad = pytensor.function([x], pytensor.grad(new.sum(), x), mode=PLAIN)(xv)
    assert np.all(np.isfinite(grad) | np.isnan(xv)), "the gradient is -sigmoid(x)"


@pytest.mark.parametrize("out", [
    lambda x: pt.log1p(pt.mul(np.array(-2.0), pt.sigmoid(x))),  # not -1
    lambda x: pt.log1p(pt.mul(np.array(-1.0), pt.exp(x))),  # not a sigmoid
    lambda x: pt.log(pt.mul(np.array(-1.0), pt.sigmoid(x))),  # not log1p
], ids=["times -2", "exp", "log"])
def test_other_graphs_are_left_alone(out):
    x = pt.vector("x")
    graph = out(x)
    assert not _ops(stabilized(pytensor.graph.replace.clone_replace(graph)), Softplus)
