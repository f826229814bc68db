"""Fuzzing the public API: generated calls, most of them malformed, over every
state of a session (before fork(), before distribute(), distributed, closed).

Every malformed call must end in the exception type its case names, with a
message that names the argument and the value; every sound call (some with NaN
or Inf data) must give numpy's result, through the tests' numpy oracle of every
rank's shared values (``_model.Reference``).  No call may hang (the session's
stall timeout turns a hang into a StallError) or kill a worker.  ``--fuzz-n``
sets how many malformed calls are made (default 2000), ``--fuzz-seed`` the seed.
"""

import collections
import faulthandler
import os
import sys
import time

import numpy as np
import pytest
from _fuzz import F32, N_ROWS, Fuzzer, Raises, build_functions, forked_cases, unforked_cases
from _model import Reference
from _procs import Leftovers, proc_exists

import synkhronos as synk
from synkhronos._session import runtime

N_RANKS = 3
HANG_S = 20.0  # fork(timeout=...): a call stuck this long is a hang
GUARD_S = 900.0  # the whole run, should the master itself hang


class _Env:
    """The distributed session the fuzzer works on."""

    def __init__(self, v, rng):
        self.n = N_RANKS
        self.v = v
        self.xval = rng.standard_normal((N_ROWS, 3)).astype(F32)
        self.nanval = self.xval.copy()
        self.nanval[[1, 7, 15], [0, 2, 1]] = [np.nan, np.inf, -np.inf]
        self.bval = rng.standard_normal(3).astype(F32)
        self.mval = rng.standard_normal((N_ROWS, 3)).astype(F32)
        self.ival = rng.integers(-100, 100, N_ROWS).astype("int16")
        self.dx = synk.data(self.xval)
        self.dnan = synk.data(self.nanval)
        self.db = synk.data(self.bval)
        self.dv = synk.data(self.xval[:, 0].copy())
        self.d64 = synk.data(self.xval.astype("float64"))
        self.dv64 = synk.data(self.bval.astype("float64"))
        self.di = synk.data(self.xval.astype("int32"))
        self.di16 = synk.data(self.ival)
        self.dif = synk.data(self.ival.astype(F32))
        self.di64 = synk.data(self.ival.astype("int64"))
        self.dm = synk.data(self.mval, minibatch=True)
        self.dm_short = synk.data(self.mval[:6], minibatch=True)
        self.dx7 = synk.data(self.xval[:7])
        self.dnomem = synk.data(dtype=F32, ndim=2)
        self.dnomem1 = synk.data(dtype=F32, ndim=1)
        self.scratch = synk.data(np.zeros((4, 3), dtype=F32))
        # The oracle: every rank's value of every shared variable (rank 0 is the master).
        self.ref = Reference(self.n, 0, v.shareds, [var.get_value() for var in v.shareds])
        self.rng = rng

    def resync(self):
        """Give every rank known values again (after a failure that may have
        changed some ranks and not others)."""
        for var in self.v.shareds:
            value = np.arange(3 if var is self.v.st else 5, dtype=var.dtype)
            if var.ndim == 2:
                value = np.arange(30, dtype=var.dtype).reshape(10, 3)
            synk.broadcast(var, value)
            self.ref.broadcast([self.ref.k(var)], [value])


def _run(case, tally, failures):
    """Run one case; record its outcome."""
    expect = case.expect
    try:
        result = case.call()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # every outcome is recorded, none escapes
        if isinstance(exc, synk.StallError):
            outcome = "hang"
        elif isinstance(exc, synk.WorkerError) and exc.exc_type == "WorkerDied":
            outcome = "worker crash"
        elif not isinstance(expect, Raises):
            outcome = "raised on a sound call"
        elif not isinstance(exc, expect.types):
            outcome = "wrong exception type"
        elif not all(m in str(exc) for m in expect.mentions):
            outcome = "message lacks the argument or value"
        else:
            name = type(exc).__name__
            if isinstance(exc, synk.WorkerError):
                name += "(%s)" % exc.exc_type
            tally["malformed: " + name] += 1
            return True, exc
        failures.append((case, outcome, "%s: %s" % (type(exc).__name__, str(exc)[:400])))
        tally["FAILED: " + outcome] += 1
        return False, exc
    if isinstance(expect, Raises):
        failures.append((case, "malformed call accepted", repr(result)[:200]))
        tally["FAILED: malformed call accepted"] += 1
        return False, None
    try:
        expect.check(result)
    except AssertionError as exc:
        failures.append((case, "wrong result", str(exc)[:400]))
        tally["FAILED: wrong result"] += 1
        return False, None
    tally["sound: correct result"] += 1
    return True, None


