"""``synkhronos.pymc._cpu``: CPU ranks' own linkers get a GLM's two products as
elementwise work over the rows (``X @ b`` as per-feature products, ``X^T @ r`` as
one sum per feature), which keeps every value (to the rounding of a sum in
another order) across the limit on features and sums, and leaves other
products alone; a bambi-like likelihood's gradient is then one pass over the
rows (no product left), with the values of PyTensor's own graph."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytensor.graph.traversal import apply_ancestors
from pytensor.tensor.math import Dot

pytest.importorskip("pymc")  # synkhronos.pymc needs it

from synkhronos._graph.editing import rewritten  # noqa: E402
from synkhronos.pymc._cpu import FEW, products_as_row_sums  # noqa: E402

PLAIN = pytensor.compile.mode.Mode(optimizer=None)


def _dots(outputs):
    return [n for n in apply_ancestors(outputs)
            if isinstance(n.op, Dot) or isinstance(getattr(n.op, "core_op", None), Dot)]


# rows x d features against d x m (summed over d), and k x rows against rows x m
# (a sum over the rows per entry, k * m of them).
SIDES = {"inner": lambda k, d, m, n: ((None, d), (d, m), (n, d), (d, m)),
         "rows": lambda k, d, m, n: ((k, None), (None, m), (k, n), (n, m))}


@settings(max_examples=60, deadline=None)
@given(side=st.sampled_from(sorted(SIDES)), k=st.integers(1, 4), d=st.integers(1, FEW), m=st.integers(1, 4),
       n=st.integers(0, 40), seed=st.integers(0, 2**16), dtype=st.sampled_from(["float64", "float32"]))
def test_products_as_row_sums_keep_the_values(side, k, d, m, n, seed, dtype):
    a_static, b_static, a_shape, b_shape = SIDES[side](k, d, m, n)
    a = pt.tensor("a", dtype=dtype, shape=a_static)
    b = pt.tensor("b", dtype=dtype, shape=b_static)
    out = pt.dot(a, b)
    (new,) = rewritten([out], products_as_row_sums)
    assert not _dots([new]), "the product is written out"
    assert new.type == out.type
    rng = np.random.default_rng(seed)
    av, bv = rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)
    got = pytensor.function([a, b], new, mode=PLAIN)(av, bv)
    tol = 1e-5 if dtype == "float32" else 1e-12
    want = av.astype("float64") @ bv.astype("float64")
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(d, n))


@pytest.mark.parametrize("matmul", [False, True], ids=["dot", "@"])
@pytest.mark.parametrize("a_static, b_static", [
    ((None, None), (None, None)),  # no static side
    ((None, FEW + 1), (FEW + 1, 1)),  # more features than FEW
    ((None, 0), (0, 1)),  # none at all
    ((5, None), (None, 4)),  # 20 sums: more than FEW
])
def test_other_products_are_left_alone(a_static, b_static, matmul):
    a, b = pt.tensor("a", shape=a_static), pt.tensor("b", shape=b_static)
    out = a @ b if matmul else pt.dot(a, b)
    assert len(_dots(rewritten([out], products_as_row_sums))) == 1


@pytest.mark.parametrize("matmul", [False, True], ids=["pt.dot", "@"])
def test_a_glms_gradient_is_one_pass_over_the_rows(matmul):
    """``y ~ N(X @ b + u[g], s)``, its log-density and gradient for ``b``, ``u``
    and ``s``: no product left, and the values of the graph as written."""
    from synkhronos._graph.expand_dims import expand_dims_sunk_mode

    x, y, g = pt.matrix("x", shape=(None, 3)), pt.vector("y"), pt.vector("g", dtype="uint8")
    b, u, s = pt.vector("b", shape=(3,)), pt.vector("u", shape=(4,)), pt.scalar("s")
    mu = (x @ b if matmul else pt.dot(x, b)) + u[g]
    logp = (-0.5 * ((y - mu) / s) ** 2 - pt.log(s)).sum()
    outputs = [logp, *pytensor.grad(logp, [b, u, s])]
    new = rewritten(list(pytensor.graph.replace.clone_replace(outputs, {})), products_as_row_sums)
    assert _dots(outputs) and not _dots(new)
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((50, 3)), rng.standard_normal(50), rng.integers(0, 4, 50).astype("uint8"),
            rng.standard_normal(3), rng.standard_normal(4), 1.3)
    mode = expand_dims_sunk_mode(pytensor.compile.mode.Mode(optimizer="fast_run"))
    want = pytensor.function([x, y, g, b, u, s], outputs, mode=PLAIN)(*args)
    got = pytensor.function([x, y, g, b, u, s], new, mode=mode)(*args)
    for w, v in zip(want, got):
        np.testing.assert_allclose(v, w, rtol=1e-12, atol=1e-12)
