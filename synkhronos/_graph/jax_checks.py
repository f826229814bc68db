"""Checks (``Assert``, ``CheckAndRaise``) that JAX keeps.

PyTensor's JAX backend drops every check whose condition is only known when the
function runs, with a warning ("as JAX tracing would remove it"): under
``jax.jit`` a condition is a traced value, and Python cannot raise on it.  CPU
and GPU ranks compile with JAX by default, so a user's or a library's check
vanished there, where PyTensor's C, Numba and Python linkers raise.

Synkhronos's JAX functions link with ``JAXLinker`` here, PyTensor's own with
one difference: while it converts a graph, each check becomes
``jax.experimental.checkify.check`` (``_data_check``), and a graph that holds
one is jitted under ``checkify``, which threads the checks' state through every
JAX construct (``lax.scan`` of a ``Scan``, ``vmap`` of a ``Blockwise``) and
returns it beside the outputs.  After the call, a failed check raises its own
exception type with its own message, as ``CheckAndRaise.perform`` does; the
outputs are then not stored, so the function applies none of its updates, as
with PyTensor's other linkers.  Where several checks fail, the first in the
graph's order raises.

A graph with no check after rewriting (most) links exactly as PyTensor's
linker links it: no wrapper, nothing read back per call.  A checked graph reads
one boolean back per call (on a GPU: one small transfer).

Checks whose conditions come from shapes alone stay ``_graph.jax_shapes``'s
``ConcreteCheck``: raised while JAX traces, at no cost per call.

Other PyTensor functions are unchanged: the conversion keeps its checks only
while this linker converts (``_CHECKS``); otherwise PyTensor's own conversion
(a warning, no check) applies.
"""

import contextlib
import contextvars
import re

import numpy as np
from pytensor.compile.mode import get_mode
from pytensor.link.jax.linker import JAXLinker as PyTensorJAXLinker
from pytensor.raise_op import CheckAndRaise

__all__ = ["JAXLinker", "checked_mode", "checks_kept"]

# The checks of the graph being converted (a list that each conversion fills), or
# None where no JAXLinker of ours converts.  A context variable: two threads may
# compile at once.
_CHECKS = contextvars.ContextVar("synkhronos_jax_checks", default=None)
# What checkify reports for check i: an index, never the user's message (checkify
# would format braces in it).
_TOKEN = "synkhronos check #%d"
_TOKEN_RE = re.compile(r"synkhronos check #(\d+)")


# Named as PyTensor's class: Synkhronos, its log lines and its users tell the
# linker of a function by its class name ("JAXLinker"), and this one is that
# linker with the checks kept.
class JAXLinker(PyTensorJAXLinker):
    """PyTensor's JAX linker, with the graph's checks kept (see module docstring).

    Attributes
    ----------
    checks : tuple of CheckAndRaise
        The checks of the linked graph, in the order checkify numbers them;
        empty: the graph is linked as PyTensor links it.
    """

    checks = ()

    def fgraph_convert(self, fgraph, *args, **kwargs):
        with checks_kept() as checks, _unused_generators_kept(fgraph):
            converted = super().fgraph_convert(fgraph, *args, **kwargs)
        self.checks = tuple(checks)  # an attribute of this linker: Modes share theirs by copy
        return converted

    def jit_compile(self, fn):
        checks = self.checks
        if not checks:
            return super().jit_compile(fn)
        jit_fn = super().jit_compile(_checkified(fn, frozenset(self.scalar_shape_inputs)))

        def checked(*args):
            error, outputs = jit_fn(*args)
            _raise_failed(error, checks)
            return outputs

        checked.checks = checks
        return checked


@contextlib.contextmanager
def _unused_generators_kept(fgraph):
    """While PyTensor's linker converts ``fgraph``: a random generator input that
    the rewrites left unused stays an input when the linker swaps each generator
    for a copy.  PyTensor's swap (``replace_all``) adds the copy only where the
    generator has a client, then fails to move the copy it did not add
    ("list.remove(x): x not in list", PyTensor 2.38 to 3.3): PyMC's mixtures
    leave such a generator in a likelihood's graph."""
    replace_all = fgraph.replace_all

    def replacing(pairs, **kwargs):
        pairs = list(pairs)
        replace_all(pairs, **kwargs)
        for old, new in pairs:
            if old in fgraph.inputs and new not in fgraph.inputs:
                fgraph.add_input(new)

    fgraph.replace_all = replacing
    try:
        yield
    finally:
        del fgraph.replace_all


