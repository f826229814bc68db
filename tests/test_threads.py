"""Every CPU rank, the master included, gets its share of the cores for BLAS and
OpenMP at fork(), unless the user chose (fork(threads=...) or a thread variable
in the environment); close() gives the master its pools back.  Each rank's pools
are read where they live, with threadpoolctl."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import synkhronos as synk
from synkhronos import _runtime
from synkhronos._devices.cpu import THREAD_VARS, usable_cores
from synkhronos._protocol import ThreadPools


def _pools():
    return sorted((i["internal_api"], i["num_threads"]) for i in threadpool_info())


def _every_rank_pools():
    """rank -> [(library, threads)] for the master and each worker."""
    rt = _runtime.current()
    mine, replies = rt.dispatcher.request(ThreadPools(), local=_pools)
    return {rt.master_rank: mine, **replies}


@pytest.fixture
def no_thread_vars(monkeypatch):
    for v in THREAD_VARS:
        monkeypatch.delenv(v, raising=False)
    np.ones((64, 64)) @ np.ones((64, 64))  # BLAS loaded in the master, as in any user's script
    before = _pools()
    yield before
    synk.close()
    assert _pools() == before, "close() gives the master's pools back their sizes"


def _check_all(ranks, threads):
    assert len(ranks) == 2
    for rank, pools in ranks.items():
        assert pools, "rank %d has no BLAS pool" % rank
        assert all(n == threads for _, n in pools), (rank, pools, threads)


def test_every_rank_gets_its_share_of_the_cores(no_thread_vars):
    synk.fork(2, use_gpu=False)
    _check_all(_every_rank_pools(), max(1, usable_cores() // 2))


def _other_than_share():
    """A thread count other than the rule's, which OpenBLAS does not cap (at most the cores)."""
    return 1 if usable_cores() // 2 > 1 else 2


def test_threads_given_to_fork_win(no_thread_vars, monkeypatch):
    wanted = _other_than_share()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(3 - wanted))  # the explicit argument is more specific
    synk.fork(2, use_gpu=False, threads=wanted)
    _check_all(_every_rank_pools(), wanted)


def test_a_thread_variable_set_by_the_user_stands(no_thread_vars, monkeypatch):
    users = _other_than_share()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(users))
    before = no_thread_vars
    synk.fork(2, use_gpu=False)
    ranks = _every_rank_pools()
    assert ranks[0] == before, "the master keeps the pools it has"
    assert dict(ranks[1]).get("openblas") == users, ranks[1]


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), ("2", TypeError), (1.5, TypeError),
                                      (True, TypeError)])
def test_bad_threads_named(bad, exc):
    with pytest.raises(exc, match=r"threads must be .*got %s" % repr(bad).replace(".", r"\.")):
        synk.fork(2, use_gpu=False, threads=bad)
    assert _runtime.current() is None
