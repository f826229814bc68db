"""Which linker CPU ranks compile the terms with (between the pipeline's fourth
and fifth stages).

CPU ranks compile with JAX by default, which is the faster on the likelihoods
measured (GLMs, and it evaluates several chains' points in one pass), but not
on every one: special functions (pymc-marketing's BetaGeo) or a cheap row with
group indexing (a normal GLMM) ran slower in JAX's CPU code than in PyTensor's
own.  Where each rank holds enough rows for it to matter, both linkers compile
the ranks' graph of one point in this process, on a sample of the rows, and the
ranks take PyTensor's own linker (one point at a time) only where it is clearly
the faster; the log says which and the times.  GPU ranks, a mode the user set,
and ``batch=`` given keep what they have.
"""

import dataclasses
import logging
import time

import numpy as np

from .._graph.linking import device_kwargs
from .._session import runtime

__all__ = ["OWN_LINKER", "linker_chosen"]

logger = logging.getLogger("synkhronos")

OWN_LINKER = "Mode"  # PyTensor's own default linker, as a function's mode
TRIAL_ROWS = 50_000  # rows per rank from which the trial is made
SAMPLE_ROWS = 50_000  # rows each trial function evaluates
FASTER = 1.25  # PyTensor's linker is taken where JAX takes this much longer
CALLS = 5  # timed calls of each (the median counts), after one that is not


def linker_chosen(graph, terms, start, n_ranks, batch):
    """``graph`` (a ``RanksGraph`` of one point, of ``terms``) with ``mode``
    set to ``OWN_LINKER`` where CPU ranks run it clearly faster so than with
    JAX, their default, at the parameters' values ``start()`` returns; as it
    is elsewhere."""
    device = runtime.require().device
    rows = len(terms.row_values[0]) if terms.row_values else 0
    if device.name == "gpu" or not device.jax_default or batch is not None or rows // n_ranks < TRIAL_ROWS:
        return graph
    try:
        values = start()
        jax_s, own_s = (_seconds(graph, terms, values, mode) for mode in (None, OWN_LINKER))
    except Exception as exc:  # JAX cannot compile it (the ranks fall back by themselves), or the other
        logger.debug("synkhronos.pymc: no linker trial for %s (%s: %s)", graph.names, type(exc).__name__, exc)
        return graph
    faster = jax_s > FASTER * own_s
    logger.info("synkhronos.pymc: %s: CPU ranks compile with %s (one point on %d rows: %.2f ms with "
                "PyTensor's own linker, %.2f ms with JAX)", graph.names,
                "PyTensor's own linker, one point at a time" if faster else "JAX", min(rows, SAMPLE_ROWS),
                1e3 * own_s, 1e3 * jax_s)
    return dataclasses.replace(graph, mode=OWN_LINKER) if faster else graph


def _seconds(graph, terms, start, mode):
    """Seconds one point of ``graph`` takes on ``SAMPLE_ROWS`` rows in this
    process, compiled as the ranks would compile it with ``mode`` (None: the
    device's default)."""
    import pytensor

    given = {} if mode is None else {"mode": mode}
    kwargs = device_kwargs(runtime.require().device, given)
    sample = [pytensor.shared(np.ascontiguousarray(v[:SAMPLE_ROWS]), shape=r.type.shape)
              for r, v in zip(graph.rows, terms.row_values)]
    fn = pytensor.function(graph.params + graph.data, graph.single, givens=list(zip(graph.rows, sample)),
                           on_unused_input="ignore", **kwargs)
    args = list(start) + [d.get_value() for d in terms.data]
    times = []
    for _ in range(CALLS + 1):
        t0 = time.perf_counter()
        [np.asarray(out) for out in fn(*args)]
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))