@contextlib.contextmanager
def checks_kept():
    """Convert checks to JAX as ``JAXLinker`` does while the block runs; yields
    the list of the checks converted.  Also for a graph converted only to learn
    whether JAX converts it, which should not warn that a check is skipped."""
    _claim_checks()
    checks = []
    token = _CHECKS.set(checks)
    try:
        yield checks
    finally:
        _CHECKS.reset(token)


def _checkified(fn, static):
    """``fn`` (a converted graph) returning ``(checkify error, outputs)``, to be
    traced by ``jax.jit``.  The inputs at ``static`` (shapes that PyTensor's
    linker passes as Python ints, static under ``jax.jit``) stay outside
    ``checkify``, which would trace them."""
    from jax.experimental import checkify

    def checkified(*args):
        traced = [i for i in range(len(args)) if i not in static]

        def inner(*values):
            full = list(args)
            for i, value in zip(traced, values):
                full[i] = value
            return fn(*full)

        return checkify.checkify(inner, errors=checkify.user_checks)(*[args[i] for i in traced])

    return checkified


def _raise_failed(error, checks):
    """Raise the exception of the first failed check of ``checks`` that checkify
    ``error`` reports, if one failed."""
    preds = getattr(error, "_pred", None)  # read first: one boolean per call (get_exception reads more)
    if preds is not None and not any(np.asarray(p).any() for p in preds.values()):
        return
    exc = error.get_exception()
    if exc is None:
        return
    # Under vmap (a Blockwise) checkify reports each mapped index: the lowest check raises.
    found = [int(i) for i in _TOKEN_RE.findall(str(exc))]
    if not found:
        raise RuntimeError("a check failed on this rank: %s" % exc)
    op = checks[min(found)]
    raise op.exc_type(op.msg)


def _data_check(op, checks):
    """The JAX function of check ``op``, numbered in ``checks``."""
    import jax.numpy as jnp
    from jax.experimental import checkify

    token = _TOKEN % len(checks)
    checks.append(op)

    def check(value, *conditions):
        ok = True
        for cond in conditions:  # CheckAndRaise.perform: every element of every condition
            ok = jnp.logical_and(ok, jnp.all(cond))
        checkify.check(ok, token)
        return value

    return check


def _ours(original):
    """The conversion of a check: ``_data_check`` while a ``JAXLinker`` of ours
    converts, ``original`` (what was registered for the check's class) otherwise."""

    def convert_check(op, node=None, **kwargs):
        checks = _CHECKS.get()
        if checks is None:
            return original(op, node=node, **kwargs)
        return _data_check(op, checks)

    convert_check.synkhronos_check = True
    return convert_check


def _claim_checks():
    """Make ``_ours`` the conversion of every class of check registered with
    PyTensor's JAX backend.  Called before each conversion: a library may register
    a form of its own for a subclass later (PyMC's ``pymc.sampling.jax`` passes
    ``Assert`` and its parameter checks through), which would win over the one
    registered for ``CheckAndRaise`` itself."""
    from pytensor.link.jax.dispatch import jax_funcify

    for cls, fn in list(jax_funcify.registry.items()):
        if isinstance(cls, type) and issubclass(cls, CheckAndRaise) and not hasattr(fn, "synkhronos_check"):
            jax_funcify.register(cls)(_ours(fn))


_claim_checks()


def checked_mode(mode):
    """``mode`` (a JAX mode) linked by ``JAXLinker``, which keeps its checks."""
    mode = get_mode(mode)
    if isinstance(mode.linker, JAXLinker):
        return mode
    return type(mode)(linker=JAXLinker(allow_gc=mode.linker.allow_gc), optimizer=mode.provided_optimizer)
