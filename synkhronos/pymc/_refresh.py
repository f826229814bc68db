"""``pm.set_data`` on a copy's split data reaches the ranks (the pipeline's
last stage, after the copy is made).

The rows are scattered to the ranks once, but they stay ``pm.Data`` of the
copy, which ``pm.set_data`` (a ``set_value``) replaces: new data, another row
count, the data of a new fold or of a simulated data set.  Before each
evaluation in the session's process, ``RowsFollowData`` asks whether any of the
copy's ``pm.Data`` that rows came from holds another value than when the rows
were scattered (``set_value`` always stores a new array: an identity check,
about a microsecond each).  If one does, the terms are found again (``_terms``)
on the model with the copy's data, and:

- where they are the terms split (the same graph, its inputs of the same
  kinds), their rows replace the old ones on the ranks, as they were placed:
  scattered over every rank, on this process's rank alone, or both (see
  ``_placement``).  The ranks' graphs hold no row count, so the data may have
  another number of rows.  An index that ``_rowdata`` holds in fewer bits is
  held in the same bits as before where its new values fit them;
- where they are not (the data's columns changed, or what ``_rowdata`` could
  leave out of the rows no longer can be), every evaluation raises ValueError
  saying so, never the old rows' numbers: ``data_parallel`` on the model with
  those data splits it anew.

``data_parallel`` given a copy splits the model the copy was made from again,
with the copy's data (``source_of``), then frees the given copy's rows on the
ranks (``release``): its evaluations raise from then on.
"""

import numpy as np

from .. import _collectives as _coll
from .._graph.editing import leading as _leading
from .._graph.editing import replaced as _replaced
from .._session import runtime
from ._copy import in_order_of
from ._distribute import place_rows
from ._observed import SplitObserved
from ._op import RowsLogp
from ._terms import find_terms
from ._variables import row_count

__all__ = ["RowsFollowData", "release", "rows_follow_data", "rows_op_of", "source_of"]


def rows_follow_data(model, copy, terms, n_rows, graph, pointwise, served, on):
    """Attach to ``served`` (the ``Evaluator`` of ``graph``, the ranks' graph of
    ``terms`` of ``model`` over ``n_rows`` rows, whose ``pointwise`` terms the
    copy's Op keeps, placed as ``on`` says: ``distributed``'s) the
    ``RowsFollowData`` of ``copy``, ``data_parallel``'s copy of ``model``."""
    served.rows_follow = RowsFollowData(model, copy, terms, n_rows, graph, pointwise, served, on)


def rows_op_of(model):
    """``(op, inputs)``: the ``RowsLogp`` of ``model`` (a ``data_parallel``
    copy) and the copy's variables it takes, or None if ``model`` has none
    (its split observed variable's, or its potential's)."""
    from pytensor.graph.traversal import ancestors

    for rv in model.observed_RVs:
        if rv.owner is not None and isinstance(rv.owner.op, SplitObserved):
            return rv.owner.op.rows_op, rv.owner.inputs[1:-1]
    for v in ancestors(list(model.potentials)):
        if v.owner is not None and isinstance(v.owner.op, RowsLogp):
            return v.owner.op, v.owner.inputs
    return None


def release(model):
    """Free the rows that ``model``, a ``data_parallel`` copy, holds on the
    ranks of the live session (it was split again); its evaluations then
    raise, naming why."""
    follow = rows_op_of(model)[0].evaluator.rows_follow
    with runtime.locked() as rt:
        if rt is not None and rt is follow.served.rt:
            follow.release()


def source_of(model):
    """The model that ``model`` (a ``data_parallel`` copy) was made from,
    cloned, with the copy's data; None if ``model`` is not a copy."""
    found = rows_op_of(model)
    if found is None:
        return None
    evaluator = found[0].evaluator
    if evaluator is None or evaluator.rows_follow is None:
        raise ValueError("model is a data_parallel copy made in another process: pass the model it was made "
                         "from")
    return evaluator.rows_follow.source()


