"""``synkhronos.pymc._gpu``: GPU ranks compute softplus (and the log of a
sigmoid, which PyTensor's stabilize makes one) with one exponential, as
``jax.nn.softplus``: PyTensor's values, a JAX form with one exponential, and a
rank that unpickles the graph gets that form."""

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pytensor.scalar.math import Sigmoid, Softplus

pytest.importorskip("pymc")  # synkhronos.pymc needs it

from _jax64 import jax_x64  # noqa: E402

from synkhronos._graph.editing import rewritten_in_turn  # noqa: E402
from synkhronos.pymc._gpu import ONE_EXP_SOFTPLUS, OneExpSoftplus  # noqa: E402

PLAIN = pytensor.compile.mode.Mode(optimizer=None)
FORMS = {
    "softplus(x)": pt.softplus,
    "log(sigmoid(x))": lambda x: pt.log(pt.sigmoid(x)),
    "log1p(-sigmoid(x))": lambda x: pt.log1p(-pt.sigmoid(x)),
    "log1p(-1 * sigmoid(x))": lambda x: pt.log1p(pt.mul(np.array(-1.0, x.dtype), pt.sigmoid(x))),
    "log(1 - sigmoid(x))": lambda x: pt.log(1 - pt.sigmoid(x)),
}
WANT = {"softplus(x)": lambda x: np.logaddexp(0, x), "log(sigmoid(x))": lambda x: -np.logaddexp(0, -x)}


@pytest.fixture(autouse=True, scope="module")
def x64():
    """JAX's 64-bit mode, which float64 ranks run in: whatever a test before in
    this process left (a float32 session turns it off), JAX-mode functions of
    float64 here compute in float64."""
    with jax_x64():
        yield


def with_one_exp_softplus(outputs):
    return rewritten_in_turn(outputs, *ONE_EXP_SOFTPLUS)


def _ops(outputs, kind):
    return [n.op.scalar_op for n in pytensor.graph.traversal.apply_ancestors(outputs)
            if isinstance(getattr(n.op, "scalar_op", None), kind)]


def _jax_exps(outputs, inputs, *args):
    """How many exponentials XLA is given for ``outputs``' JAX form."""
    import jax
    from pytensor.graph.fg import FunctionGraph
    from pytensor.link.jax.dispatch import jax_funcify

    fn = jax_funcify(FunctionGraph(inputs, outputs, clone=True))
    return jax.jit(fn).lower(*args).as_text().count("exponential")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(FORMS)), st.sampled_from(["float64", "float32"]),
       st.integers(1, 5).flatmap(lambda n: hnp.arrays(
           np.float64, n, elements=st.floats(-800, 800) | st.sampled_from(
               [np.nan, np.inf, -np.inf, -37.5, 18.0, 33.3, 40.0, -1e-30]))))
def test_the_values_are_pytensors_and_jax_gets_one_exponential(form, dtype, xv):
    x = pt.vector("x", dtype=dtype)
    xv = xv.astype(dtype)
    out = FORMS[form](x)
    [new] = with_one_exp_softplus([pytensor.graph.replace.clone_replace(out)])
    kinds = {type(op) for op in _ops([new], Softplus)}
    assert kinds == {OneExpSoftplus} and not _ops([new], Sigmoid), kinds
    plain = pytensor.function([x], with_one_exp_softplus([pytensor.graph.replace.clone_replace(out)])[0],
                              mode=PLAIN)(xv)  # PyTensor's softplus (the Python linker)
    jaxed = np.asarray(pytensor.function([x], new, mode="JAX")(xv))
    assert jaxed.dtype == plain.dtype == np.dtype(dtype)
    tol = dict(rtol=1e-14, atol=1e-300) if dtype == "float64" else dict(rtol=2e-6, atol=1e-37)
    np.testing.assert_allclose(jaxed, plain, **tol)
    if form in WANT and dtype == "float64":
        with np.errstate(invalid="ignore"):  # NaN in, NaN out
            want = WANT[form](xv)
        np.testing.assert_allclose(jaxed, want, rtol=1e-14, atol=1e-300)
    assert _jax_exps([new], [x], xv) == 1


def test_pytensors_softplus_gives_jax_three_exponentials():
    """What the rewrite is for (the test above fails without it)."""
    x = pt.vector("x")
    assert _jax_exps([pt.softplus(x)], [x], np.zeros(3)) == 3


def test_the_gradient_is_softpluss():
    x = pt.vector("x")
    [new] = with_one_exp_softplus([pt.softplus(x)])
    xv = np.array([-50.0, -1.0, 0.0, 2.0, 40.0])
    got = pytensor.function([x], pytensor.grad(new.sum(), x), mode="JAX")(xv)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-xv)), rtol=1e-15)


def test_a_rank_unpickling_the_graph_gets_the_jax_form():
    """A rank imports the module when it unpickles the Op, and registers the
    JAX form then, before it compiles: one exponential."""
    x = pt.vector("x")
    blob = pickle.dumps(with_one_exp_softplus([pt.softplus(x)]))
    code = textwrap.dedent("""
        import pickle, sys
        import numpy as np
        from pytensor.graph.traversal import graph_inputs
        from pytensor.link.jax.dispatch import jax_funcify
        outputs = pickle.loads(sys.stdin.buffer.read())
        from synkhronos.pymc._gpu import OneExpSoftplus
        assert OneExpSoftplus in jax_funcify.registry
        import jax
        from pytensor.graph.fg import FunctionGraph
        [x] = [v for v in graph_inputs(outputs) if v.name == "x"]
        fn = jax.jit(jax_funcify(FunctionGraph([x], outputs, clone=True)))
        print(fn.lower(np.zeros(3)).as_text().count("exponential"))
    """)
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split()[-1] == "1"
