"""A call's results, reduced in the master: each rank's outputs combined under
their reduce modes (weighted by rows for ``avg``), or the outputs a device
already reduced into the master, brought to the host; in the graph's dtypes."""

import numpy as np

from .._common.reduce import reduce_values

__all__ = ["reduce_results", "take_reduced", "in_graph_dtypes"]


def in_graph_dtypes(results, dtypes):
    """``results`` in the dtypes the graph gives its outputs: JAX in 32-bit mode
    (GPU ranks with floatX float32) returns int64 outputs as int32."""
    out = []
    for r, dtype in zip(results, dtypes):
        if isinstance(r, list):  # reduce mode None: one result per rank
            out.append([v if v.dtype == dtype else v.astype(dtype) for v in r])
        else:
            out.append(r if r.dtype == dtype else np.asarray(r).astype(dtype))
    return out


def take_reduced(device, specs, mine, replies, weighted=True):
    """The outputs the device reduced into the master, on the host; ``avg``
    divided by the rows of every rank that had some (as ``reduce_results``
    weights), or, where the ranks sent their outputs unweighted (equal rows),
    by the number of those ranks."""
    weight, had_rows, results = mine
    ranks = [(weight, had_rows)] + list(replies.values())
    if not any(had for _, had in ranks):
        raise ValueError("the call selected no rows on any rank")
    total = sum(w if weighted else 1 for w, had in ranks if had)
    host = device.take_outputs(results)
    for h, (_, _, mode) in zip(host, specs):
        if mode == "avg":  # a float dtype (see device_reduction), in a fresh array
            np.true_divide(h, total, out=h, casting="unsafe")
    return host


def reduce_results(per_rank, subset, output_modes, what, pool=None):
    """Combine the ranks' outputs.

    Parameters
    ----------
    per_rank : dict
        rank -> (weight, outputs of ``subset`` or None when it had no rows).
    subset : tuple of int
    output_modes : list
        Every output's reduce mode.
    what : str
        The function, for messages.
    pool : _common.reduce.ChunkPool, optional
        Threads that reduce large outputs by chunks.
    """
    ranks = [r for r in sorted(per_rank) if per_rank[r][1] is not None]
    if not ranks:
        raise ValueError("the call selected no rows on any rank")
    weights = [per_rank[r][0] for r in ranks]
    results = []
    for j, i in enumerate(subset):
        values = [per_rank[r][1][j] for r in ranks]
        mode = output_modes[i]
        if mode is None:
            results.append([np.array(v) for v in values])
            continue
        shapes = [np.shape(v) for v in values]
        if len(set(shapes)) > 1:
            raise ValueError("output %d of %s has shapes %s on ranks %s: an output reduced with %r "
                             "needs one shape on every rank (reduce mode None returns each rank's "
                             "value)" % (i, what, shapes, ranks, mode))
        results.append(reduce_values(values, mode, weights, pool))
    return results
