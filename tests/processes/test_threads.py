"""Every CPU rank, the master included, gets its share of the cores for BLAS and
OpenMP at fork(), unless the user chose (fork(threads=...) or a thread variable
in the environment); close() gives the master its pools back.  Each rank's pools
are read where they live, with threadpoolctl."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import synkhronos as synk
from synkhronos._devices.cpu import THREAD_VARS, usable_cores
from synkhronos._session import runtime
from synkhronos._wire.protocol import ThreadPools


def _pools():
    return sorted((i["internal_api"], i["num_threads"]) for i in threadpool_info())


def _every_rank_pools():
    """rank -> [(library, threads)] for the master and each worker."""
    rt = runtime.current()
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
    assert runtime.current() is None


_JAX_POOLS = """
import json, os, sys
import numpy as np, pytensor, pytensor.tensor as pt
import synkhronos as synk
synk.fork(2, use_gpu=False)
x = pt.matrix("x")
w = pytensor.shared(np.ones((3, 3), "float32"))
f = synk.function([x], outputs=(x.dot(w).sum(), "sum"), mode="JAX")
synk.distribute()
print("result", float(f(synk.data(np.ones((8, 3), "float32")))))
pids = [os.getpid()] + [w.process.pid for w in synk._session.runtime.current().dispatcher.workers.values()]

def pool_cores(pid):
    cores = set()
    for tid in os.listdir("/proc/%d/task" % pid):
        try:  # (a thread may end meanwhile)
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if f.read().startswith("tf_XLAEigen"):
                    cores |= os.sched_getaffinity(int(tid))
        except (FileNotFoundError, ProcessLookupError):
            pass
    return sorted(cores)

print("pools", json.dumps([pool_cores(p) for p in pids]))
print("main", json.dumps(sorted(os.sched_getaffinity(0))))
synk.close()
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread affinity from /proc (Linux)")
def test_jax_pools_on_cores_of_their_own(no_thread_vars):
    """Each CPU rank's JAX (XLA) thread pool runs on its share of the cores, not
    on all of them beside the other ranks' pools; the processes keep all theirs."""
    pytest.importorskip("jax")
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    proc = subprocess.run([sys.executable, "-c", _JAX_POOLS], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines())
    assert float(lines["result"]) == 8 * 9, "8 rows of 3 ones times 3x3 ones"
    pools = [set(p) for p in json.loads(lines["pools"])]
    share = max(1, usable_cores() // 2)
    assert all(len(p) == share for p in pools), pools
    assert not pools[0] & pools[1], "the ranks' pools share no core: %s" % pools
    assert len(json.loads(lines["main"])) == usable_cores(), "the master keeps all its cores"


_LOADED_LATER = """
import json, os
import numpy as np, pytensor, pytensor.tensor as pt
from threadpoolctl import threadpool_info
import synkhronos as synk

def pools():
    return {i["filepath"]: i["num_threads"] for i in threadpool_info()}

synk.fork(2, use_gpu=False)
at_fork = pools()
x = pt.matrix("x")
f = synk.function([x], outputs=(x.dot(x.T).sum(), "sum"), mode="NUMBA")
synk.distribute()
print("result", float(f(synk.data(np.ones((8, 3))))))
in_session = pools()
synk.close()
print("pools", json.dumps([at_fork, in_session, pools()]))
print("env", json.dumps({v: os.environ.get(v) for v in %r}))
"""


def test_a_pool_loaded_after_fork_gets_the_share_too(no_thread_vars):
    """PyTensor's Numba linker loads a BLAS of its own (SciPy's) at its first product,
    after fork(): that pool gets the master's share too, not every core beside the
    workers; close() gives it the size it would have had and the environment back."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    proc = subprocess.run([sys.executable, "-c", _LOADED_LATER % (THREAD_VARS,)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if " " in ln)
    assert float(lines["result"]) == 2 * 4 * 4 * 3, "each rank: 4 rows, a 4x4 product of 3s"
    at_fork, in_session, after = json.loads(lines["pools"])
    share = max(1, usable_cores() // 2)
    assert all(n == share for n in in_session.values()), in_session
    later = set(in_session) - set(at_fork)
    if not later:  # PyTensor 2 imports SciPy, and so loads its BLAS, before fork()
        pytest.skip("no BLAS was loaded after fork() here: %s" % sorted(in_session))
    assert all(after[lib] == usable_cores() for lib in later), after
    assert all(v is None for v in json.loads(lines["env"]).values()), lines["env"]


@pytest.mark.parametrize("cores, ranks", [(16, 9), (16, 12), (16, 6), (16, 16), (16, 8), (2, 2), (2, 4),
                                          (5, 3)])
def test_jax_pools_cover_every_core_when_ranks_do_not_divide_them(monkeypatch, cores, ranks):
    """By the rule, each rank's JAX pool is its stretch of ceil(cores / ranks)
    cores: every core has a pool (none idle, as with 9 ranks of one core each on
    16), no core more than two, and ranks that divide the cores share none."""
    from synkhronos._devices.cpu import core_share

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(100, 100 + cores)))
    pools = [core_share(i, max(1, cores // ranks), ranks) for i in range(ranks)]
    width = -(-cores // ranks)
    assert all(len(p) == min(width, cores) for p in pools), pools
    counts = [sum(c in p for p in pools) for c in range(100, 100 + cores)]
    assert min(counts) >= 1, "every core has a pool: %s" % pools
    if ranks <= cores:
        assert max(counts) <= 2, pools
    if cores % ranks == 0:
        assert max(counts) == 1, pools
    # The user's threads= stays as it was: k cores each, rank after rank.
    k = min(3, cores)
    assert core_share(1, 3, None) == tuple(100 + (k + j) % cores for j in range(k))


_BUSY_THREADS = """
import json, os
import numpy as np, pytensor, pytensor.tensor as pt
import synkhronos as synk
synk.fork(2, use_gpu=False)
x = pt.matrix("x", dtype="float32")
w = pytensor.shared(np.full((512, 512), 0.01, "float32"))
h = x
for _ in range(8):
    h = pt.tanh(h @ w)
f = synk.function([x], outputs=(h.sum(), "sum"), mode="JAX")
synk.distribute()
xd = synk.data(np.ones((2048, 512), "float32"))
f(xd)
workers = [w.process.pid for w in synk._session.runtime.current().dispatcher.workers.values()]

def threads(pid):
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12]), sorted(os.sched_getaffinity(int(tid))))
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out

