"""Which linker CPU ranks run the terms with (the pipeline's tenth stage): JAX,
their default, or PyTensor's own (C under PyTensor 2, Numba under 3) where the
ranks measure it clearly faster.

JAX is the faster on most likelihoods measured (GLMs), and it evaluates several
chains' points in one pass; but not on every one: rows of special functions
(pymc-marketing's BetaGeo) or cheap rows with a coefficient per group (bambi's
normal GLMM) ran 1.3 to 3 times as long in JAX's CPU code.  Where the busiest
rank holds at least ``TRIAL_ROWS`` rows, ``linker_chosen`` also distributes the
graph of one point compiled with PyTensor's own linker, a second function over
the same rows (none move), and times both on the ranks as they run, at the
model's initial point jittered as ``pm.sample`` starts its chains (``_split``'s
``initial_inputs``): one point, and four where JAX batches them (PyTensor's own
evaluates them one by one, its graph in ``_cpu``'s form).  The ranks keep
PyTensor's own where its times summed are ``MARGIN`` times shorter; the other
function is left unused.  The log gives both times.  GPU ranks, a mode the
user set (in PyTensor's flags), ``batch=`` given, and
``$SYNKHRONOS_PYMC_LINKER=jax`` keep what they have.
"""

import dataclasses
import logging
import os

from .._session import runtime
from ._cpu import for_own_linker
from ._distribute import distributed
from ._evaluator import evaluator_of
from ._evaluator import timed as _timed
from ._evaluator import times_text as _times
from ._packed import packed
from ._vectorized import jax_compiles

__all__ = ["LINKER_ENV", "MARGIN", "OWN_LINKER", "TRIAL_ROWS", "check_linker", "linker_chosen"]

logger = logging.getLogger("synkhronos")

OWN_LINKER = "Mode"  # PyTensor's default mode, with its own default linker
TRIAL_ROWS = 50_000  # the fewest rows on the busiest rank for which both linkers are timed
MARGIN = 1.25  # how much faster PyTensor's own linker must measure to be taken over JAX
LINKER_ENV = "SYNKHRONOS_PYMC_LINKER"  # "jax": JAX untimed; "timed" (or unset): as timed


def check_linker():
    """``$SYNKHRONOS_PYMC_LINKER`` read: "jax" or "timed" (its default)."""
    text = os.environ.get(LINKER_ENV, "").strip().lower() or "timed"
    if text not in ("jax", "timed"):
        raise ValueError("%s must be 'jax' (CPU ranks run PyMC copies with JAX, untimed) or 'timed' (the "
                         "faster of JAX and PyTensor's own linker), got %r"
                         % (LINKER_ENV, os.environ[LINKER_ENV]))
    return text


def linker_chosen(fn, graph, trial_point, batch, busiest):
    """``(fn, graph)``: ``fn``, the distributed function of ``graph`` (a
    ``RanksGraph`` compiled with the ranks' default linker, ``busiest`` rows on
    the rank holding most), or a function of the same rows compiled with
    PyTensor's own linker and its graph, as the module's docstring says;
    ``trial_point()``: the model's initial point, jittered (``initial_inputs``;
    made only where the linkers are timed: PyMC compiles a function for it)."""
    if not _to_time(graph, batch, busiest):
        return fn, graph
    point = trial_point()
    shapes = [x.shape for x in point[:len(graph.params)]]
    own_graph = packed(for_own_linker(dataclasses.replace(graph.one_point(), mode=OWN_LINKER)), shapes)
    try:
        own = distributed(own_graph, None)  # (the rows are where ``fn``'s placed them)
        sizes = (1, 4) if graph.batched else (1,)
        t_jax = _timed(evaluator_of(fn, graph), point, sizes)
        t_own = _timed(evaluator_of(own, own_graph), point, sizes)
    except Exception as exc:  # (the one-point graph may not pickle; at that point it may raise)
        logger.warning("synkhronos.pymc: %s: linkers not timed (%s: %s); the ranks run JAX", graph.names,
                       type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return fn, graph
    faster = sum(t_own.values()) * MARGIN < sum(t_jax.values())
    logger.info("synkhronos.pymc: %s: the CPU ranks run %s (PyTensor's own linker: %s; JAX%s: %s)",
                graph.names, "PyTensor's own linker, one point a call" if faster else "JAX", _times(t_own),
                ", several points a call" if graph.batched else "", _times(t_jax))
    return (own, own_graph) if faster else (fn, graph)


def _to_time(graph, batch, busiest):
    """Whether both linkers are timed: CPU ranks compiling with JAX by default,
    ``batch`` not given, enough rows, not ``$SYNKHRONOS_PYMC_LINKER=jax``, and
    a graph JAX converts (one it does not, the ranks link with PyTensor's own
    already)."""
    device = runtime.require().device
    if device.name == "gpu" or not device.jax_default or batch is not None or busiest < TRIAL_ROWS:
        return False
    return check_linker() == "timed" and (graph.batched or jax_compiles(graph.single))
