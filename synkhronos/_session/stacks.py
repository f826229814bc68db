"""Python stacks of worker processes, for stall reports and crashes.

Each worker writes the stack of every thread to its own file in the session's
private temporary directory: when the master sends it ``DUMP_SIGNAL`` (a stall
report), and when it crashes on a fatal signal (SIGSEGV, SIGABRT, ...).  Python's
``faulthandler`` writes them from the signal handler itself, so a worker stuck
in C code (a BLAS call, a ``time.sleep`` in a user Op, a wait on the GPU) still
answers, without the GIL and without help from its main thread.
"""

import faulthandler
import os
import signal
import time

__all__ = ["DUMP_SIGNAL", "enable", "stack_path", "take", "crash_stack", "process_state"]

DUMP_SIGNAL = signal.SIGUSR1
_SETTLE_S = 0.1  # a dump is complete once its file stops growing for this long


def stack_path(tmpdir, rank):
    """Where worker ``rank`` writes its stacks."""
    return os.path.join(tmpdir, "stacks-rank%d.txt" % rank)


def enable(tmpdir, rank):
    """In a worker: write stacks to ``stack_path`` on ``DUMP_SIGNAL`` and on a
    crash.  Returns the open file, which must stay open."""
    fh = open(stack_path(tmpdir, rank), "w")  # noqa: SIM115 (faulthandler keeps the fd)
    faulthandler.enable(file=fh, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=fh, all_threads=True)
    return fh


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path, offset):
    try:
        with open(path, errors="replace") as fh:
            fh.seek(offset)
            return fh.read()
    except OSError:
        return ""


def _without_watchdog(text):
    """A dump without the stack of the worker's own watchdog thread, which only
    sleeps (``_session.worker._watch_master``)."""
    blocks = text.strip().split("\n\n")
    kept = [b for b in blocks if "in _watch_master" not in b]
    return "\n\n".join(kept) + "\n"


def process_state(pid):
    """The kernel's word for what process ``pid`` is doing ("S (sleeping)", ...)."""
    try:
        with open("/proc/%d/status" % pid) as fh:
            for line in fh:
                if line.startswith("State:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def take(pids, tmpdir, wait=3.0):
    """Ask each worker (``{rank: pid}``) for its stacks and collect them.

    Returns ``{rank: text}``; a worker that does not write within ``wait``
    seconds (a stopped process, say) gets a line saying so, with its state.
    """
    offsets = {r: _size(stack_path(tmpdir, r)) for r in pids}
    signalled = _signal_all(pids, offsets)
    done = _collect_dumps(tmpdir, offsets, wait)
    return {r: _stack_or_reason(done.get(r), pid, wait) for r, pid in signalled.items()}


def _signal_all(pids, offsets):
    """Send ``DUMP_SIGNAL`` to each worker; returns ``{rank: pid}``, with the
    ``OSError`` instead of the pid for a worker that could not be signalled
    (whose entry then leaves ``offsets``)."""
    signalled = {}
    for r, pid in pids.items():
        try:
            os.kill(pid, DUMP_SIGNAL)
            signalled[r] = pid
        except OSError as exc:
            offsets.pop(r)
            signalled[r] = exc
    return signalled


def _collect_dumps(tmpdir, offsets, wait):
    """What each rank of ``offsets`` (rank -> size of its stack file before the
    signal) wrote past its offset: ``{rank: text}``, once its file stopped
    growing, or whatever is there after ``wait`` seconds.  Empties ``offsets``
    of the ranks that settled."""
    deadline = time.monotonic() + wait
    last = {}  # rank -> (size, when it was first seen)
    done = {}
    while offsets and time.monotonic() < deadline:
        for r in list(offsets):
            size = _size(stack_path(tmpdir, r))
            if size > offsets[r]:
                seen = last.get(r)
                if seen is None or seen[0] != size:
                    last[r] = (size, time.monotonic())
                elif time.monotonic() - seen[1] >= _SETTLE_S:
                    done[r] = _read_from(stack_path(tmpdir, r), offsets.pop(r))
        time.sleep(0.01)
    for r in offsets:  # grew but did not settle in time: take what is there
        text = _read_from(stack_path(tmpdir, r), offsets[r])
        if text:
            done[r] = text
    return done


def _stack_or_reason(text, pid, wait):
    """A worker's stack ``text`` without the watchdog's, or, with no ``text``,
    why there is none (``pid``: its pid, or the ``OSError`` that signalling it raised)."""
    if text is not None:
        return _without_watchdog(text)
    if isinstance(pid, OSError):
        return "(no stack: the process could not be signalled: %s)" % pid
    return ("(no stack: the process did not answer %s within %g s; its state: %s)"
            % (DUMP_SIGNAL.name, wait, process_state(pid)))


def crash_stack(tmpdir, rank):
    """What a worker that died wrote when it crashed ("Fatal Python error: ..."
    and its stacks), or an empty string."""
    if tmpdir is None:
        return ""
    return _read_from(stack_path(tmpdir, rank), 0).strip()
