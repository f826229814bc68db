"""``_wire.shared_memory.collect_garbage``: a Ctrl-C that comes while the
collection runs a finalizer is raised once the collection is over, not printed
as ignored inside the finalizer and lost (``Data.free_memory()`` collects before
it unmaps, then waits for its workers: a lost Ctrl-C left it waiting)."""

import gc
import signal
import sys

import pytest

from synkhronos._wire.shared_memory import collect_garbage


class _InterruptedWhenCollected:
    """A reference cycle whose finalizer is where a Ctrl-C lands."""

    def __init__(self):
        self.me = self

    def __del__(self):
        signal.raise_signal(signal.SIGINT)


def test_a_ctrl_c_during_the_collection_is_raised_after_it():
    gc.collect()
    _InterruptedWhenCollected()
    with pytest.raises(KeyboardInterrupt):
        collect_garbage()


def test_a_plain_collection_loses_it(monkeypatch):
    """The premise: where nothing defers it, the same Ctrl-C is printed as
    ignored, and nothing is raised."""
    lost = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: lost.append(info.exc_type))
    gc.collect()
    _InterruptedWhenCollected()
    gc.collect()
    assert lost == [KeyboardInterrupt]