def _report(tally, n_malformed, seconds):
    lines = ["fuzz: %d malformed calls, %d sound calls in %.1f s" % (
        n_malformed, tally["sound: correct result"], seconds)]
    for key in sorted(tally):
        lines.append("  %-45s %6d" % (key, tally[key]))
    print("\n".join(lines), file=sys.stderr)


def test_fuzz_public_api(request):
    n_target = request.config.getoption("--fuzz-n")
    rng = np.random.default_rng(request.config.getoption("--fuzz-seed"))
    tally, failures = collections.Counter(), []
    n_malformed = 0
    t0 = time.monotonic()
    faulthandler.dump_traceback_later(GUARD_S, exit=True)
    try:
        synk.close()
        # Before fork(): every call needs a session; malformed fork() arguments.
        for case in unforked_cases(rng, None, None, max(20, n_target // 20)):
            n_malformed += 1
            _run(case, tally, failures)
        assert runtime.current() is None, "a malformed fork() started a session"
        synk.fork(N_RANKS, use_gpu=False, timeout=HANG_S)
        v = build_functions()
        # Before distribute(): calls that need it; malformed function() arguments.
        n_functions = len(runtime.current().registry.functions)
        for case in forked_cases(rng, v, None, max(20, n_target // 20)):
            n_malformed += 1
            _run(case, tally, failures)
        registered = len(runtime.current().registry.functions)
        assert registered == n_functions, "a malformed function() was registered"
        synk.distribute()
        rt = runtime.current()
        left = Leftovers(rt)
        env = _Env(v, rng)
        env.resync()
        fuzzer = Fuzzer(rng, env)
        closing = max(20, n_target // 20)
        while n_malformed < n_target - closing:
            case = fuzzer.distributed_case()
            fuzzer.trail.append(case)
            n_malformed += isinstance(case.expect, Raises)
            ok, exc = _run(case, tally, failures)
            if runtime.current() is not rt:
                pytest.fail("the session closed during %r: %s" % (case, exc))
            if not ok and os.environ.get("FUZZ_DEBUG"):
                print("DEBUG", case, failures[-1][1:], file=sys.stderr)
                for var in v.shareds:
                    actual = [synk.get_value(r, var) for r in range(N_RANKS)]
                    print(var, "reference", env.ref.of(var), "actual", actual, file=sys.stderr)
                print(fuzzer.trail[-5:], file=sys.stderr)
            if not ok or isinstance(exc, synk.WorkerError):
                env.resync()
        # The session still gives right results after all of that.
        for _ in range(50):
            case = fuzzer.valid_fa()
            _run(case, tally, failures)
        for rank, (pid, start) in left.workers.items():
            assert proc_exists(pid, start), "worker rank %d is gone" % rank
        old_fa, old_dx = v.fa, env.dx
        synk.close()
        assert left.remaining() == []
        # After close(): the old session's objects and every call refuse politely.
        for case in unforked_cases(rng, v, old_dx, closing):
            n_malformed += 1
            _run(case, tally, failures)
        assert old_fa is v.fa
    finally:
        faulthandler.cancel_dump_traceback_later()
        synk.close()
    _report(tally, n_malformed, time.monotonic() - t0)
    shown = "\n".join("%r -> %s\n    %s" % f for f in failures[:30])
    assert not failures, "%d of the fuzz cases failed:\n%s" % (len(failures), shown)
    assert n_malformed >= n_target
