"""Injected faults, for tests: ``SYNKHRONOS_FAULT="rank:command:nth:action"``
(several joined by ``;``) makes worker ``rank`` act up on the ``nth`` (1-based)
command named ``command`` (``call``, ``set_shareds``, ``collective``, ... as in
``Command``), before carrying it out: ``hang`` sleeps forever, ``raise`` raises
RuntimeError, ``crash`` dies of a segmentation fault."""

import os
import signal
import time

from .._wire.protocol import Command

__all__ = ["Faults", "FAULT_ENV"]

FAULT_ENV = "SYNKHRONOS_FAULT"


class Faults:
    """Injected faults for this rank (see the module docstring)."""

    _ACTIONS = ("hang", "raise", "crash")

    def __init__(self, text, rank):
        self._plan = {}  # command -> (nth, action)
        self._seen = {}
        for item in filter(None, (text or "").split(";")):
            r, cmd, nth, act = item.split(":")
            if int(r) == rank:
                if act not in self._ACTIONS:
                    raise ValueError("%s: unknown action %r in %r" % (FAULT_ENV, act, item))
                self._plan[Command[cmd.upper()]] = (int(nth), act)

    def __bool__(self):
        return bool(self._plan)

    def before(self, cmd):
        if cmd not in self._plan:
            return
        self._seen[cmd] = n = self._seen.get(cmd, 0) + 1
        nth, act = self._plan[cmd]
        if n != nth:
            return
        if act == "hang":
            while True:
                time.sleep(3600)
        if act == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        raise RuntimeError("fault injected by %s into %s #%d" % (FAULT_ENV, cmd.name.lower(), n))
