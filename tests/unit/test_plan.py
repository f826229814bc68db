"""Row-selection rules, without processes."""

import numpy as np
import pytest

from synkhronos._common.selections import (
    check_selection_fits,
    normalize_batch,
    normalize_batch_s,
    selection_length,
    split_bounds,
    sub_selection,
    take_rows,
)


@pytest.mark.parametrize("length,parts", [(10, 3), (7, 2), (2, 3), (0, 2), (9, 3)])
def test_split_bounds_matches_array_split(length, parts):
    bounds = split_bounds(length, parts)
    expected = [(a[0], a[-1] + 1) if len(a) else None for a in np.array_split(np.arange(length), parts)]
    assert [b if b[1] > b[0] else None for b in bounds] == expected
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(b0[1] == b1[0] for b0, b1 in zip(bounds, bounds[1:]))


def test_normalize_batch_forms():
    assert normalize_batch(5) == slice(0, 5)
    assert normalize_batch(slice(2, 7)) == slice(2, 7)
    assert normalize_batch(slice(None, 4)) == slice(0, 4)
    assert normalize_batch(slice(3, None), length=9) == slice(3, 9)
    np.testing.assert_array_equal(normalize_batch([3, 1, 1]), [3, 1, 1])
    idx = normalize_batch(np.array([4, 0], dtype=np.int32))
    assert idx.dtype == np.int64


@pytest.mark.parametrize("bad,exc,match", [
    (-1, ValueError, "-1"),
    (slice(0, 6, 2), ValueError, "step"),
    (slice(5, 2), ValueError, "slice"),
    (slice(0.5, 2), TypeError, "0.5"),
    ([1.5, 2.0], TypeError, "float"),
    ([[1, 2]], TypeError, "1-d"),
    ([-3, 1], ValueError, "-3"),
    ("abc", TypeError, "abc"),
    (True, TypeError, "True"),
])
def test_normalize_batch_rejects(bad, exc, match):
    with pytest.raises(exc, match=match):
        normalize_batch(bad)


def test_normalize_batch_s_single_and_per_rank():
    assert normalize_batch_s(slice(1, 3), 3) == [slice(1, 3)] * 3
    sels = normalize_batch_s([0, 2, 2], 2)  # a list of ints: one index list for all ranks
    assert len(sels) == 2 and all(list(s) == [0, 2, 2] for s in sels)
    per = normalize_batch_s([slice(0, 2), slice(1, 3)], 2)
    assert per == [slice(0, 2), slice(1, 3)]
    per = normalize_batch_s([np.array([1]), [0, 1]], 2)
    assert [list(p) for p in per] == [[1], [0, 1]]
    with pytest.raises(ValueError, match="3 ranks"):
        normalize_batch_s([slice(0, 1), slice(0, 1)], 3)
    with pytest.raises(TypeError, match="one type"):
        normalize_batch_s([slice(0, 1), [0]], 2)
    with pytest.raises(TypeError, match="batch_s"):
        normalize_batch_s(4.0, 2)


def test_sub_selection_and_take_rows():
    a = np.arange(20).reshape(10, 2)
    assert sub_selection(slice(3, 9), 1, 4) == slice(4, 7)
    np.testing.assert_array_equal(sub_selection(np.array([5, 1, 7, 2]), 1, 3), [1, 7])
    np.testing.assert_array_equal(take_rows(a, slice(4, 7)), a[4:7])
    np.testing.assert_array_equal(take_rows(a, np.array([9, 0])), a[[9, 0]])
    assert take_rows(a, None) is a
    assert selection_length(slice(2, 9)) == 7 and selection_length(np.array([1, 2])) == 2


def test_check_selection_fits():
    check_selection_fits(slice(0, 10), 10, "x")
    check_selection_fits(np.array([9, 0]), 10, "x")
    with pytest.raises(ValueError, match="11 rows"):
        check_selection_fits(slice(0, 11), 10, "x")
    with pytest.raises(ValueError, match="index 10"):
        check_selection_fits(np.array([10]), 10, "x")


@pytest.mark.parametrize("shape,dtype", [((50,), "float64"), ((50, 5), "float64"), ((50, 3, 4, 2), "float32"),
                                         ((50, 0), "int32"), ((50, 2), "bool"), ((50, 2), "complex64")])
@pytest.mark.parametrize("n", [0, 1, 7, 120])
def test_take_rows_by_index_is_numpys_indexing(shape, dtype, n):
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(shape) * 10).astype(dtype)
    idx = rng.integers(0, shape[0], n).astype(np.int64)
    got = take_rows(a, idx)
    assert got.dtype == a.dtype and got.shape == a[idx].shape
    np.testing.assert_array_equal(got, a[idx])
    got[...] = 0  # a copy: the rows it came from are untouched
    np.testing.assert_array_equal(a, (np.random.default_rng(n).standard_normal(shape) * 10).astype(dtype))
    with pytest.raises(IndexError):
        take_rows(a, np.array([shape[0]], dtype=np.int64))