before = {p: threads(p) for p in workers}
for _ in range(20):
    f(xd)
after = {p: threads(p) for p in workers}
busy = {p: [(tid, t - before[p][tid][0], cores) for tid, (t, cores) in after[p].items()
            if tid in before[p] and tid != p and t - before[p][tid][0] >= 5] for p in workers}
print("busy", json.dumps(list(busy.values())))
synk.close()
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread CPU times from /proc (Linux)")
def test_a_workers_busy_threads_run_on_its_share_only(no_thread_vars):
    """Counted, not assumed: the threads of each worker that used CPU time while
    it computed (its main thread aside) may run on its share of the cores only,
    and there are no more of them than two per core of its share."""
    pytest.importorskip("jax")
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    proc = subprocess.run([sys.executable, "-c", _BUSY_THREADS], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    busy = json.loads(dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if " " in ln)["busy"])
    share = max(1, usable_cores() // 2)
    assert all(busy), "every worker computed on some thread: %s" % busy
    for threads in busy:
        assert len(threads) <= 2 * share, threads
        assert all(len(cores) == share for _, _, cores in threads), threads


_PLATFORMS = """
import os, sys
from synkhronos._devices.cpu import start_jax_pool
start_jax_pool(None, cpu_only=sys.argv[1] == "worker")
import jax
print(jax.config.jax_platforms, os.environ.get("JAX_PLATFORMS"))
"""


@pytest.mark.parametrize("role, preset, want", [("worker", None, "cpu None"), ("master", None, "None None"),
                                                ("worker", "cpu,cuda", "cpu,cuda cpu,cuda")])
def test_a_cpu_worker_starts_only_jax_cpu_backend_unless_the_user_chose(role, preset, want):
    """A CPU worker's JAX starts no GPU backend (with JAX's CUDA plugin on a GPU
    machine, every worker would otherwise take GPU memory, or fail where a GPU
    admits one process); the master's JAX, and platforms the user chose, stay."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if preset:
        env["JAX_PLATFORMS"] = preset
    proc = subprocess.run([sys.executable, "-c", _PLATFORMS, role], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == want


_DEFAULT_DEVICE = """
import json, sys
import numpy as np, pytensor.tensor as pt, jax
import synkhronos as synk
if sys.argv[1] == "user":
    jax.config.update("jax_default_device", jax.devices("cpu")[0])
before = repr(jax.config.jax_default_device)
synk.fork(2, use_gpu=False)
x = pt.vector("x")
f = synk.function([x], outputs=(x.sum(), "sum"), mode="JAX")
synk.distribute()
assert float(f(synk.data(np.ones(6)))) == 6
inside = repr(jax.config.jax_default_device)
synk.close()
print(json.dumps([before, inside, repr(jax.config.jax_default_device)]))
"""


@pytest.mark.parametrize("who", ["session", "user"])
def test_a_cpu_session_makes_the_cpu_jaxs_default_device_while_it_lasts(who):
    """Where JAX has a GPU too, the master's share would otherwise be computed
    there (tests/gpu/test_gpu_cpu_ranks.py checks the numbers); a default device
    the user chose stands."""
    pytest.importorskip("jax")
    proc = subprocess.run([sys.executable, "-c", _DEFAULT_DEVICE, who], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, inside, after = json.loads(proc.stdout.splitlines()[-1])
    if who == "session":
        assert (before, inside, after) == ("None", "'cpu'", "None")
    else:
        assert before.startswith("CpuDevice") and inside == after == before, (before, inside, after)
