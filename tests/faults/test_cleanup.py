"""Cleanup: however a session ends (close(), normal exit, an uncaught exception,
Ctrl-C, the master killed), no worker process, shared-memory segment or semaphore
of the session may remain; the command channels' memory and semaphores lose their
names as soon as the workers have opened them.
"""

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _procs import SHM_DIR, session_names
from _procs import proc_exists as _exists
from _procs import proc_stat as _stat
from _procs import segments as _segments

import synkhronos as synk
from synkhronos._session import runtime
from synkhronos._session.fault_injection import FAULT_ENV

F32 = "float32"
START_S = 120.0  # for a script to get its session going (noisy, shared machine)
ORPHAN_S = 5.0  # for workers of a killed master to clean up by themselves
BIG_ROWS = 40000  # (40000, 3) float32 = 480 kB: outputs travel through shared memory


# --------------------------------------------------------------------------- helpers


def _semaphores(token):
    """POSIX semaphores (``sem.<name>``) of session ``token`` or of any other session
    this process started (not another process's: the suite runs in parallel)."""
    ours = session_names(os.getpid())
    return sorted(n for n in os.listdir(SHM_DIR)
                  if n.startswith("sem.") and (token in n or ours.match(n)))


def _running(pid, start):
    """Whether that very process still runs (a zombie has exited)."""
    st = _stat(pid)
    return st is not None and st[1] == start and st[0] not in "ZX"


def _shm_maps(pid):
    """Lines of /proc/<pid>/maps that map files of /dev/shm."""
    with open("/proc/%d/maps" % pid) as fh:
        return [line.strip() for line in fh if SHM_DIR + "/" in line]


def _slots(names):
    """Slot names (``d0``, ``r1``, ...) of segment names ``synk_<token>_<slot>_<gen>``."""
    return {n.rsplit("_", 2)[1] for n in names}


def _wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _build_session(n=2):
    """fork, one function with big per-rank outputs, Data, and a collective that
    moves a big value: segments of every owner (Data, master and worker exchange
    buffers) exist afterwards."""
    synk.fork(n, use_gpu=False)
    x = pt.matrix("x", dtype=F32)
    s = pytensor.shared(np.zeros((4, 3), dtype=F32), name="s")
    f = synk.function([x], [(x * 2, None), (x.sum() + s.sum(), "sum")])
    synk.distribute()
    d = synk.data(np.ones((BIG_ROWS, 3), dtype=F32))
    parts, total = f(d)
    assert float(total) == BIG_ROWS * 3
    assert sum(len(p) for p in parts) == BIG_ROWS
    synk.broadcast(s, np.zeros((BIG_ROWS, 3), dtype=F32))
    return f, d, s


def _session_ids():
    rt = runtime.current()
    return rt.token, {r: (w.process.pid, _stat(w.process.pid)[1]) for r, w in rt.workers.items()}


@pytest.fixture
def fresh():
    synk.close()
    yield
    synk.close()


# ------------------------------------------------------------------- in process
def test_close_stops_workers_and_unlinks_segments(fresh):
    f, d, _ = _build_session(3)
    token, workers = _session_ids()
    assert {"d0", "r0", "r1", "r2"} <= _slots(_segments(token))
    synk.close()
    assert runtime.current() is None
    for rank, (pid, start) in workers.items():
        assert not _exists(pid, start), "worker rank %d (pid %d) survived close()" % (rank, pid)
    assert _segments(token) == []
    assert d.data is None  # the master's mapping is gone too
    assert not [m for m in _shm_maps(os.getpid()) if "synk_%s_" % token in m]


def test_close_lets_go_of_the_device_while_workers_leave(fresh, monkeypatch):
    """The master's device is released after the workers are told to exit and
    before close() waits for them: NCCL's communicator destroy waits for every
    rank's, so the other order kept each GPU worker until the exit timeout."""
    _build_session()
    rt = runtime.current()
    processes = [w.process for w in rt.workers.values()]
    sent, told = [], []
    for w in rt.workers.values():
        monkeypatch.setattr(w.channel, "send", lambda msg, send=w.channel.send: sent.append(msg) or send(msg))
    monkeypatch.setattr(rt.device, "close", lambda abort=False: told.append(
        (len(sent), [w.process.returncode for w in rt.workers.values()], abort)))
    synk.close()
    n = len(processes)
    # At the device's close: every worker told to exit, none waited for yet.
    assert told == [(n, [None] * n, False)]
    assert len(sent) == n and [p.returncode for p in processes] == [0] * n


