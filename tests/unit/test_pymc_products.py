"""``synkhronos.pymc._gpu``'s products with a few features, written as
elementwise products and sums for the GPU ranks, keep every value (to the
rounding of a sum in another order) and leave other products alone."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import apply_ancestors
from pytensor.tensor.elemwise import DimShuffle
from pytensor.tensor.math import Dot

pytest.importorskip("pymc")  # synkhronos.pymc needs it

from synkhronos._graph.editing import rewritten  # noqa: E402
from synkhronos.pymc._gpu import FEW, _transposed, few_feature_products  # noqa: E402

PLAIN = pytensor.compile.mode.Mode(optimizer=None)


def feature_sums(outputs):
    return rewritten(outputs, few_feature_products)


def _dots(outputs):
    return [n for n in apply_ancestors(outputs) if isinstance(n.op, Dot)]


def _product(a_static, b_static, dtype="float64", b_form="plain"):
    """``a @ b`` with ``b`` an input or (``b_form``) an input ``c`` transposed."""
    a = pt.tensor("a", dtype=dtype, shape=a_static)
    if b_form == "plain":
        b = pt.tensor("b", dtype=dtype, shape=b_static)
        return a, b, pt.dot(a, b)
    c = pt.tensor("c", dtype=dtype, shape=b_static[::-1])
    return a, c, pt.dot(a, B_FORMS[b_form](c))


def _through_3d(c):
    """``c.T`` as a batched graph has it: a point's axis added, the others
    swapped, the point's axis dropped."""
    return c[None].dimshuffle(0, 2, 1).dimshuffle(1, 2)


B_FORMS = {"plain": None, "transposed": lambda c: c.T, "transposed in 3-d": _through_3d}


# Which side is static and small: K points x d features against d x n rows
# (summed over d), K x n against n x d rows (a sum per column), d x n against n x K.
SIDES = {
    "inner": lambda m, d, n: ((None, d), (d, None), (m, d), (d, n)),
    "columns of b": lambda m, d, n: ((None, None), (None, d), (m, n), (n, d)),
    "rows of a": lambda m, d, n: ((d, None), (None, None), (d, n), (n, m)),
}


@settings(max_examples=60, deadline=None)
@given(side=st.sampled_from(sorted(SIDES)), m=st.integers(0, 5), d=st.integers(1, FEW), n=st.integers(0, 40),
       seed=st.integers(0, 2**16), dtype=st.sampled_from(["float64", "float32"]),
       b_form=st.sampled_from(sorted(B_FORMS)))
def test_few_feature_products_keep_the_values(side, m, d, n, seed, dtype, b_form):
    a_static, b_static, a_shape, b_shape = SIDES[side](m, d, n)
    a, b, out = _product(a_static, b_static, dtype, b_form)
    (new,) = feature_sums([out])
    assert not _dots([new]), "the product is written out"
    assert new.type == out.type
    rng = np.random.default_rng(seed)
    av, bv = rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)
    got = pytensor.function([a, b], new, mode=PLAIN)(av, bv if b_form == "plain" else bv.T.copy())
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, av.astype("float64") @ bv.astype("float64"), rtol=tol, atol=tol * d)


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float64, (3, 4), elements=st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1.0, -2.5])))
def test_nan_and_infinities_propagate_as_in_the_product(av):
    a, b, out = _product((None, 4), (4, None))
    (new,) = feature_sums([out])
    bv = np.array([[1.0, 0.0], [2.0, -1.0], [0.5, 3.0], [-1.0, 1.0]])
    want = pytensor.function([a, b], out, mode=PLAIN)(av, bv)
    got = pytensor.function([a, b], new, mode=PLAIN)(av, bv)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("a_static, b_static", [
    ((None, None), (None, None)),  # no static side
    ((None, FEW + 1), (FEW + 1, None)),  # more features than FEW
    ((None, 0), (0, None)),  # none at all
])
def test_other_products_are_left_alone(a_static, b_static):
    _, _, out = _product(a_static, b_static)
    assert len(_dots(feature_sums([out]))) == 1


def test_a_transposed_side_is_read_in_its_producers_layout():
    """``X^T @ R^T`` (a gradient's, R made by the pass over the rows) is summed
    along R's own last axis, with no transposition left for XLA to lay out."""
    c = pt.matrix("c")
    assert _transposed(c.T) and _transposed(_through_3d(c))
    assert not _transposed(c) and not _transposed(c.T.T) and not _transposed(c[None].dimshuffle(1, 2))
    a, _, out = _product((3, None), (None, None), b_form="transposed in 3-d")
    (new,) = feature_sums([out])
    (merged,) = rewrite_graph([new], include=("canonicalize",))  # the dimshuffles merged, as the ranks' are
    swaps = [n for n in apply_ancestors([merged]) if isinstance(n.op, DimShuffle) and n.inputs[0].ndim == 2
             and [k for k in n.op.new_order if k != "x"] == [1, 0]]
    assert not swaps, swaps
