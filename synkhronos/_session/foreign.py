"""Synkhronos functions in processes that have no part in their session: a
``Function`` pickled (into a spawned child, say) and unpickled elsewhere
becomes a ``ForeignFunction``, whose calls raise the rule that only the process
that called ``fork()`` may call its session's functions."""

import os

from .runtime import current

__all__ = ["ForeignFunction", "function_handle"]


def function_handle(token, index, what, owner):
    """A pickled ``Function`` unpickled: the live function if this process holds
    its session, else a ``ForeignFunction``."""
    rt = current()
    if rt is not None and rt.token == token:
        return rt.registry.function(index)
    return ForeignFunction(what, owner)


class ForeignFunction:
    """What a Synkhronos function becomes in another process (a pickled copy in a
    spawned child, say): calling it raises RuntimeError naming the rule that only
    the process that called ``fork()`` may call its session's functions."""

    def __init__(self, what, owner):
        self._what = what
        self._owner = owner

    def __repr__(self):
        return "<%s of the Synkhronos session of pid %d>" % (self._what, self._owner)

    def __call__(self, *args, **kwargs):
        if self._owner == os.getpid():  # pickled before its session closed
            raise RuntimeError("%s belongs to a closed Synkhronos session; build functions again after "
                               "fork()" % self._what)
        raise RuntimeError(
            "%s belongs to the Synkhronos session of pid %d; this process (pid %d) has no part in it: "
            "only the process that called synkhronos.fork() may call its functions and collectives. "
            "Call it there, or compile a plain PyTensor function for this process."
            % (self._what, self._owner, os.getpid()))

    as_theano = as_pytensor = __call__