def test_close_is_idempotent(fresh):
    synk.close()  # nothing open: fine
    _build_session()
    token, workers = _session_ids()
    synk.close()
    synk.close()
    assert runtime.current() is None
    assert _segments(token) == []
    assert not any(_exists(*w) for w in workers.values())
    # and a new session starts cleanly
    synk.fork(2, use_gpu=False)
    assert runtime.current().token != token
    synk.close()
    synk.close()
    assert runtime.current() is None


def test_close_with_unresponsive_worker(fresh):
    """A worker that does not answer EXIT is killed: close() neither hangs nor leaks."""
    _build_session()
    token, workers = _session_ids()
    pid, start = workers[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        closer = threading.Thread(target=synk.close, daemon=True)
        t0 = time.monotonic()
        closer.start()
        closer.join(60)
        elapsed = time.monotonic() - t0
        assert not closer.is_alive(), "close() hangs on a stopped worker"
    finally:
        if _exists(pid, start):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
    assert elapsed < 30
    assert runtime.current() is None
    assert not any(_exists(*w) for w in workers.values())
    assert _segments(token) == []


def test_channel_names_are_gone_once_the_workers_run(fresh):
    """Every process maps its channels' rings and semaphores, but by the time
    fork() returns no name of them is left to leak, whatever happens next."""
    _build_session()
    token, workers = _session_ids()
    pids = [os.getpid()] + [pid for pid, _ in workers.values()]
    for pid in pids:
        maps = _shm_maps(pid)
        channel = [m for m in maps if "synk_%s_c" % token in m]
        assert channel and all(m.endswith("(deleted)") for m in channel), (pid, channel)
        # (glibc maps a semaphore under the temporary name it made it with)
        sems = [m for m in maps if SHM_DIR + "/sem." in m]
        assert sems and all(m.endswith("(deleted)") for m in sems), (pid, sems)
    assert _semaphores(token) == []
    assert not [n for n in _segments(token) if n.startswith("synk_%s_c" % token)]
    synk.close()
    assert _semaphores(token) == []
    assert not [m for m in _shm_maps(os.getpid()) if "synk_%s_" % token in m]


def test_free_memory_releases_segment_everywhere(fresh):
    synk.fork(2, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    f = synk.function([x], (x.sum(), "sum"))
    synk.distribute()
    d = synk.data(np.ones(100000, dtype=F32))
    assert float(f(d)) == 100000
    name = d._memory.segment.name.lstrip("/")
    token, workers = _session_ids()
    worker_pid = workers[1][0]
    assert [m for m in _shm_maps(worker_pid) if name in m]
    d.free_memory()
    assert name not in os.listdir(SHM_DIR)
    for pid in (os.getpid(), worker_pid):
        assert not [m for m in _shm_maps(pid) if name in m], "pid %d still maps %s" % (pid, name)


def test_dropped_data_is_released_in_workers(fresh):
    synk.fork(2, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    f = synk.function([x], (x.sum(), "sum"))
    synk.distribute()
    d = synk.data(np.ones(1000000, dtype=F32))  # 4 MB
    assert float(f(d)) == 1000000
    name = d._memory.segment.name.lstrip("/")
    _, workers = _session_ids()
    worker_pid = workers[1][0]
    del d
    gc.collect()
    assert name not in os.listdir(SHM_DIR)
    # Workers may let go lazily, but at the latest on the next round trip.
    assert float(f(synk.data(np.ones(10, dtype=F32)))) == 10
    assert not [m for m in _shm_maps(worker_pid) if name in m], "worker still maps dropped %s" % name


# ------------------------------------------------------------- script sessions
SCRIPT = r"""
import json, os, sys, time
import numpy as np
import pytensor
import pytensor.tensor as pt
import synkhronos as synk

mode = sys.argv[1]
synk.fork(2, use_gpu=False)
x = pt.matrix("x", dtype="float32")
s = pytensor.shared(np.zeros((4, 3), dtype="float32"), name="s")
f = synk.function([x], [(x * 2, None), (x.sum() + s.sum(), "sum")])
synk.distribute()
d = synk.data(np.ones((%(rows)d, 3), dtype="float32"))
parts, total = f(d)
assert float(total) == %(rows)d * 3
synk.broadcast(s, np.zeros((%(rows)d, 3), dtype="float32"))
rt = synk._session.runtime.current()
pids = [w.process.pid for w in rt.workers.values()]

def shm_maps(pid):
    with open("/proc/%%d/maps" %% pid) as fh:
        return [line.strip() for line in fh if "/dev/shm/" in line]

info = dict(
    token=rt.token,
    tmpdir=rt.tmpdir,
    pids=pids,
    templates=synk._session.template.pids(),  # the process that forked the workers
    segments=sorted(n for n in os.listdir("/dev/shm") if n.startswith("synk_%%s_" %% rt.token)),
    mapped={str(p): len([m for m in shm_maps(p) if "synk_" in m]) for p in [os.getpid()] + pids},
    semaphores=sorted(n for n in os.listdir("/dev/shm") if n.startswith("sem.")),
)
print("SYNK-INFO " + json.dumps(info), flush=True)
if mode == "raise":
    raise ValueError("user script failed on purpose")
elif mode == "sleep":
    while True:
        time.sleep(0.02)
elif mode == "busy":
    while True:
        f(d)
        synk.broadcast(s)
elif mode == "hang":  # the worker hangs inside this call (SYNKHRONOS_FAULT)
    f(d)
""" % dict(rows=BIG_ROWS)


class _Script:
    """A user script in its own interpreter, running a Synkhronos session."""

    def __init__(self, tmp_path, mode, new_session=False):
        self.out_path = tmp_path / "stdout.txt"
        self.err_path = tmp_path / "stderr.txt"
        env = dict(os.environ)  # the suite's PYTENSOR_FLAGS (_flags)
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(synk.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
        if mode == "hang":
            env[FAULT_ENV] = "1:call:2:hang"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode], stdout=out, stderr=err,
                                         env=env, start_new_session=new_session)
        self.info = None

    def stderr(self):
        return self.err_path.read_text()

    def wait_info(self):
        """The session's token, worker pids (with start times) and segments."""
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            for line in self.out_path.read_text().splitlines():
                if line.startswith("SYNK-INFO "):
                    info = json.loads(line[len("SYNK-INFO "):])
                    # (A worker of a script that exits at once may be gone already.)
                    # Its template, too, must not outlive the script.
                    info["workers"] = [(pid, (_stat(pid) or (None, None))[1])
                                       for pid in info["pids"] + info["templates"]]
                    self.info = info
                    self._check_info()
                    return info
            if self.proc.poll() is not None:
                pytest.fail("script exited (%s) before its session was up:\n%s"
                            % (self.proc.returncode, self.stderr()))
            time.sleep(0.05)
        self.kill()
        pytest.fail("script did not start its session within %.0f s" % START_S)

    def _check_info(self):
        info = self.info
        assert {"d0", "r0", "r1"} <= _slots(info["segments"]), info["segments"]
        assert all(n > 0 for n in info["mapped"].values()), info["mapped"]  # maps were readable
        # unlinked once the workers run (the script's sessions carry its pid in their names)
        mine = session_names(self.proc.pid)
        assert [n for n in info["semaphores"] if mine.match(n)] == []

    def wait(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("script did not exit within %d s:\n%s" % (timeout, self.stderr()))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid, start in (self.info or {}).get("workers", []):
            if _running(pid, start):
                os.kill(pid, signal.SIGKILL)
        if self.info:
            _unlink_leftovers(self.info["token"])

    def assert_clean(self, timeout=0.0):
        """No worker runs and no segment or temporary directory of the session
        remains (waiting up to ``timeout`` for orphaned workers to finish)."""
        token, workers, tmpdir = self.info["token"], self.info["workers"], self.info["tmpdir"]
        _wait_until(lambda: not any(_running(*w) for w in workers) and not _segments(token)
                    and not os.path.exists(tmpdir), timeout)
        survivors = [pid for pid, start in workers if _running(pid, start)]
        left = _segments(token)
        assert survivors == [], "worker processes survived: %s" % survivors
        assert left == [], "shared memory left behind: %s" % left
        assert not os.path.exists(tmpdir), "temporary directory left behind: %s" % tmpdir
        assert _semaphores(token) == []


def _unlink_leftovers(token):
    """Do not let a failed test leak into the next (or the machine)."""
    for name in _segments(token):
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass


@pytest.fixture
def script(tmp_path):
    made = []

    def start(mode, new_session=False):
        s = _Script(tmp_path, mode, new_session)
        made.append(s)
        return s

    yield start
    for s in made:
        s.kill()


def test_normal_exit_without_close(script):
    s = script("exit")
    s.wait_info()
    assert s.wait() == 0, s.stderr()
    s.assert_clean()


def test_uncaught_exception(script):
    s = script("raise")
    s.wait_info()
    assert s.wait() == 1
    assert "user script failed on purpose" in s.stderr()
    s.assert_clean()


@pytest.mark.parametrize("mode", ["sleep", "busy", "hang"])
def test_sigint_to_master(script, mode):
    s = script(mode)
    s.wait_info()
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGINT)
    assert s.wait() != 0
    assert "KeyboardInterrupt" in s.stderr()
    s.assert_clean()


@pytest.mark.parametrize("mode", ["sleep", "busy", "hang"])
def test_ctrl_c_to_process_group(script, mode):
    """A real Ctrl-C reaches the master and every worker; the workers must leave
    the shutdown to the master."""
    s = script(mode, new_session=True)
    s.wait_info()
    time.sleep(0.3)
    os.killpg(s.proc.pid, signal.SIGINT)
    assert s.wait() != 0
    err = s.stderr()
    assert "KeyboardInterrupt" in err
    assert err.count("Traceback (most recent call last)") == 1, err  # the master's only
    s.assert_clean()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("mode", ["sleep", "busy", "hang"])
def test_master_killed(script, mode, sig):
    """Nobody closes the session: the workers must notice and clean up themselves,
    also a worker busy with a command that never ends ("hang")."""
    s = script(mode)
    s.wait_info()
    time.sleep(0.3)
    s.proc.send_signal(sig)
    assert s.wait() == -sig
    s.assert_clean(timeout=ORPHAN_S)



# --------------------------------------------------------- the temporary directory
FILES_SCRIPT = r"""
import json, os, sys
import numpy as np
import pytensor
import pytensor.tensor as pt
import synkhronos as synk

synk.fork(int(sys.argv[1]), use_gpu=False)
x = pt.matrix("x", dtype="float32")
w = pytensor.shared(np.ones((3, 2), dtype="float32"), name="w")
# The JAX linker writes the source of the functions it generates to temporary files.
f = synk.function([x], (x.dot(w).sum(), "sum"), updates=[(w, w * 0.5)], mode="JAX")
synk.distribute()
d = synk.data(np.ones((10, 3), dtype="float32"))
f(d)
f(d, num_slices=2)
rt = synk._session.runtime.current()
during = sorted(os.listdir(rt.tmpdir)) if rt.tmpdir else []
synk.close()
print("SYNK-FILES " + json.dumps(dict(tmpdir=rt.tmpdir, during=during)), flush=True)
"""


def _files_run(tmp_path, n):
    """Run FILES_SCRIPT on ``n`` ranks with its own TMPDIR; returns (what the
    script saw, the entries left in TMPDIR)."""
    tmp = tmp_path / ("tmp%d" % n)
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(synk.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", FILES_SCRIPT, str(n)], env=env, capture_output=True,
                         text=True, timeout=START_S)
    assert out.returncode == 0, out.stderr
    line = [s for s in out.stdout.splitlines() if s.startswith("SYNK-FILES ")][0]
    return json.loads(line[len("SYNK-FILES "):]), sorted(os.listdir(tmp))


def test_workers_temporary_files_go_with_close(tmp_path):
    """The workers' temporary files (PyTensor's generated sources) live in the
    session's own directory, which close() removes; what remains in TMPDIR is
    the master's alone: the same with 2 workers as with none."""
    alone, left_alone = _files_run(tmp_path, 1)
    three, left_three = _files_run(tmp_path, 3)
    assert alone["tmpdir"] is None  # no workers, no directory
    assert os.path.dirname(three["tmpdir"]) == str(tmp_path / "tmp3")
    generated = [n for n in three["during"] if n.startswith("tmp")]
    assert len(generated) >= 2, three["during"]  # the workers did write there
    assert {"stacks-rank1.txt", "stacks-rank2.txt"} <= set(three["during"])
    assert not os.path.exists(three["tmpdir"])
    assert not [n for n in left_three if n.startswith("synkhronos_")]
    assert len(left_three) == len(left_alone), (left_alone, left_three)
