"""Planning one call of a Synkhronos function, without processes: the arguments
checked, the rows each rank takes of every scattered input, each rank's
``batch_s``, and what each worker is sent.  ``Function.__call__`` sends the plan
(``_function``) and reduces the results (``_call.results``)."""

import numbers
from typing import NamedTuple

from .._common.brief import brief
from .._common.selections import (
    check_selection_fits,
    is_int,
    normalize_batch,
    normalize_batch_s,
    selection_length,
    split_bounds,
    sub_selection,
)
from .._wire.protocol import Call

__all__ = ["CallPlan", "plan_call", "order_inputs", "check_subset", "check_num_slices", "row_selection"]


class CallPlan(NamedTuple):
    """One call, planned (see ``plan_call``)."""

    scat: list  # the scattered inputs (Data), in the function's order
    bcast: list  # the broadcast inputs (Data)
    subset: tuple  # output indices to compute
    num_slices: int
    rank_rows: list  # rank -> each scattered input's rows there (a selection)
    share_sels: list  # rank -> batch_s there, or None
    weighted: bool  # whether avg weights ranks by their rows (they differ)

    def master_args(self, rank):
        """``run_share``'s arguments for the master (rank ``rank``)."""
        return ([(d._memory.array, s) for d, s in zip(self.scat, self.rank_rows[rank])],
                [d._memory.array for d in self.bcast], self.share_sels[rank], self.subset, self.num_slices)

    def messages(self, function, ranks):
        """The ``Call`` record for each worker rank of ``ranks``."""
        if not ranks:
            return {}
        bcast_refs = [d._ref() for d in self.bcast]
        scat_refs = [d._ref() for d in self.scat]
        return {r: Call(function, list(zip(scat_refs, self.rank_rows[r])), bcast_refs, self.share_sels[r],
                        self.subset, self.num_slices, self.weighted)
                for r in ranks}


def order_inputs(args, kwargs, n, names):
    """The ``n`` inputs in order, from positional ``args`` and ``kwargs`` by the
    input names ``names`` (name -> index)."""
    for key in kwargs:
        if key not in names:
            raise TypeError("unknown input name %r; inputs are named %s" % (key, sorted(names)))
    if len(args) + len(kwargs) != n:
        raise TypeError("function takes %d data inputs, got %d" % (n, len(args) + len(kwargs)))
    ordered = list(args) + [None] * len(kwargs)
    for key, value in kwargs.items():
        idx = names[key]
        if idx < len(args) or ordered[idx] is not None:
            raise TypeError("input %r given twice" % key)
        ordered[idx] = value
    return ordered


def check_subset(output_subset, n_outputs):
    """``output_subset`` as a tuple of output indices (all when None)."""
    if output_subset is None:
        return tuple(range(n_outputs))
    if not isinstance(output_subset, (list, tuple)) or not all(is_int(i) for i in output_subset):
        raise TypeError("output_subset must be a list of ints, got %r" % (output_subset,))
    for i in output_subset:
        if not 0 <= i < n_outputs:
            raise ValueError("output_subset entry %d out of range for %d outputs" % (i, n_outputs))
    return tuple(output_subset)


def check_num_slices(num_slices):
    if type(num_slices) is int and num_slices >= 1:  # the usual case, before the slower ABC checks
        return num_slices
    if isinstance(num_slices, bool) or not isinstance(num_slices, numbers.Real):
        raise TypeError("num_slices must be a positive int, got %r" % (num_slices,))
    if num_slices < 1 or int(num_slices) != num_slices:
        raise ValueError("num_slices must be a positive int, got %r" % (num_slices,))
    return int(num_slices)


def row_selection(scat, batch):
    """The selection over full-dataset inputs of ``scat`` (Data), and its length."""
    full = [d for d in scat if not d.minibatch]
    if batch is None:
        ref = full or scat
        lengths = {len(d) for d in ref}
        if len(lengths) > 1:
            raise ValueError("scattered inputs have different lengths %s; pass batch= or "
                             "give them equal lengths" % [len(d) for d in ref])
        n = lengths.pop()
        sel = slice(0, n)
    else:
        sel = normalize_batch(batch, len(full[0]) if full else None)
        for d in full:
            check_selection_fits(sel, len(d), "input %s" % (d,))
        n = selection_length(sel)
    if n == 0:  # no rank would have an output to reduce
        if batch is not None:
            raise ValueError("batch=%s selects no rows; a call needs at least one" % brief(batch))
        raise ValueError("the scattered inputs %s have no rows; a call needs at least one"
                         % ", ".join(repr(d) for d in scat))
    for d in scat:
        if d.minibatch and len(d) < n:
            raise ValueError("minibatch input %s has %d rows but the call selects %d" % (d, len(d), n))
    return sel, n


def _check_selectors(scat, sliceable, num_slices, batch, batch_s):
    if num_slices > 1 and not scat and not sliceable:
        raise ValueError("num_slices=%d but the function has nothing to slice (no scattered "
                         "inputs or sliceable shared variables)" % num_slices)
    if batch is not None and not scat:
        raise TypeError("batch=%r given but the function has no scattered inputs" % (batch,))
    if batch_s is not None and not sliceable:
        raise TypeError("batch_s=%r given but the function has no sliceable_shareds" % (batch_s,))


def plan_call(ordered, n_scatter, n_outputs, sliceable, n_parallel, output_subset=None, batch=None,
              batch_s=None, num_slices=1):
    """Check a call's arguments and split its rows among ``n_parallel`` ranks.

    Parameters
    ----------
    ordered : list of Data
        The inputs in order (``order_inputs``), scattered ones first.
    n_scatter, n_outputs : int
        How many inputs are scattered; how many outputs the function has.
    sliceable : list
        The function's sliceable shared variables.
    n_parallel : int
    output_subset, batch, batch_s, num_slices
        As given to ``Function.__call__``.

    Returns
    -------
    CallPlan
    """
    subset = check_subset(output_subset, n_outputs)
    num_slices = check_num_slices(num_slices)
    scat, bcast = ordered[:n_scatter], ordered[n_scatter:]
    if num_slices > 1 or batch is not None or batch_s is not None:
        _check_selectors(scat, sliceable, num_slices, batch, batch_s)
    share_sels = [None] * n_parallel if batch_s is None else normalize_batch_s(batch_s, n_parallel)
    if batch_s is not None and not scat and not any(selection_length(s) for s in share_sels):
        raise ValueError("batch_s=%s selects no rows on any rank; a call needs at least one"
                         % brief(batch_s))
    rank_rows = [[] for _ in range(n_parallel)]
    weighted = True  # whether avg must weight ranks by their rows (see _call.share.run_share_reduced)
    if scat:
        sel, n = row_selection(scat, batch)
        weighted = n % n_parallel != 0
        for rank, (p0, p1) in enumerate(split_bounds(n, n_parallel)):
            for d in scat:
                rank_rows[rank].append(slice(p0, p1) if d.minibatch else sub_selection(sel, p0, p1))
    return CallPlan(scat, bcast, subset, num_slices, rank_rows, share_sels, weighted)
