"""Running a rank's share of a call (the same code on every rank): its rows of
the scattered inputs, sliced if asked, outputs accumulated over slices, and on
devices that reduce outputs themselves, the reduction into the master."""

import numpy as np

from .._common.reduce import Accumulator
from .._common.selections import (
    check_selection_fits,
    selection_length,
    split_bounds,
    sub_selection,
)

__all__ = ["device_reduction", "run_share", "run_share_reduced", "share_rows"]


def device_reduction(core, device, subset, num_slices):
    """How ``device`` reduces a call's outputs itself: ``(shape, dtype, mode)``
    per output of ``subset``, or None when they go to the master through the
    host.  Decided from the graph and the call alone, so that every rank
    decides alike: each output needs a reduce mode, a static shape (the ranks
    must agree on sizes before they run), a dtype the device reduces (a float
    one for ``avg``); and the call must not be sliced (slices accumulate on
    the host)."""
    if not device.reduces_outputs or num_slices > 1 or not subset:
        return None
    return core.reduction_specs(subset, device.reduce_dtypes)

def run_share_reduced(core, device, specs, root, weighted, *args):
    """``run_share(device, *args)``, then queue the reduction of its outputs
    into rank ``root`` on the device (``specs`` from ``device_reduction``).

    ``weighted``: each rank sends ``avg`` outputs times its rows, for the
    master to divide by the total.  When every rank has the same number of
    rows the master says so (False) and the outputs go as they are, to be
    divided by the number of ranks: the same mean, without a kernel per
    output on every rank (see the docs page "Benchmarks", *Design decisions*).

    A rank whose share failed still takes part, with identity values, so that
    no rank waits forever; the error is raised after.

    Returns
    -------
    (weight, had_rows, results)
        ``results`` is the device's handle on the reduced outputs on root
        (``device.take_outputs`` copies them to the host), None elsewhere.
    """
    try:
        weight, outputs = run_share(core, device, *args)
    except Exception:
        device.reduce_outputs(None, specs, 0, root)
        raise
    results = device.reduce_outputs(outputs, specs, weight if weighted else 1, root)
    return weight, outputs is not None, results

def _fit(core, arrays):
    """Safely upcast inputs whose Data dtype differs from the variable's (as
    ``pytensor.function`` does for numpy inputs); each rank casts its rows."""
    return [a if a.dtype == dt else a.astype(dt) for a, dt in zip(arrays, core.in_dtypes)]

def _share_length(core, device, share_sel, need_equal):
    # Through the device: no copy, and in the master no wait for posted work.
    lengths = [device.shape(s)[0] for s in core.sliceable]
    if share_sel is None:
        if need_equal and len(set(lengths)) > 1:
            raise ValueError(
                "sliceable shared variables %s have different lengths %s; pass batch_s "
                "or give them equal lengths" % (core.sliceable, lengths)
            )
        return lengths[0]
    for s, n in zip(core.sliceable, lengths):
        check_selection_fits(share_sel, n, "sliceable shared variable %s" % s, "batch_s")
    return selection_length(share_sel)

def share_rows(core, device, scattered, share_sel, num_slices):
    """The rows of this rank's share and the slices it runs in: ``(weight,
    slices)``, the one rule for both (the variant a share runs is
    ``core.variant_key(subset, slices, share_sel)``).

    ``weight`` is the number of rows, or None when nothing is split (every rank
    runs the whole function, in one slice); ``slices`` is ``num_slices``, or the
    rows where there are fewer.
    """
    n_rows = None
    if scattered:
        n_rows = len(scattered[0][0]) if scattered[0][1] is None else selection_length(scattered[0][1])
    share_len = None
    if core.sliceable and (share_sel is not None or num_slices > 1 or n_rows is None):
        share_len = _share_length(core, device, share_sel, need_equal=num_slices > 1)
        if n_rows is not None and (share_sel is not None or num_slices > 1) and share_len != n_rows:
            raise ValueError(
                "scattered inputs give %d rows on this rank but the sliceable shared "
                "variables give %d; their lengths must match" % (n_rows, share_len)
            )
    weight = n_rows if n_rows is not None else share_len
    return weight, 1 if weight is None else min(num_slices, weight)


def run_share(core, device, scattered, bcast, share_sel, subset, num_slices):
    """Run this rank's share of a call.

    Parameters
    ----------
    device : device layer
        Sets the accumulated updates of a sliced call.
    scattered : list of (array, selection or None)
        Each scattered input with the rows this rank uses.
    bcast : list of array
        Broadcast inputs, used whole.
    share_sel : selection or None
        ``batch_s`` for this rank.
    subset : tuple of int
        Output indices to compute.
    num_slices : int
        Slices to compute over, accumulating outputs and updates.

    Returns
    -------
    (weight, outputs)
        ``weight`` is the number of rows used (1 when there is nothing to
        split); ``outputs`` is a list, or None when the rank had no rows.
    """
    weight, slices = share_rows(core, device, scattered, share_sel, num_slices)
    if weight == 0:
        return 0, None
    key = core.variant_key(subset, slices, share_sel)
    if weight is None:  # nothing to split: every rank runs the whole function
        return 1, _run_whole(core, device, key, _fit(core, bcast))
    if slices == 1:
        ins = [device.input_rows(k, a, sel) for k, (a, sel) in enumerate(scattered)] + list(bcast)
        return weight, _run_whole(core, device, key, _fit(core, ins) + core.share_args(share_sel, None)[1])
    return weight, _run_sliced(core, device, key, scattered, bcast, share_sel, weight, slices)


def _run_whole(core, device, key, ins):
    outputs = core.variant(*key)(*ins)
    if core.updates:
        device.after_updates(core)
    return outputs


def _run_sliced(core, device, key, scattered, bcast, share_sel, length, slices):
    subset, accumulate, kind = key
    fn = core.variant(*key)
    out_accs = [Accumulator(core.output_modes[i]) for i in subset]
    upd_accs = [Accumulator(m) for m in core.update_modes] if accumulate else []
    for start, stop in split_bounds(length, slices):
        ins = []
        for k, (a, sel) in enumerate(scattered):
            part = slice(start, stop) if sel is None else sub_selection(sel, start, stop)
            ins.append(device.input_rows(k, a, part))
        ins = _fit(core, ins + list(bcast))
        if kind is not None:
            ins += core.share_args(share_sel, (start, stop))[1]
        results = device.to_host(fn(*ins))
        for acc, r in zip(out_accs + upd_accs, results):
            acc.add(r, stop - start)
    for (var, _), acc in zip(core.updates if accumulate else (), upd_accs):
        device.set_value(var, _combine_slices(acc))
    return [_combine_slices(acc) for acc in out_accs]


def _combine_slices(acc):
    """Result of an accumulator over slices; ``None`` mode joins the slices."""
    result = acc.result()
    if acc.op is not None:
        return result
    if result[0].ndim == 0:
        return np.stack(result)
    return np.concatenate(result)
