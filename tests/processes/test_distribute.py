"""distribute() more than once: each call sends only the functions built since
the last, and a later function works on the workers' own shared variables (the
same values, the same random streams), not on copies."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.tensor.random.utils import RandomStream

import synkhronos as synk

F32 = "float32"
N = 2


@pytest.fixture
def session():
    synk.close()
    synk.fork(N, use_gpu=False)
    yield
    synk.close()


def test_a_later_function_updates_the_variable_earlier_ones_read(session):
    s = pytensor.shared(np.zeros(3, dtype=F32), name="s")
    x = pt.vector("x", dtype=F32)
    read = synk.function([x], (x.sum() + s.sum(), "sum"))
    synk.distribute()
    d = synk.data(np.arange(4, dtype=F32))
    assert float(read(d)) == 6.0
    t = pytensor.shared(np.ones(2, dtype=F32), name="t")
    bump = synk.function([x], (s.sum() + t.sum() + 0 * x.sum(), None), updates=[(s, s + t.sum())])
    synk.distribute()
    assert [float(r) for r in bump(d)] == [2.0] * N
    assert float(read(d)) == 6.0 + N * 3 * 2.0  # every rank's s moved, and read sees it
    np.testing.assert_array_equal(synk.gather(s), np.full((N, 3), 2.0, dtype=F32))
    synk.scatter(t, np.arange(2 * N, dtype=F32))  # a variable distributed later takes collectives
    np.testing.assert_array_equal(synk.gather(t), np.arange(2 * N, dtype=F32).reshape(N, 2))


def _draws(later):
    """Two calls of a function drawing from a seeded stream; with ``later``, a
    second function using the same generator is distributed between them."""
    synk.fork(N, use_gpu=False)
    srng = RandomStream(seed=7)
    x = pt.vector("x", dtype=F32)
    u = srng.uniform(size=x.shape) + x
    draw = synk.function([x], (u, None))
    synk.distribute()
    d = synk.data(np.zeros(2 * N, dtype=F32))
    first = draw(d)
    if later:
        synk.function([x], (u * 2, None))
        synk.distribute()
    second = draw(d)
    synk.close()
    return np.array(first), np.array(second)


def test_a_later_function_leaves_the_random_streams_as_they_were():
    synk.close()
    first, second = _draws(later=False)
    first_l, second_l = _draws(later=True)
    np.testing.assert_array_equal(first_l, first)
    np.testing.assert_array_equal(second_l, second)  # not reseeded when distributed again
    assert not np.array_equal(second[0], second[1])  # ranks draw their own numbers


def test_spawned_workers_find_the_package_the_master_runs():
    """Workers start in a fresh interpreter with the master's ``sys.path`` behind
    the directory that holds the package: that directory, not the package's own
    (which would make ``synkhronos/pymc`` shadow PyMC there)."""
    import pathlib
    import types

    from synkhronos._session.launch import _shared_worker_settings

    device = types.SimpleNamespace(name="cpu")
    rt = types.SimpleNamespace(token="t", n_parallel=2, master_rank=0, device=device,
                               profile_workers=False, spin=0.0)
    config, _ = _shared_worker_settings(rt, None)
    assert pathlib.Path(config["sys_path"][0]) == pathlib.Path(synk.__file__).resolve().parent.parent