class RowsFollowData:
    """Keeps the rows that ``served`` reads equal to ``copy``'s data (see the
    module's docstring); called before each evaluation."""

    def __init__(self, model, copy, terms, n_rows, graph, pointwise, served, on):
        self.model = model
        self.names = [rv.name for rv in terms.observed]
        self.graph = graph
        self.pointwise = pointwise.logps
        self.served = served
        self.on = on
        self.watched = _row_data(copy, model, terms, n_rows)
        self.containers = [v.container for v in self.watched.values()]  # (what get_value reads)
        self.seen = self._values()
        self.refusal = None
        self.released = False

    def __call__(self):
        if self.released:
            raise RuntimeError("this copy's rows were released when data_parallel was called on it again: "
                               "use the copy that call returned")
        if self.refusal is None:
            for container, seen in zip(self.containers, self.seen):
                if container.value is not seen:
                    break
            else:
                return
        with runtime.locked():
            values = self._values()
            changed = [name for name, a, b in zip(self.watched, values, self.seen) if a is not b]
            if changed:
                self.refusal = None
                try:
                    self._scatter(self._new_rows(changed))
                except ValueError as exc:
                    self.refusal = exc
                self.seen = values
            if self.refusal is not None:
                raise ValueError(str(self.refusal)) from self.refusal

    def release(self):
        """Free the rows (see ``release``)."""
        self._scatter([np.empty((0,) + tuple(r.type.shape[1:]), dtype=r.dtype) for r in self.graph.rows])
        self.released = True

    def _values(self):
        return [c.value for c in self.containers]

    def source(self):
        """A clone of the model the copy was made from, with the copy's data."""
        from pymc.model.fgraph import clone_model

        twin = in_order_of(self.model, clone_model(self.model))
        for name, var in self.watched.items():
            twin[name].set_value(var.get_value(borrow=True), borrow=True)
        return twin

    def _new_rows(self, changed):
        """The rows of the terms found on ``model`` with the copy's data, held
        as the ranks hold them; ValueError where the terms differ."""
        twin = self.source()
        chosen = [twin[name] for name in self.names]
        n_rows = row_count(twin, chosen)
        graph, reasons = self.graph, []
        ours = graph.params + graph.data + graph.rows
        for merge in (True, False):  # rows merged or folded now that were not at the split: try without
            terms = find_terms(twin, chosen, n_rows, merge=merge)
            logps, row_vars, values = _held_as(graph.rows, terms)
            why = _difference(graph.rows, row_vars, values)
            theirs = terms.held + terms.data + row_vars
            if why is None and not _same_graphs(self.pointwise, logps, ours, theirs):
                why = "the terms' graph is another"
            if why is None:
                return values
            reasons.append(why)
        raise ValueError("pm.set_data changed %s of the copy, and the terms of %s can no longer be "
                         "computed on the rows as split over the ranks (%s): call "
                         "synkhronos.pymc.data_parallel on the model with these data"
                         % (", ".join(map(repr, changed)), ", ".join(map(repr, self.names)), reasons[0]))

    def _scatter(self, values):
        served, rows = self.served, self.graph.rows
        place_rows(rows, values, self.on)
        if served.alone_rows and served.alone_rows is not rows:  # this rank's own copy of every row
            _coll.set_value(runtime.require().master_rank, served.alone_rows,
                            values if served.alone_up_to else [v[:0] for v in values])


def _row_data(copy, model, terms, n_rows):
    """``{name: the copy's pm.Data}`` for each named shared variable of
    ``model`` with ``n_rows`` rows that the split terms read (their
    observed values, the data of their graphs): those the ranks hold."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.traversal import ancestors

    values = [model.rvs_to_values[rv] for rv in terms.observed if rv in model.rvs_to_values]
    graphs = list(terms.observed) + values
    return {v.name: copy[v.name] for v in ancestors(graphs)
            if isinstance(v, SharedVariable) and v.name in copy.named_vars and _leading(v) == n_rows}


def _held_as(shareds, terms):
    """``(logps, row_vars, values)`` of ``terms``, each row variable held in its
    shared variable's dtype among ``shareds`` where its values fit it (an index
    held in fewer bits by ``_rowdata``)."""
    logps, row_vars, values = list(terms.logps), list(terms.row_vars), list(terms.row_values)
    if len(row_vars) != len(shareds):
        return logps, row_vars, values
    replace = {}
    for k, (var, shared, value) in enumerate(zip(row_vars, shareds, values)):
        integers = value.dtype.kind in "iu" and np.dtype(shared.dtype).kind in "iu"
        if var.dtype == shared.dtype or not integers:
            continue
        widened = value.astype(shared.dtype)
        if not np.array_equal(widened, value):
            continue
        replace[var] = row_vars[k] = var.type.clone(dtype=shared.dtype)(name=var.name)
        values[k] = widened
    return (_replaced(logps, replace) if replace else logps), row_vars, values


def _difference(shareds, row_vars, values):
    """What keeps ``values`` (of ``row_vars``) out of ``shareds``, the ranks'
    rows, or None."""
    if len(shareds) != len(row_vars):
        return "%d arrays of rows, where %d were split" % (len(row_vars), len(shareds))
    for shared, var, value in zip(shareds, row_vars, values):
        if value.ndim != shared.type.ndim or any(s is not None and s != n for s, n in
                                                   zip(shared.type.shape[1:], value.shape[1:])):
            return "%s: rows of shape %s, split as %s" % (var.name, value.shape[1:], shared.type.shape[1:])
        if value.dtype != shared.dtype:
            return "%s: values held in %s, split in %s" % (var.name, value.dtype, shared.dtype)
    return None


def _same_graphs(xs, ys, in_xs, in_ys):
    from pytensor.graph.basic import equal_computations

    return len(in_xs) == len(in_ys) and equal_computations(list(xs), list(ys), in_xs=in_xs, in_ys=in_ys)
