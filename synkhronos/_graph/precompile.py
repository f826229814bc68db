"""Compile each Numba function once per host, spread over the host's ranks.

PyTensor's Numba backend compiles a function on its first call, and every rank
calls it: N ranks compile the same graph N times at once, each as slowly as one
process alone would.  Numba keeps what it compiles in PyTensor's on-disk cache,
which the ranks of one host share.  So ``distribute()`` hands each rank of a
host a share of the functions to compile ahead of their first call (the largest
graphs first, each to the rank with the least work so far); every other rank
then loads that function from the cache in a fraction of a second.

A function is compiled for the argument types its first call will most likely
have (each input's dtype and rank, C-contiguous, the shared variables' values as
they are).  A call whose types differ compiles again on its own, as without this
step: never a wrong result, at worst the time this step meant to save.
"""

import logging

import numpy as np

__all__ = ["compile_counts", "compile_shares", "counts_by_variant", "graph_size", "is_numba", "precompile"]

logger = logging.getLogger(__name__)


def is_numba(fn):
    """Whether PyTensor function ``fn`` was linked by Numba."""
    return type(fn.maker.linker).__name__ == "NumbaLinker"


def _dispatcher(fn):
    """The Numba dispatcher of PyTensor function ``fn``, or None when another
    linker made it."""
    return getattr(fn.vm, "jit_fn", None) if is_numba(fn) else None


def _argument_types(fn):
    """The Numba type of the tuple of ``fn``'s graph inputs at a first call, or
    None if one of them cannot be foreseen (a non-tensor input with no value)."""
    import numba
    from pytensor.tensor.type import TensorType

    types = []
    for var, cell in zip(fn.maker.fgraph.inputs, fn.vm.inputs):
        value = cell[0]
        if value is None:
            if type(var.type) is not TensorType:  # (sparse, lists, ...: left to the first call)
                return None
            value = np.empty((0,) * var.type.ndim, dtype=var.type.dtype)
        types.append(numba.typeof(value))
    return numba.types.Tuple(tuple(types))


def precompile(fn):
    """Compile Numba function ``fn`` for its first call's argument types now
    (Numba writes it to the on-disk cache, or loads it from there).  Returns
    whether there was anything to compile: False for other linkers, unforeseeable
    arguments, or a function already compiled for those types."""
    disp = _dispatcher(fn)
    if disp is None:
        return False
    types = _argument_types(fn)
    if types is None or (types,) in disp.overloads:
        return False
    try:
        disp.compile((types,))
    except Exception:  # the first call compiles again and raises it, where the user called
        logger.debug("compiling %s ahead of its first call failed", fn.maker.fgraph, exc_info=True)
        return False
    return True


def compile_counts(fn):
    """How this process got the Numba code of PyTensor function ``fn``:
    ``(argument signatures it holds, loaded from the cache, compiled anew)``;
    None for other linkers."""
    disp = _dispatcher(fn)
    if disp is None:
        return None
    stats = disp.stats
    return len(disp.overloads), sum(stats.cache_hits.values()), sum(stats.cache_misses.values())


def counts_by_variant(cores):
    """``compile_counts`` of every compiled variant of function cores ``cores``,
    by ``(function index, variant key)``; Numba functions only."""
    counts = {}
    for i, core in enumerate(cores):
        if core is None:  # a function distribute() could not send
            continue
        for key, fn in core.compiled_variants().items():
            got = compile_counts(fn)
            if got is not None:
                counts[i, key] = got
    return counts


def graph_size(fn):
    """How many operations the graph of PyTensor function ``fn`` has: the
    measure of its compile time by which shares are balanced."""
    return len(fn.maker.fgraph.apply_nodes)


def compile_shares(sizes, hosts):
    """Which functions each rank compiles.

    Parameters
    ----------
    sizes : dict
        ``{function index: graph size}`` of the functions Numba compiles.
    hosts : list of list of int
        The ranks of each host (ranks of one host share its compile cache).

    Returns
    -------
    dict
        ``{rank: tuple of function indices}``: on every host each function goes
        to one of its ranks, largest first to the least loaded rank.
    """
    shares = {}
    order = sorted(sizes, key=lambda i: (-sizes[i], i))
    for ranks in hosts:
        load = {r: 0 for r in ranks}
        mine = {r: [] for r in ranks}
        for i in order:
            r = min(ranks, key=lambda k: (load[k], k))
            load[r] += sizes[i]
            mine[r].append(i)
        shares.update({r: tuple(sorted(v)) for r, v in mine.items()})
    return shares
