"""Data on GPU ranks: every rank page-locks a Data segment of at least
``PIN_MIN_BYTES`` (``_devices/gpu/_pinning.py``), so that JAX copies the rows to
the GPU straight from shared memory.  Checked here: which segments are locked
(across the threshold, and when a Data is reallocated or freed), that calls on
locked rows give numpy's values (whole, sliced and indexed), and that a call has
read its rows when it returns, so the user may overwrite them at once.  Rows
gathered by ``batch=`` index arrays go through a page-locked buffer per input,
which each call reuses: two inputs must not share one, and a call must not
overwrite the rows the call before it still had to read."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos._devices.gpu._pinning import PIN_MIN_BYTES, address_of, page_locked

COLS = 256  # float32 columns: a row is 1 KiB
ROW = COLS * 4


@pytest.fixture(scope="module")
def session():
    synk.fork(2, use_gpu=True)
    x = pt.matrix("x", dtype="float32")
    sums = synk.function([x], outputs=[(x.sum(axis=0), "sum"), ((x * x).sum(), "sum")])
    acc = pytensor.shared(np.zeros(COLS, dtype="float32"), name="acc")
    accumulate = synk.function([x], updates=[(acc, acc + x.sum(axis=0))])
    y = pt.matrix("y", dtype="float32")
    products = synk.function([x, y], outputs=((x * y).sum(axis=0), "sum"))
    synk.distribute()
    yield sums, accumulate, acc, products
    synk.close()


def _check_sums(fn, data, x, **batch):
    rows = x[batch["batch"]] if batch else x
    col, sq = fn(data, **batch)
    np.testing.assert_allclose(col, rows.astype(np.float64).sum(axis=0), rtol=1e-5, atol=2e-3)
    np.testing.assert_allclose(sq, (rows.astype(np.float64) ** 2).sum(), rtol=1e-5)


@pytest.mark.parametrize("nbytes", [PIN_MIN_BYTES - ROW, PIN_MIN_BYTES, 3 * PIN_MIN_BYTES + 7 * ROW])
def test_data_from_the_threshold_up_is_locked_and_gives_numpys_values(session, nbytes):
    sums = session[0]
    rng = np.random.default_rng(nbytes)
    x = rng.standard_normal((nbytes // ROW, COLS)).astype(np.float32)
    data = synk.data(x)
    segment = data._memory.segment
    address = address_of(segment)
    assert segment.nbytes == nbytes
    assert page_locked(address) == (nbytes >= PIN_MIN_BYTES)
    _check_sums(sums, data, x)
    _check_sums(sums, data, x, batch=slice(5, len(x) - 3))  # rows at an offset in the segment
    _check_sums(sums, data, x, batch=rng.permutation(len(x))[: len(x) // 3])  # gathered
    data.free_memory()
    assert not page_locked(address)


def test_a_data_reallocated_across_the_threshold_is_locked_and_the_old_one_unlocked(session):
    sums = session[0]
    rng = np.random.default_rng(1)
    small = rng.standard_normal((64, COLS)).astype(np.float32)
    data = synk.data(small)
    old = address_of(data._memory.segment)
    assert not page_locked(old)
    _check_sums(sums, data, small)
    large = rng.standard_normal((2 * PIN_MIN_BYTES // ROW, COLS)).astype(np.float32)
    data.set_value(large)
    assert page_locked(address_of(data._memory.segment))
    _check_sums(sums, data, large)
    locked = address_of(data._memory.segment)
    larger = rng.standard_normal((4 * PIN_MIN_BYTES // ROW + 1, COLS)).astype(np.float32)
    data.set_value(larger)
    assert not page_locked(locked)
    assert page_locked(address_of(data._memory.segment))
    _check_sums(sums, data, larger)
    data.free_memory()


def test_a_call_has_read_its_locked_rows_when_it_returns(session):
    """Each call's rows are overwritten the moment it returns: had a rank's copy
    to its GPU still been reading them, its sum would hold the new values."""
    _, accumulate, acc, _ = session
    rows = 32 * PIN_MIN_BYTES // ROW
    data = synk.data(shape=(rows, COLS), dtype="float32")
    assert page_locked(address_of(data._memory.segment))
    synk.broadcast(acc, np.zeros(COLS, dtype=np.float32))  # every rank from zero
    fills = [1.0, 2.0, 3.0, 4.0, 5.0]
    for k in fills:
        data.data[:] = k
        accumulate(data)
        data.data[:] = -1e6
    synk.all_reduce(acc, op="sum")
    np.testing.assert_array_equal(acc.get_value(), np.full(COLS, sum(fills) * rows, dtype=np.float32))
    data.free_memory()


def test_gathered_inputs_through_their_kept_buffers_give_numpys_values(session):
    products = session[3]
    rng = np.random.default_rng(2)
    rows = 8 * PIN_MIN_BYTES // ROW
    x = rng.standard_normal((rows, COLS)).astype(np.float32)
    y = rng.standard_normal((rows, COLS)).astype(np.float32)
    dx, dy = synk.data(x), synk.data(y)
    # a buffer per input and rank: grown, reused, unused; then 8 MiB a rank, split over threads
    for n in (rows // 2, rows, 3 * rows // 4, 5, 2 * rows + 7):
        idx = rng.integers(0, rows, n)
        want = (x[idx].astype(np.float64) * y[idx]).sum(axis=0)
        np.testing.assert_allclose(products(dx, dy, batch=idx), want, rtol=1e-4, atol=5e-3)
    dx.free_memory()
    dy.free_memory()


def test_a_call_has_read_its_gathered_rows_before_the_next_gathers_over_them(session):
    _, accumulate, acc, _ = session
    rows = 8 * PIN_MIN_BYTES // ROW
    values = np.repeat(np.arange(rows, dtype=np.float32)[:, None] % 256, COLS, axis=1)
    data = synk.data(values)
    synk.broadcast(acc, np.zeros(COLS, dtype=np.float32))
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, rows, 3 * rows // 4) for _ in range(6)]
    for idx in batches:
        accumulate(data, batch=idx)  # no outputs: returns once every rank has queued it
    synk.all_reduce(acc, op="sum")
    want = sum(float(values[idx, 0].astype(np.float64).sum()) for idx in batches)
    np.testing.assert_array_equal(acc.get_value(), np.full(COLS, want, dtype=np.float32))
    data.free_memory()
